// Reading a family's weights out of an opened checkpoint: the schema check every loader runs
// first, and the views and widened vectors the weight structs hold.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "format/safetensors.h"
#include "model/family.h"

namespace fs {

// Every spec present with its shape (-1 matches any size) and dtype: f32/bf16 for weights, int64
// for index buffers. The first mismatch is an error naming the tensor.
Status check_specs(const std::vector<TensorSpec>& specs, const Checkpoint& ck);

// Looks tensors up by canonical name (check_specs has validated them). Small vectors are widened
// to f32 into `arena`, which the weights own.
class WeightReader {
 public:
  WeightReader(const Checkpoint& ck, std::vector<std::unique_ptr<std::vector<float>>>& arena)
      : ck_(ck), arena_(arena) {}
  // The tensor in place in the mapping.
  Weight weight(const std::string& name) const;
  std::vector<float> values(const std::string& name) const;
  // An f32 vector weight owned by the arena.
  Weight own(std::vector<float> values, Shape shape) const;
  // The tensor widened to f32 in the arena, as a vector [numel].
  Weight vec(const std::string& name) const;
  // The tensor widened to f32 in the arena, in its own shape (a small f32 matrix).
  Weight widened(const std::string& name) const;
  // A [C, 1, K] depthwise conv kernel as [C, K].
  Weight conv(const std::string& name) const;
  std::vector<std::int64_t> ints(const std::string& name) const;

 private:
  const Checkpoint& ck_;
  std::vector<std::unique_ptr<std::vector<float>>>& arena_;
};

}  // namespace fs
