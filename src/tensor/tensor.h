// An owning tensor: dtype, row-major shape, and a buffer in one `Memory` (host or device).
//
// Activations and caches are float32; index tensors (routing, block selection) are int32.
// Host code reads or writes a device tensor only through `to_host_vector` / `copy_from_host`;
// `span()` and `row()` exist for host tensors alone. Copying a tensor copies its bytes within
// its own memory (a device-to-device copy on the GPU). Weights are not tensors: they stay where
// they were loaded and are seen as `Weight`s.
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "tensor/memory.h"
#include "tensor/tensor_view.h"

namespace fs {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled float32 host tensor.
  explicit Tensor(Shape shape);
  Tensor(Shape shape, std::vector<float> data);
  // Zero-filled tensor in `memory`; check `ok()` (false when the memory is exhausted).
  Tensor(std::shared_ptr<Memory> memory, Shape shape, DType dtype = DType::kF32);
  ~Tensor();

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;

  DType dtype() const { return dtype_; }
  Device device() const { return memory_->device(); }
  const std::shared_ptr<Memory>& memory() const { return memory_; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(std::size_t i) const { return shape_.at(i); }
  std::size_t rank() const { return shape_.size(); }
  std::int64_t numel() const { return shape_.empty() ? 0 : shape_numel(shape_); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  // Rows = product of all but the last dim; cols = the last dim.
  std::int64_t rows() const {
    std::int64_t r = shape_.empty() ? 0 : 1;
    for (std::size_t i = 0; i + 1 < shape_.size(); ++i) r *= shape_[i];
    return r;
  }
  std::int64_t cols() const { return shape_.empty() ? 0 : shape_.back(); }
  // False after an allocation failed: the tensor then has its shape but no bytes.
  bool ok() const { return data_ != nullptr || bytes() == 0; }

  // The element pointer in the tensor's own memory (a device pointer on the GPU).
  void* raw() { return data_; }
  const void* raw() const { return data_; }
  float* data() {
    assert(dtype_ == DType::kF32);
    return static_cast<float*>(data_);
  }
  const float* data() const {
    assert(dtype_ == DType::kF32);
    return static_cast<const float*>(data_);
  }
  template <typename T>
  T* data_as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data_as() const {
    return static_cast<const T*>(data_);
  }

  // Host float32 tensors only.
  std::span<float> span() {
    assert(device() == Device::kHost);
    return {data(), static_cast<std::size_t>(numel())};
  }
  std::span<const float> span() const {
    assert(device() == Device::kHost);
    return {data(), static_cast<std::size_t>(numel())};
  }
  float* row(std::int64_t r) {
    assert(device() == Device::kHost);
    return data() + r * cols();
  }
  const float* row(std::int64_t r) const {
    assert(device() == Device::kHost);
    return data() + r * cols();
  }
  TensorView view() const;

  // Same elements, another shape of equal size.
  void reshape(Shape shape) {
    assert(shape_numel(shape) == numel() || (shape_.empty() && shape_numel(shape) == 0));
    shape_ = std::move(shape);
  }
  // Makes this a `dtype` tensor of `shape` in `memory`, contents unspecified. The buffer is kept
  // when it is in the same memory and large enough, so a warm workload allocates nothing.
  // False (the shape set, no bytes behind it) when the memory is exhausted.
  bool allocate(const std::shared_ptr<Memory>& memory, Shape shape, DType dtype = DType::kF32);
  // Resizes to `shape` in its own memory as float32, zero-filled.
  bool reset(Shape shape);
  // Grows the leading dimension to `rows`, keeping the contents; the new rows are unspecified
  // (the caller writes them: `append_rows`). Capacity grows geometrically so appending one row at
  // a time is amortised.
  bool grow_rows(std::int64_t rows);
  // Drops rows past `rows` (capacity kept).
  void shrink_rows(std::int64_t rows);
  // Makes room for `rows` rows without changing the shape or the contents, growing
  // geometrically as grow_rows does, so a later grow_rows up to `rows` keeps the buffer (a step
  // graph reserves its caches before recording: docs/GPU.md). False when the memory is exhausted.
  bool reserve_rows(std::int64_t rows);
  // Bytes held at raw(): at least bytes().
  std::size_t capacity_bytes() const { return capacity_; }

  // Explicit copies across the host boundary (float32 tensors).
  std::vector<float> to_host_vector() const;
  // Copies numel() values in from the host.
  void copy_from_host(std::span<const float> values);
  // A copy of this tensor in `memory`.
  Tensor to(const std::shared_ptr<Memory>& memory) const;

 private:
  void free_buffer();
  bool reserve(std::size_t bytes, bool keep_contents);

  std::shared_ptr<Memory> memory_ = host_memory();
  DType dtype_ = DType::kF32;
  Shape shape_;
  void* data_ = nullptr;
  std::size_t capacity_ = 0;  // bytes held at data_
};

}  // namespace fs
