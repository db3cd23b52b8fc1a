// A weight as the checkpoint stores it: float32 or bfloat16 elements, row-major, viewed in place
// (the checkpoint mapping outlives every Weight). Linear weights are torch's [out, in]; a 3-D
// expert tensor [E, out, in] is sliced per expert with `expert()`.
#pragma once

#include <cstdint>

#include "tensor/tensor_view.h"

namespace fs {

struct Weight {
  DType dtype = DType::kF32;
  Shape shape;
  const std::uint8_t* data = nullptr;

  bool empty() const { return data == nullptr; }
  std::int64_t rows() const { return shape.empty() ? 0 : shape_numel(shape) / shape.back(); }
  std::int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  // The 2-D [out, in] matrix of expert `e` of a 3-D [E, out, in] weight.
  Weight expert(std::int64_t e) const {
    const std::int64_t per = shape.at(1) * shape.at(2);
    return {dtype,
            {shape.at(1), shape.at(2)},
            data + static_cast<std::size_t>(e * per) * dtype_size(dtype)};
  }
  static Weight from_view(const TensorView& v) { return {v.dtype, v.shape, v.bytes.data()}; }
};

}  // namespace fs
