// What the families' weight loaders share: the schema check of a checkpoint, and a lookup of its
// tensors by canonical name that views matrices in place and widens small vectors to f32 host
// vectors the weights own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/weight.h"
#include "format/safetensors.h"
#include "model/family.h"

namespace fs {

// Which float dtypes a family's matrices may have: F32/BF16, or also F8_E4M3 beside their
// 128x128 block scales as the FP8 releases store them (the projections `convert --quantize fp8`
// writes, and lm_head; a family opts in once its forward's ops read FP8).
enum class FloatWeights { kF32OrBf16, kWithFp8 };

// How a checkpoint names a family's canonical (HF) tensors and where it keeps block scales.
// HF-named folders (the Qwen/DeepSeek V3 FP8 releases, `convert --quantize fp8`): the canonical
// names, and `<name>_scale_inv` beside each F8_E4M3 matrix. DeepSeek V4's official release: its
// own names (model/deepseek_v4/official_names.h) and `<base>.scale` beside `<base>.weight`.
// Either holds F32 scales or F8_E8M0 exponent bytes; the dtype says which.
struct TensorNaming {
  // Canonical name -> the checkpoint's; unset (or nullopt) keeps the canonical name.
  std::function<std::optional<std::string>(const std::string&)> rename;
  bool dot_scale = false;  // `<base>.scale` rather than `<name>_scale_inv`

  std::string stored(const std::string& canonical) const;
  // The scale tensor beside the stored F8_E4M3 matrix `stored_name`.
  std::string scale_of(const std::string& stored_name) const;
  // "layers.0.attn.wq_a.weight (HF layers.0.self_attn.q_a_proj.weight)" when renamed, for errors.
  std::string describe(const std::string& canonical) const;
};

// Every spec's tensor is present, with the spec's shape and an allowed dtype (int64 for index
// buffers); an F8_E4M3 one with scales of the right grid and dtype. The error names the first
// that is not, by the checkpoint's name.
Status check_specs(const std::vector<TensorSpec>& specs, const Checkpoint& ck,
                   FloatWeights floats = FloatWeights::kF32OrBf16, const TensorNaming& naming = {});

class GgufTensors;

// Looks tensors up by canonical name; the schema has already validated names, shapes and dtypes.
// Small vectors are widened to f32 into `arena`, which the weights own. The tensors are a
// safetensors checkpoint's, or a GGUF file's under their HF names (model/gguf_tensors.h).
class WeightSource {
 public:
  WeightSource(const Checkpoint& ck, std::vector<std::unique_ptr<std::vector<float>>>& arena,
               TensorNaming naming = {})
      : ck_(&ck), arena_(arena), naming_(std::move(naming)) {}
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
  const TensorNaming& naming() const { return naming_; }

 private:
  // Shape of a tensor as stored (HF's).
  Shape shape(const std::string& name) const;

  const Checkpoint* ck_ = nullptr;
  const GgufTensors* gguf_ = nullptr;
  std::vector<std::unique_ptr<std::vector<float>>>& arena_;
  TensorNaming naming_;
};

}  // namespace fs
