#include "model/glm5/config.h"

#include <cmath>

namespace fs {

Expected<Glm5Config> parse_glm5_config(ConfigReader& r) {
  Glm5Config c;
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.moe_intermediate_size = r.integer("moe_intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_key_value_heads = r.integer_or("num_key_value_heads", c.num_attention_heads);
  c.n_routed_experts = r.integer("n_routed_experts");
  c.n_shared_experts = r.integer_or("n_shared_experts", 1);
  c.num_experts_per_tok = r.integer("num_experts_per_tok");
  c.n_group = r.integer_or("n_group", 1);
  c.topk_group = r.integer_or("topk_group", 1);
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", true);
  c.routed_scaling_factor = r.number_or("routed_scaling_factor", 2.5);
  c.kv_lora_rank = r.integer("kv_lora_rank");
  c.q_lora_rank = r.integer("q_lora_rank");
  c.qk_rope_head_dim = r.integer_or("qk_rope_head_dim", 0);
  c.qk_nope_head_dim = r.integer("qk_nope_head_dim");
  c.v_head_dim = r.integer("v_head_dim");
  c.attention_bias = r.boolean_or("attention_bias", false);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-5);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.swiglu_limit = r.number_or("swiglu_limit", 10.0);
  c.index_topk = r.integer("index_topk");
  c.index_head_dim = r.integer("index_head_dim");
  c.index_n_heads = r.integer("index_n_heads");
  // HF's default is 16 but a third-party loader assumes 4: require it to be explicit.
  c.index_kpool = r.integer("index_kpool");
  c.index_kpool_always_select_tail = r.boolean_or("index_kpool_always_select_tail", true);
  c.linear_head_dim = r.integer_or("linear_head_dim", 128);
  c.linear_num_heads = r.integer_or("linear_num_heads", 64);
  c.linear_conv_kernel_dim = r.integer_or("linear_conv_kernel_dim", 4);
  // null selects the softplus gate (C:191-199); NaN stands for it.
  if (const auto& root = r.root();
      root.contains("linear_lower_bound") && root["linear_lower_bound"].is_null()) {
    c.linear_lower_bound = std::nan("");
  } else {
    c.linear_lower_bound = r.number_or("linear_lower_bound", -5.0);
  }
  if (r.has("linear_attn_config")) {
    const auto& la = r.root()["linear_attn_config"];
    if (!la.is_object()) {
      r.fail("linear_attn_config", "must be an object");
    } else {
      c.linear_head_dim = la.value("head_dim", c.linear_head_dim);
      c.linear_num_heads = la.value("num_heads", c.linear_num_heads);
      c.linear_conv_kernel_dim = la.value("short_conv_kernel_size", c.linear_conv_kernel_dim);
      if (la.contains("gate_lower_bound") && la["gate_lower_bound"].is_number()) {
        c.linear_lower_bound = la["gate_lower_bound"].get<double>();
      } else if (la.contains("gate_lower_bound") && la["gate_lower_bound"].is_null() &&
                 !la.value("safe_gate", true)) {
        c.linear_lower_bound = std::nan("");
      }
    }
  }
  c.hc_mult = r.integer_or("hc_mult", 4);
  c.hc_sinkhorn_iters = r.integer_or("hc_sinkhorn_iters", 20);
  c.hc_eps = r.number_or("hc_eps", 1e-6);
  c.num_nextn_predict_layers = r.integer_or("num_nextn_predict_layers", 0);
  c.eos_token_ids = r.token_ids("eos_token_id");

  const auto L = c.num_hidden_layers;
  if (const auto types = r.strings_opt("layer_types")) {
    for (const auto& t : *types) {
      if (t == "linear_attention") {
        c.layer_types.push_back(GlmAttentionKind::kLinearAttention);
      } else if (t == "deepseek_sparse_attention" || t == "full_attention") {
        c.layer_types.push_back(GlmAttentionKind::kSparseAttention);
      } else {
        r.fail("layer_types", "has unknown layer type '" + t + "'");
      }
    }
  } else {
    for (std::int64_t i = 0; i < L; ++i) {
      c.layer_types.push_back(i % 4 != 3 ? GlmAttentionKind::kLinearAttention
                                         : GlmAttentionKind::kSparseAttention);
    }
  }
  if (const auto mlp = r.strings_opt("mlp_layer_types")) {
    for (const auto& t : *mlp) {
      if (t == "dense") {
        c.mlp_layer_types.push_back(GlmMlpKind::kDense);
      } else if (t == "sparse") {
        c.mlp_layer_types.push_back(GlmMlpKind::kSparse);
      } else {
        r.fail("mlp_layer_types", "has unknown MLP type '" + t + "'");
      }
    }
  } else {
    for (std::int64_t i = 0; i < L; ++i)
      c.mlp_layer_types.push_back(i < 3 ? GlmMlpKind::kDense : GlmMlpKind::kSparse);
  }
  if (const auto idx = r.strings_opt("indexer_types")) {
    for (const auto& t : *idx) {
      if (t == "full") {
        c.indexer_types.push_back(GlmIndexerKind::kFull);
      } else if (t == "shared") {
        c.indexer_types.push_back(GlmIndexerKind::kShared);
      } else {
        r.fail("indexer_types", "has unknown indexer type '" + t + "'");
      }
    }
  } else {
    c.indexer_types.assign(static_cast<std::size_t>(std::max<std::int64_t>(L, 0)),
                           GlmIndexerKind::kFull);
  }
  if (!r.status().ok()) return r.status();

  r.require_positive("vocab_size", c.vocab_size);
  r.require_positive("hidden_size", c.hidden_size);
  r.require_positive("num_hidden_layers", L);
  r.require_positive("num_attention_heads", c.num_attention_heads);
  r.require_positive("kv_lora_rank", c.kv_lora_rank);
  r.require_positive("q_lora_rank", c.q_lora_rank);
  r.require_positive("qk_nope_head_dim", c.qk_nope_head_dim);
  r.require_positive("v_head_dim", c.v_head_dim);
  r.require_positive("index_kpool", c.index_kpool);
  r.require_positive("linear_head_dim", c.linear_head_dim);
  r.require_positive("linear_num_heads", c.linear_num_heads);
  r.require_positive("hc_mult", c.hc_mult);
  if (c.num_attention_heads != c.num_key_value_heads) {
    r.fail("num_key_value_heads", "must equal num_attention_heads");
  }
  if (c.qk_rope_head_dim > 0)
    r.fail("qk_rope_head_dim", "must be 0 (GLM 5.3 Flash attention has no RoPE)");
  if (c.index_kpool > 0 && c.index_topk % c.index_kpool != 0)
    r.fail("index_topk", "must be a multiple of index_kpool");
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.n_routed_experts) {
    r.fail("num_experts_per_tok", "must be in [1, n_routed_experts]");
  }
  for (const auto& [name, size] :
       {std::pair<const char*, std::size_t>{"layer_types", c.layer_types.size()},
        {"mlp_layer_types", c.mlp_layer_types.size()},
        {"indexer_types", c.indexer_types.size()}}) {
    if (static_cast<std::int64_t>(size) != L) {
      r.fail(name, "has " + std::to_string(size) + " entries for " + std::to_string(L) + " layers");
    }
  }
  if (!r.status().ok()) return r.status();
  // A shared indexer reuses the top-k of the layer right before it, which must run a full one.
  for (std::int64_t i = 0; i < L; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (c.layer_types[u] == GlmAttentionKind::kSparseAttention &&
        c.indexer_types[u] == GlmIndexerKind::kShared) {
      if (i == 0 || c.layer_types[u - 1] != GlmAttentionKind::kSparseAttention ||
          c.indexer_types[u - 1] != GlmIndexerKind::kFull) {
        r.fail("indexer_types", "layer " + std::to_string(i) + " shares an indexer but layer " +
                                    std::to_string(i - 1) +
                                    " is not a full-indexer sparse attention layer");
      }
    }
  }
  if (!r.status().ok()) return r.status();
  return c;
}

}  // namespace fs
