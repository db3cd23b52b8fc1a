#include "tensor/tensor.h"

#include <algorithm>

namespace fs {

Tensor::Tensor(Shape shape) : Tensor(host_memory(), std::move(shape)) {}

Tensor::Tensor(Shape shape, std::vector<float> data) : Tensor(host_memory(), std::move(shape)) {
  assert(static_cast<std::int64_t>(data.size()) == numel());
  copy_from_host(data);
}

Tensor::Tensor(std::shared_ptr<Memory> memory, Shape shape, DType dtype)
    : memory_(std::move(memory)), dtype_(dtype) {
  if (allocate(memory_, std::move(shape), dtype) && data_ != nullptr) memory_->zero(data_, bytes());
}

Tensor::~Tensor() {
  free_buffer();
}

Tensor::Tensor(const Tensor& other) : memory_(other.memory_), dtype_(other.dtype_) {
  if (allocate(other.memory_, other.shape_, other.dtype_) && bytes() != 0 && other.data_ != nullptr)
    memory_->copy(data_, other.data_, bytes());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  if (allocate(other.memory_, other.shape_, other.dtype_) && bytes() != 0 && other.data_ != nullptr)
    memory_->copy(data_, other.data_, bytes());
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : memory_(std::move(other.memory_)),
      dtype_(other.dtype_),
      shape_(std::move(other.shape_)),
      data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)) {
  other.memory_ = host_memory();
  other.shape_.clear();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  free_buffer();
  memory_ = std::move(other.memory_);
  dtype_ = other.dtype_;
  shape_ = std::move(other.shape_);
  data_ = std::exchange(other.data_, nullptr);
  capacity_ = std::exchange(other.capacity_, 0);
  other.memory_ = host_memory();
  other.shape_.clear();
  return *this;
}

void Tensor::free_buffer() {
  if (data_ != nullptr) memory_->release(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
}

bool Tensor::reserve(std::size_t want, bool keep_contents) {
  if (want <= capacity_) return true;
  void* fresh = memory_->allocate(want);
  if (fresh == nullptr) return false;
  if (keep_contents && data_ != nullptr) memory_->copy(fresh, data_, bytes());
  free_buffer();
  data_ = fresh;
  capacity_ = want;
  return true;
}

bool Tensor::allocate(const std::shared_ptr<Memory>& memory, Shape shape, DType dtype) {
  if (memory != memory_) {
    free_buffer();
    memory_ = memory;
  }
  dtype_ = dtype;
  const auto want =
      static_cast<std::size_t>(shape.empty() ? 0 : shape_numel(shape)) * dtype_size(dtype);
  shape_ = std::move(shape);
  if (reserve(want, false)) return true;
  // The shape stays, with no bytes behind it: ok() is false until a later allocation succeeds.
  free_buffer();
  return false;
}

bool Tensor::reset(Shape shape) {
  if (!allocate(memory_, std::move(shape), DType::kF32)) return false;
  if (bytes() != 0) memory_->zero(data_, bytes());
  return true;
}

bool Tensor::grow_rows(std::int64_t rows) {
  assert(!shape_.empty() && rows >= shape_[0]);
  if (!reserve_rows(rows)) return false;
  shape_[0] = rows;
  return true;
}

bool Tensor::reserve_rows(std::int64_t rows) {
  assert(!shape_.empty() && rows >= 0);
  if (data_ == nullptr && bytes() != 0) return false;
  Shape grown = shape_;
  grown[0] = std::max(rows, shape_[0]);
  const auto want = static_cast<std::size_t>(shape_numel(grown)) * dtype_size(dtype_);
  if (want <= capacity_) return true;
  // Double (at least 64 rows' worth) so a cache growing a row per step reallocates rarely.
  const auto per_row = want / static_cast<std::size_t>(std::max<std::int64_t>(grown[0], 1));
  const auto target = std::max({want, capacity_ * 2, per_row * 64});
  return reserve(target, true);
}

void Tensor::shrink_rows(std::int64_t rows) {
  assert(!shape_.empty() && rows <= shape_[0] && rows >= 0);
  shape_[0] = rows;
}

std::vector<float> Tensor::to_host_vector() const {
  assert(dtype_ == DType::kF32);
  std::vector<float> out(static_cast<std::size_t>(numel()));
  if (!out.empty() && data_ != nullptr) memory_->to_host(out.data(), data_, bytes());
  return out;
}

void Tensor::copy_from_host(std::span<const float> values) {
  assert(dtype_ == DType::kF32 && static_cast<std::int64_t>(values.size()) == numel());
  if (!values.empty() && data_ != nullptr) memory_->from_host(data_, values.data(), bytes());
}

Tensor Tensor::to(const std::shared_ptr<Memory>& memory) const {
  Tensor out;
  if (!out.allocate(memory, shape_, dtype_) || bytes() == 0 || data_ == nullptr) return out;
  if (memory == memory_) {
    memory_->copy(out.data_, data_, bytes());
  } else if (device() == Device::kHost) {
    memory->from_host(out.data_, data_, bytes());
  } else if (memory->device() == Device::kHost) {
    memory_->to_host(out.data_, data_, bytes());
  } else {
    std::vector<std::uint8_t> staging(bytes());
    memory_->to_host(staging.data(), data_, bytes());
    memory->from_host(out.data_, staging.data(), bytes());
  }
  return out;
}

TensorView Tensor::view() const {
  assert(device() == Device::kHost);
  return {dtype_, shape_, {static_cast<const std::uint8_t*>(data_), bytes()}};
}

}  // namespace fs
