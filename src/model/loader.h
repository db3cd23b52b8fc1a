// Opens a model folder (config.json + safetensors), or a GGUF file (its metadata as the config,
// model/gguf_config.h; today ds4's deepseek4 files), as a runnable Model on a backend.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"
#include "util/status.h"

namespace fs {

struct LoadOptions {
  // "cpu", "cuda", or "auto" (cuda when a GPU is present, else cpu).
  std::string backend = "auto";
  // The dtype of weight matrices on the backend: "f32", "bf16", or "auto" (bf16 on cuda, the
  // checkpoint's own dtype on cpu). Vectors (norms, biases) are f32 everywhere.
  std::string dtype = "auto";
  // MTP drafts over token ids [0, n) only (MtpHead::set_draft_vocabulary); 0: the whole
  // vocabulary. An error for a model without an MTP head or an n past the vocabulary.
  std::int64_t draft_vocab = 0;
  // "hf" (HF's plain arithmetic) or "official" (the official graph's FP8 KV and FP4 indexer
  // simulations, model/numerics.h); official is DeepSeek V4's only, an error for other families.
  std::string numerics = "hf";
};

// A family without a forward pass is `unsupported`.
Expected<std::unique_ptr<Model>> load_model(const std::string& dir,
                                            const LoadOptions& options = {});

}  // namespace fs
