// DeepSeek V4 Flash (HF model_type deepseek_v4): typed config (../shared/research/arch-dsv4.md 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/config_json.h"
#include "util/status.h"

namespace fs {

enum class DsAttentionKind { kSliding, kCompressedSparse, kHeavilyCompressed };
enum class DsMlpKind { kHashMoe, kMoe };

// One rope of the family (HF rope_parameters["main"] / ["compress"]): plain, or YaRN-scaled
// frequencies (HF _compute_yarn_parameters). V4 forces YaRN's attention factor to 1 (no mscale).
struct DsRope {
  bool yarn = false;
  double theta = 10000.0;
  double factor = 1.0;
  double original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
};

struct DeepseekV4Config {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 1;
  std::int64_t head_dim = 0;
  std::int64_t q_lora_rank = 0;
  std::int64_t o_groups = 0;
  std::int64_t o_lora_rank = 0;
  double partial_rotary_factor = 0;
  std::int64_t sliding_window = 0;
  std::int64_t csa_compress_rate = 4;
  std::int64_t hca_compress_rate = 128;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  DsRope main_rope;      // sliding layers
  DsRope compress_rope;  // CSA/HCA layers, their compressors and indexers

  std::int64_t index_n_heads = 0;
  std::int64_t index_head_dim = 0;
  std::int64_t index_topk = 0;

  std::int64_t n_routed_experts = 0;
  std::int64_t n_shared_experts = 1;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t moe_intermediate_size = 0;
  double routed_scaling_factor = 1.0;
  std::string scoring_func = "sqrtsoftplus";
  double swiglu_limit = 10.0;

  std::int64_t hc_mult = 4;
  std::int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::int64_t num_nextn_predict_layers = 0;
  std::vector<std::int64_t> eos_token_ids;

  std::vector<DsAttentionKind> layer_types;
  std::vector<DsMlpKind> mlp_layer_types;

  std::int64_t rope_head_dim() const {
    return static_cast<std::int64_t>(head_dim * partial_rotary_factor);
  }
  std::int64_t compress_rate(DsAttentionKind k) const {
    return k == DsAttentionKind::kCompressedSparse    ? csa_compress_rate
           : k == DsAttentionKind::kHeavilyCompressed ? hca_compress_rate
                                                      : 0;
  }
};

Expected<DeepseekV4Config> parse_deepseek_v4_config(ConfigReader& r);

}  // namespace fs
