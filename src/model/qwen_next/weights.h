// The weights of a Qwen 3.8 Flash Next trunk, viewed in place in the memory-mapped checkpoint.
// Every tensor of the schema is checked (shape, f32/bf16 dtype, int64 index buffers equal to the
// values the config implies) before anything is handed out. Large matrices stay as `Weight`s in
// the mapping; small vectors (norms, conv kernels, decay rates) are widened to f32 at load.
// The PLE n-gram table stays in its stored layout: one table or `split_ngram_parts` row shards,
// never concatenated; only the rows a token touches are read.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "format/safetensors.h"
#include "model/common/hyper_connection.h"
#include "model/common/moe.h"
#include "model/common/ngram_hash.h"
#include "model/qwen_next/config.h"
#include "tensor/tensor.h"

namespace fs {

struct GatedDeltaNetWeights {
  Weight in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  Tensor conv1d;                  // [conv_dim, K]
  std::vector<float> dt_bias;     // [Hv]
  std::vector<float> decay_rate;  // [Hv] = -exp(A_log), precomputed once (fp32 as Q4M 581)
  std::vector<float> norm;        // [dv]
};

struct QsaWeights {
  Weight q_proj, k_proj, v_proj, o_proj, index_qk_proj;
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // empty without attention_bias
  std::vector<float> q_norm, k_norm;                  // [D]
  std::vector<float> index_q_norm, index_k_norm;      // [dI]
};

struct PleWeights {
  std::vector<Weight> table_shards;  // row shards of the n-gram table, in order
  NgramHashTable hash;
  Weight key_proj, value_proj;
  std::vector<float> norm_key, norm_query, norm_conv;  // [hc*H]
  Tensor conv1d;                                       // [hc*H, Kp]
};

struct QwenLayerWeights {
  QwenLayerKind kind = QwenLayerKind::kLinearAttention;
  HyperConnectionWeights attn_hc, mlp_hc;
  std::optional<GatedDeltaNetWeights> gdn;
  std::optional<QsaWeights> qsa;
  std::optional<PleWeights> ple;
  MoeWeights moe;
};

// The MTP head (docs/MTP.md): input norms and projections, one QSA + MoE decoder layer with both
// hyper-connections, and its own final mixer; it shares the trunk's embedding and lm_head.
struct QwenMtpWeights {
  std::vector<float> hidden_norm;  // [hc*H], grouped (1+w)
  std::vector<float> embed_norm;   // [H], (1+w)
  Weight fc_hidden, fc_embedding;  // [H, H]
  QwenLayerWeights layer;
  HyperConnectionWeights mixer;
};

struct QwenNextWeights {
  // Owns the mappings every Weight points into.
  std::unique_ptr<Checkpoint> checkpoint;
  Weight embed_tokens, lm_head;
  HyperConnectionWeights final_mixer;
  std::vector<QwenLayerWeights> layers;
  DType dtype = DType::kF32;          // of the largest weights (embed_tokens)
  std::optional<QwenMtpWeights> mtp;  // absent: the checkpoint runs autoregressively
};

Expected<QwenNextWeights> load_qwen_next_weights(const QwenNextConfig& c, const std::string& dir);

}  // namespace fs
