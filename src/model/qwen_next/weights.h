// The weights of a Qwen 3.8 Flash Next trunk. Every tensor of the schema is checked (shape,
// f32/bf16 dtype, int64 index buffers equal to the values the config implies) before anything is
// handed out. `load_qwen_next_weights` views large matrices in place in the memory-mapped
// checkpoint and widens small vectors (norms, conv kernels, decay rates) to f32 host vectors it
// owns; `upload_qwen_next_weights` then hands every weight to the backend once (on the GPU: a
// device copy, bf16 by default). The PLE n-gram table is the exception: it stays in the host
// mapping in its stored layout (one table or `split_ngram_parts` row shards, never
// concatenated), and only the rows a step touches are gathered.
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
  Weight conv1d;      // [conv_dim, K] f32
  Weight dt_bias;     // [Hv]
  Weight decay_rate;  // [Hv] = -exp(A_log), precomputed once (fp32 as Q4M 581)
  Weight norm;        // [dv]
};

struct QsaWeights {
  Weight q_proj, k_proj, v_proj, o_proj, index_qk_proj;
  Weight q_bias, k_bias, v_bias, o_bias;  // empty without attention_bias
  Weight q_norm, k_norm;                  // [D]
  Weight index_q_norm, index_k_norm;      // [dI]
};

struct PleWeights {
  std::vector<Weight> table_shards;  // row shards of the n-gram table, in order (host, mapped)
  NgramHashTable hash;
  Weight key_proj, value_proj;
  Weight norm_key, norm_query, norm_conv;  // [hc*H]
  Weight conv1d;                           // [hc*H, Kp] f32
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
  Weight hidden_norm;              // [hc*H], grouped (1+w)
  Weight embed_norm;               // [H], (1+w)
  Weight fc_hidden, fc_embedding;  // [H, H]
  QwenLayerWeights layer;
  HyperConnectionWeights mixer;
};

struct QwenNextWeights {
  // Owns the mappings every host Weight points into, and the widened f32 vectors.
  std::unique_ptr<Checkpoint> checkpoint;
  std::vector<std::unique_ptr<std::vector<float>>> host_vectors;
  Weight embed_tokens, lm_head;
  HyperConnectionWeights final_mixer;
  std::vector<QwenLayerWeights> layers;
  DType dtype = DType::kF32;          // of the largest weights (embed_tokens)
  std::optional<QwenMtpWeights> mtp;  // absent: the checkpoint runs autoregressively
};

Expected<QwenNextWeights> load_qwen_next_weights(const QwenNextConfig& c, const std::string& dir);

class Backend;
// Replaces every weight but the PLE table by the backend's own copy (`Backend::upload`), matrices
// as `matrix_dtype`. A tied lm_head stays one weight.
Status upload_qwen_next_weights(QwenNextWeights& w, Backend& be, DType matrix_dtype);

}  // namespace fs
