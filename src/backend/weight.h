// A weight as a backend computes with it: float32 or bfloat16 elements, row-major, viewed (not
// owned). On the host it points into the memory-mapped checkpoint (or a small widened vector the
// loader owns); on a device, into the buffer the backend uploaded it to at load
// (`Backend::upload`), which lives as long as the backend. Linear weights are torch's [out, in];
// a 3-D expert tensor [E, out, in] is sliced per expert with `expert()`.
#pragma once

#include <cstdint>

#include "tensor/memory.h"
#include "tensor/tensor_view.h"

namespace fs {

struct Weight {
  DType dtype = DType::kF32;
  Shape shape;
  const std::uint8_t* data = nullptr;
  Device device = Device::kHost;

  bool empty() const { return data == nullptr; }
  std::int64_t numel() const { return shape.empty() ? 0 : shape_numel(shape); }
  std::int64_t rows() const { return shape.empty() ? 0 : numel() / shape.back(); }
  std::int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  // The 2-D [out, in] matrix of expert `e` of a 3-D [E, out, in] weight.
  Weight expert(std::int64_t e) const {
    const std::int64_t per = shape.at(1) * shape.at(2);
    return {dtype,
            {shape.at(1), shape.at(2)},
            data + static_cast<std::size_t>(e * per) * dtype_size(dtype),
            device};
  }
  // The first `n` rows of a matrix [out, in] (rows are contiguous): a smaller output range.
  Weight first_rows(std::int64_t n) const { return {dtype, {n, shape.back()}, data, device}; }
  // f32 host vectors (norms, biases) read through this.
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  static Weight from_view(const TensorView& v) { return {v.dtype, v.shape, v.bytes.data()}; }
};

}  // namespace fs
