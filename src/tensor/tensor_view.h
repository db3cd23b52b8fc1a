// A non-owning view of a tensor stored elsewhere (a mapped checkpoint, a host buffer): dtype,
// shape in row-major order (torch's [out, in] for linear weights), and the bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace fs {

using Shape = std::vector<std::int64_t>;

std::int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);  // "[256, 64]"

struct TensorView {
  DType dtype = DType::kF32;
  Shape shape;
  std::span<const std::uint8_t> bytes;

  std::int64_t numel() const { return shape_numel(shape); }
  std::int64_t dim(std::size_t i) const { return shape.at(i); }
  std::size_t rank() const { return shape.size(); }
};

}  // namespace fs
