// What a checkpoint is, before any weight is loaded: its family, its layer schedule, and the
// tensors (with shapes) its config requires. `flashserve inspect` prints this; loaders check
// against it.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "model/deepseek_v4/config.h"
#include "model/glm5/config.h"
#include "model/qwen_next/config.h"
#include "tensor/tensor_view.h"
#include "util/status.h"

namespace fs {

enum class Family { kQwenNext, kDeepseekV4, kGlm5 };

// The HF model_type of the family's text model family ("qwen4_exp", "deepseek_v4", "glm5_next").
std::string family_name(Family f);

struct LayerSchedule {
  std::string attention;              // e.g. "linear_attention", "qwen_sparse_attention"
  std::string mlp;                    // e.g. "moe", "hash_moe", "dense"
  std::vector<std::string> features;  // e.g. "ple", "indexer:shared", "compress_ratio:4"
};

// Shape entries of -1 match any size.
struct TensorSpec {
  std::string name;  // canonical name (see Checkpoint)
  Shape shape;
  bool integer = false;  // an index buffer (int64/int32), not a float weight
};

using FamilyConfig = std::variant<QwenNextConfig, DeepseekV4Config, Glm5Config>;

struct ModelDescription {
  Family family = Family::kQwenNext;
  std::string model_type;  // as written in config.json
  FamilyConfig config;
  std::vector<LayerSchedule> layers;
  std::vector<TensorSpec> tensors;
  // Canonical-name prefixes of MTP tensors: not required, not unexpected.
  std::vector<std::string> mtp_prefixes;
};

Expected<Family> family_from_model_type(const std::string& model_type);
// Reads DIR/config.json (or the file itself) into a description.
Expected<ModelDescription> describe_model(const std::string& model_dir);
Expected<ModelDescription> describe_model_config(const std::string& config_text,
                                                 const std::string& source);

bool is_mtp_tensor(const ModelDescription& d, const std::string& canonical_name);

}  // namespace fs
