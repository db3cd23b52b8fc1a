#include "model/glm5/schema.h"

#include <string>

#include "model/schema_builder.h"

namespace fs {

std::vector<LayerSchedule> glm5_schedule(const Glm5Config& c) {
  std::vector<LayerSchedule> out;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto u = static_cast<std::size_t>(i);
    LayerSchedule s;
    const bool kda = c.layer_types[u] == GlmAttentionKind::kLinearAttention;
    s.attention = kda ? "linear_attention" : "deepseek_sparse_attention";
    s.mlp = c.mlp_layer_types[u] == GlmMlpKind::kDense ? "dense" : "moe";
    if (!kda)
      s.features.push_back(c.indexer_types[u] == GlmIndexerKind::kFull ? "indexer:full"
                                                                       : "indexer:shared");
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

// A DSA (MLA) attention under prefix `a` (".../self_attn."), with its k-pool indexer when `full`.
void add_dsa(SchemaBuilder& b, const Glm5Config& c, const std::string& a, bool full) {
  const auto H = c.hidden_size, Hq = c.num_attention_heads;
  b.add(a, "q_a_proj.weight", {c.q_lora_rank, H});
  b.add(a, "q_a_layernorm.weight", {c.q_lora_rank});
  b.add(a, "q_b_proj.weight", {Hq * c.qk_head_dim(), c.q_lora_rank});
  b.add(a, "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, H});
  b.add(a, "kv_a_layernorm.weight", {c.kv_lora_rank});
  b.add(a, "kv_b_proj.weight", {Hq * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
  b.add(a, "o_proj.weight", {H, Hq * c.v_head_dim});
  if (c.attention_bias) {
    b.add(a, "q_a_proj.bias", {c.q_lora_rank});
    b.add(a, "kv_a_proj_with_mqa.bias", {c.kv_lora_rank + c.qk_rope_head_dim});
    b.add(a, "o_proj.bias", {H});
  }
  if (full) {
    const auto ip = a + "indexer.";
    const auto dI = c.index_head_dim;
    b.add(ip, "wq_b.weight", {c.index_n_heads * dI, c.q_lora_rank});
    b.add(ip, "wk.weight", {dI, H});
    b.add(ip, "k_norm.weight", {dI});
    b.add(ip, "k_norm.bias", {dI});
    b.add(ip, "weights_proj.weight", {c.index_n_heads, H});
    b.add(ip, "index_kpool_compress_ape", {c.index_kpool, dI});
    b.add(ip, "index_kpool_compress_gate", {dI, H});
  }
}

// The sigmoid-routed MoE with its shared expert under prefix `m` (".../mlp.").
void add_moe(SchemaBuilder& b, const Glm5Config& c, const std::string& m) {
  const auto H = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const auto Is = I * c.n_shared_experts;
  b.add(m, "gate.weight", {E, H});
  b.add(m, "gate.e_score_correction_bias", {E});
  b.add(m, "experts.gate_up_proj", {E, 2 * I, H});
  b.add(m, "experts.down_proj", {E, H, I});
  b.add(m, "shared_experts.gate_proj.weight", {Is, H});
  b.add(m, "shared_experts.up_proj.weight", {Is, H});
  b.add(m, "shared_experts.down_proj.weight", {H, Is});
}

}  // namespace

std::vector<TensorSpec> glm5_tensors(const Glm5Config& c) {
  std::vector<TensorSpec> out;
  SchemaBuilder b(out);
  const auto H = c.hidden_size, V = c.vocab_size, hc = c.hc_mult;
  const auto hc_rows = hc * (2 + hc);
  b.add("", "embed_tokens.weight", {V, H});
  if (!c.tie_word_embeddings) b.add("", "lm_head.weight", {V, H});
  b.add("", "norm.weight", {H});
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const auto L = layer_prefix(i);
    for (const char* p : {"attn_hc.", "ffn_hc."}) {
      b.add(L + p, "fn", {hc_rows, hc * H});
      b.add(L + p, "base", {hc_rows});
      b.add(L + p, "scale", {3});
    }
    b.add(L, "input_layernorm.weight", {H});
    b.add(L, "post_attention_layernorm.weight", {H});
    const auto a = L + "self_attn.";
    if (c.layer_types[u] == GlmAttentionKind::kLinearAttention) {
      const auto dk = c.linear_head_dim, nh = c.linear_num_heads, Q = c.kda_dim();
      b.add(a, "q_proj.weight", {Q, H});
      b.add(a, "k_proj.weight", {Q, H});
      b.add(a, "v_proj.weight", {Q, H});
      b.add(a, "conv1d.weight", {3 * Q, 1, c.linear_conv_kernel_dim});
      b.add(a, "forget_gate.f_a_proj.weight", {dk, H});
      b.add(a, "forget_gate.f_b_proj.weight", {Q, dk});
      b.add(a, "forget_gate.dt_bias", {Q});
      b.add(a, "forget_gate.A_log", {nh});
      b.add(a, "b_proj.weight", {nh, H});
      b.add(a, "g_a_proj.weight", {dk, H});
      b.add(a, "g_b_proj.weight", {Q, dk});
      b.add(a, "o_norm.weight", {dk});
      b.add(a, "o_proj.weight", {H, Q});
    } else {
      add_dsa(b, c, a, c.indexer_types[u] == GlmIndexerKind::kFull);
    }
    const auto m = L + "mlp.";
    if (c.mlp_layer_types[u] == GlmMlpKind::kDense) {
      b.add(m, "gate_proj.weight", {c.intermediate_size, H});
      b.add(m, "up_proj.weight", {c.intermediate_size, H});
      b.add(m, "down_proj.weight", {H, c.intermediate_size});
    } else {
      add_moe(b, c, m);
    }
  }
  return out;
}

std::vector<TensorSpec> glm5_mtp_tensors(const Glm5Config& c) {
  std::vector<TensorSpec> out;
  SchemaBuilder b(out);
  const auto H = c.hidden_size;
  const auto L = layer_prefix(c.num_hidden_layers);
  b.add(L, "enorm.weight", {H});
  b.add(L, "hnorm.weight", {H});
  b.add(L, "eh_proj.weight", {H, 2 * H});
  b.add(L, "input_layernorm.weight", {H});
  b.add(L, "post_attention_layernorm.weight", {H});
  add_dsa(b, c, L + "self_attn.", /*full=*/true);
  add_moe(b, c, L + "mlp.");
  b.add(L, "shared_head.norm.weight", {H});
  return out;
}

}  // namespace fs
