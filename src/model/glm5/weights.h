// The weights of a GLM 5.3 Flash trunk (HF glm5_next text model, arch-glm.md section 4). Every
// tensor of the schema is checked (shape, f32/bf16 dtype) before anything is handed out; large
// matrices are viewed in place in the memory-mapped checkpoint, small vectors (norms, conv
// kernels, decay rates, the fp32 buffers) are widened to f32 host vectors the weights own.
// `upload_glm5_weights` then hands every weight to the backend once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "format/safetensors.h"
#include "model/common/mhc.h"
#include "model/common/moe.h"
#include "model/common/router.h"
#include "model/glm5/config.h"

namespace fs {

// Glm5NextTextLinearAttention (M:584-736): Kimi Delta Attention.
struct KdaWeights {
  Weight q_proj, k_proj, v_proj;  // [Q, H] each, Q = heads * head_dim
  // The depthwise conv1d.weight [3Q, 1, K] as three [Q, K] f32 filters (its q | k | v rows), so
  // each projection is convolved as it comes, without concatenating them.
  Weight conv_q, conv_k, conv_v;
  Weight f_a_proj, f_b_proj;  // forget gate low rank: [dk, H], [Q, dk]
  Weight dt_bias;             // [Q]
  // exp(A_log) of each channel's head, [Q]: the safe gate's A (lb * sigmoid(A*u)), or -A for the
  // softplus gate (-A * softplus(u)).
  Weight decay_rate;
  Weight b_proj;              // [heads, H]
  Weight g_a_proj, g_b_proj;  // output gate low rank: [dk, H], [Q, dk]
  Weight o_norm;              // [dv], shared by every head
  Weight o_proj;              // [H, Q]
};

// Glm5NextTextIndexer (M:739-1027): the k-pool DSA indexer of a full-indexer layer.
struct DsaIndexerWeights {
  Weight wq_b;                 // [nI*dI, q_lora]
  Weight wk;                   // [dI, H]
  Weight k_norm, k_norm_bias;  // LayerNorm(dI), eps 1e-6
  Weight weights_proj;         // [nI, H]
  Weight compress_ape;         // [kpool*dI] f32 (index_kpool_compress_ape, flattened)
  Weight compress_gate;        // [dI, H]
};

// Glm5NextTextAttention (M:1067-1259): MLA with low-rank q and kv, NoPE, over the indexer's pools.
struct DsaWeights {
  Weight q_a_proj, q_a_bias, q_a_layernorm, q_b_proj;
  Weight kv_a_proj_with_mqa, kv_a_bias, kv_a_layernorm, kv_b_proj;
  Weight o_proj, o_bias;                     // biases empty without attention_bias
  std::optional<DsaIndexerWeights> indexer;  // absent on shared-indexer layers
};

struct Glm5LayerWeights {
  GlmAttentionKind kind = GlmAttentionKind::kLinearAttention;
  GlmMlpKind mlp_kind = GlmMlpKind::kDense;
  MhcWeights attn_hc, ffn_hc;
  Weight input_layernorm, post_attention_layernorm;
  std::optional<KdaWeights> kda;
  std::optional<DsaWeights> dsa;
  SwigluMlpWeights mlp;   // dense layers
  ClampedMoeWeights moe;  // sparse layers
};

// The MTP layer (layers.<num_hidden_layers>, arch-glm.md 5): x = eh_proj([enorm(embed(t)) |
// hnorm(h)]), one plain pre-norm DSA + MoE block, logits = lm_head(shared_head.norm(x)).
struct Glm5MtpWeights {
  Weight enorm, hnorm;
  // eh_proj [D, 2D] as its two [D, D] column halves (f32, owned): the embedding's, the hidden's.
  Weight eh_embed, eh_hidden;
  Weight input_layernorm, post_attention_layernorm;
  DsaWeights attn;  // with its own full indexer
  ClampedMoeWeights moe;
  Weight shared_head_norm;
};

struct Glm5Weights {
  // Owns the mappings every host Weight points into, and the widened f32 vectors.
  std::unique_ptr<Checkpoint> checkpoint;
  std::vector<std::unique_ptr<std::vector<float>>> host_vectors;
  Weight embed_tokens, lm_head, norm;
  std::vector<Glm5LayerWeights> layers;
  DType dtype = DType::kF32;          // of the largest weights (embed_tokens)
  std::optional<Glm5MtpWeights> mtp;  // absent: the checkpoint runs autoregressively
};

Expected<Glm5Weights> load_glm5_weights(const Glm5Config& c, const std::string& dir);

class Backend;
// Replaces every weight by the backend's own copy (`Backend::upload`), matrices as
// `matrix_dtype`; conv filters and the hyper-connection mappings (fp32 in the reference, M:1361,
// 279) stay f32. A tied lm_head stays one weight.
Status upload_glm5_weights(Glm5Weights& w, Backend& be, DType matrix_dtype);

}  // namespace fs
