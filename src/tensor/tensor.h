// An owning host tensor: dtype, row-major shape and an RAII buffer. Activations and caches are
// float32 on the CPU path; weights stay in the checkpoint's mapping and are seen as `Weight`s.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tensor/tensor_view.h"

namespace fs {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled float32 tensor.
  explicit Tensor(Shape shape)
      : shape_(std::move(shape)), data_(static_cast<std::size_t>(shape_numel(shape_)), 0.0f) {}
  Tensor(Shape shape, std::vector<float> data) : shape_(std::move(shape)), data_(std::move(data)) {}

  DType dtype() const { return DType::kF32; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(std::size_t i) const { return shape_.at(i); }
  std::size_t rank() const { return shape_.size(); }
  std::int64_t numel() const { return static_cast<std::int64_t>(data_.size()); }
  // Rows = product of all but the last dim; cols = the last dim.
  std::int64_t rows() const {
    std::int64_t r = shape_.empty() ? 0 : 1;
    for (std::size_t i = 0; i + 1 < shape_.size(); ++i) r *= shape_[i];
    return r;
  }
  std::int64_t cols() const { return shape_.empty() ? 0 : shape_.back(); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> span() { return data_; }
  std::span<const float> span() const { return data_; }
  float* row(std::int64_t r) { return data_.data() + r * cols(); }
  const float* row(std::int64_t r) const { return data_.data() + r * cols(); }

  // Same elements, another shape of equal size.
  void reshape(Shape shape) { shape_ = std::move(shape); }
  // Resizes to `shape`, zero-filled.
  void reset(Shape shape) {
    shape_ = std::move(shape);
    data_.assign(static_cast<std::size_t>(shape_numel(shape_)), 0.0f);
  }
  std::vector<float>& storage() { return data_; }
  const std::vector<float>& storage() const { return data_; }

  TensorView view() const {
    return {DType::kF32,
            shape_,
            {reinterpret_cast<const std::uint8_t*>(data_.data()), data_.size() * sizeof(float)}};
  }

 private:
  Shape shape_;
  std::vector<float> data_;
};

}  // namespace fs
