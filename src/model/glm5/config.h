// GLM 5.3 Flash (HF model_type glm5_next): typed config (../shared/research/arch-glm.md 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/config_json.h"
#include "util/status.h"

namespace fs {

enum class GlmAttentionKind { kLinearAttention /* KDA */, kSparseAttention /* DSA */ };
enum class GlmMlpKind { kDense, kSparse };
enum class GlmIndexerKind { kFull, kShared };

struct Glm5Config {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t moe_intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t n_routed_experts = 0;
  std::int64_t n_shared_experts = 1;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t n_group = 1;
  std::int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::int64_t kv_lora_rank = 0;
  std::int64_t q_lora_rank = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t v_head_dim = 0;
  bool attention_bias = false;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  double swiglu_limit = 10.0;

  std::int64_t index_topk = 0;
  std::int64_t index_head_dim = 0;
  std::int64_t index_n_heads = 0;
  std::int64_t index_kpool = 16;
  bool index_kpool_always_select_tail = true;

  std::int64_t linear_head_dim = 0;
  std::int64_t linear_num_heads = 0;
  std::int64_t linear_conv_kernel_dim = 4;
  double linear_lower_bound = -5.0;

  std::int64_t hc_mult = 4;
  std::int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  std::int64_t num_nextn_predict_layers = 0;
  std::vector<std::int64_t> eos_token_ids;

  std::vector<GlmAttentionKind> layer_types;
  std::vector<GlmMlpKind> mlp_layer_types;
  std::vector<GlmIndexerKind> indexer_types;

  std::int64_t qk_head_dim() const { return qk_rope_head_dim + qk_nope_head_dim; }
  std::int64_t kda_dim() const { return linear_num_heads * linear_head_dim; }
};

Expected<Glm5Config> parse_glm5_config(ConfigReader& r);

}  // namespace fs
