// What the families' weight loaders share: the schema check of a checkpoint, and a lookup of its
// tensors by canonical name that views matrices in place and widens small vectors to f32 host
// vectors the weights own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "format/safetensors.h"
#include "model/family.h"

namespace fs {

// Which float dtypes a family's matrices may have: F32/BF16, or also F8_E4M3 beside their F32
// `<name>_scale_inv` 128x128 blocks as the FP8 releases store them (the projections `convert
// --quantize fp8` writes, and lm_head; a family opts in once its forward's ops read FP8).
enum class FloatWeights { kF32OrBf16, kWithFp8 };
// Every spec's tensor is present, with the spec's shape and an allowed dtype (int64 for index
// buffers); an F8_E4M3 one with scales of the right grid. The error names the first that is not.
Status check_specs(const std::vector<TensorSpec>& specs, const Checkpoint& ck,
                   FloatWeights floats = FloatWeights::kF32OrBf16);

class GgufTensors;

// Looks tensors up by canonical name; the schema has already validated names, shapes and dtypes.
// Small vectors are widened to f32 into `arena`, which the weights own. The tensors are a
// safetensors checkpoint's, or a GGUF file's under their HF names (model/gguf_tensors.h).
class WeightSource {
 public:
  WeightSource(const Checkpoint& ck, std::vector<std::unique_ptr<std::vector<float>>>& arena)
      : ck_(&ck), arena_(arena) {}
  WeightSource(const GgufTensors& gguf, std::vector<std::unique_ptr<std::vector<float>>>& arena)
      : gguf_(&gguf), arena_(arena) {}
  bool contains(const std::string& name) const;
  // check_specs against whichever holds the tensors.
  Status check(const std::vector<TensorSpec>& specs,
               FloatWeights floats = FloatWeights::kF32OrBf16) const;
  // The tensor viewed in place (its stored dtype and shape); an F8_E4M3 matrix with its block
  // scales (check_specs validated them).
  Weight weight(const std::string& name) const;
  // Its values widened to f32.
  std::vector<float> values(const std::string& name) const;
  // An f32 vector weight owned by the arena.
  Weight own(std::vector<float> values, Shape shape) const;
  // The tensor as an f32 vector owned by the arena, flattened to one dimension.
  Weight vec(const std::string& name) const;
  // The tensor widened to f32 in the arena, in its own shape (a small f32 matrix, such as the
  // mHC mixes DeepSeek V4 keeps in fp32).
  Weight widened(const std::string& name) const;
  // A [C, 1, K] depthwise conv kernel as [C, K] f32.
  Weight conv(const std::string& name) const;
  std::vector<std::int64_t> ints(const std::string& name) const;

 private:
  // Shape of a tensor as stored (HF's).
  Shape shape(const std::string& name) const;

  const Checkpoint* ck_ = nullptr;
  const GgufTensors* gguf_ = nullptr;
  std::vector<std::unique_ptr<std::vector<float>>>& arena_;
};

}  // namespace fs
