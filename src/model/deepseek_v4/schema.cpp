#include "model/deepseek_v4/schema.h"

#include "model/schema_builder.h"

namespace fs {

std::vector<LayerSchedule> deepseek_v4_schedule(const DeepseekV4Config& c) {
  std::vector<LayerSchedule> out;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto u = static_cast<std::size_t>(i);
    LayerSchedule s;
    switch (c.layer_types[u]) {
      case DsAttentionKind::kSliding:
        s.attention = "sliding_attention";
        break;
      case DsAttentionKind::kCompressedSparse:
        s.attention = "compressed_sparse_attention";
        break;
      case DsAttentionKind::kHeavilyCompressed:
        s.attention = "heavily_compressed_attention";
        break;
    }
    s.mlp = c.mlp_layer_types[u] == DsMlpKind::kHashMoe ? "hash_moe" : "moe";
    if (const auto rate = c.compress_rate(c.layer_types[u]); rate > 0) {
      s.features.push_back("compress_ratio:" + std::to_string(rate));
    }
    if (c.layer_types[u] == DsAttentionKind::kCompressedSparse) s.features.push_back("indexer");
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

// One decoder layer's tensors under prefix L (HF DeepseekV4DecoderLayer).
void add_layer(SchemaBuilder& b, const DeepseekV4Config& c, const std::string& L,
               DsAttentionKind kind, DsMlpKind mlp) {
  const auto H = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, D = c.head_dim;
  const auto Hq = c.num_attention_heads, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const auto hc_rows = hc * (2 + hc);  // pre (hc) + post (hc) + residual mix (hc x hc)
  for (const char* p : {"attn_hc.", "ffn_hc."}) {
    b.add(L + p, "fn", {hc_rows, hc * H});
    b.add(L + p, "base", {hc_rows});
    b.add(L + p, "scale", {3});
  }
  b.add(L, "input_layernorm.weight", {H});
  b.add(L, "post_attention_layernorm.weight", {H});
  const auto a = L + "self_attn.";
  b.add(a, "q_a_proj.weight", {c.q_lora_rank, H});
  b.add(a, "q_a_norm.weight", {c.q_lora_rank});
  b.add(a, "q_b_proj.weight", {Hq * D, c.q_lora_rank});
  b.add(a, "kv_proj.weight", {D, H});
  b.add(a, "kv_norm.weight", {D});
  b.add(a, "o_a_proj.weight", {c.o_groups * c.o_lora_rank, Hq * D / c.o_groups});
  b.add(a, "o_b_proj.weight", {H, c.o_groups * c.o_lora_rank});
  b.add(a, "sinks", {Hq});
  if (kind != DsAttentionKind::kSliding) {
    // CSA windows overlap by one ratio, so their compressor projects twice the width.
    const auto rate = c.compress_rate(kind);
    const auto width = kind == DsAttentionKind::kCompressedSparse ? 2 * D : D;
    const auto cp = a + "compressor.";
    b.add(cp, "kv_proj.weight", {width, H});
    b.add(cp, "gate_proj.weight", {width, H});
    b.add(cp, "position_bias", {rate, width});
    b.add(cp, "kv_norm.weight", {D});
    if (kind == DsAttentionKind::kCompressedSparse) {
      const auto ip = cp + "indexer.";
      const auto di = c.index_head_dim;
      b.add(ip, "kv_proj.weight", {2 * di, H});
      b.add(ip, "gate_proj.weight", {2 * di, H});
      b.add(ip, "position_bias", {rate, 2 * di});
      b.add(ip, "kv_norm.weight", {di});
      b.add(ip, "q_b_proj.weight", {c.index_n_heads * di, c.q_lora_rank});
      b.add(ip, "scorer.weights_proj.weight", {c.index_n_heads, H});
    }
  }
  const auto m = L + "mlp.";
  b.add(m, "gate.weight", {E, H});
  if (mlp == DsMlpKind::kHashMoe) {
    b.add_index(m, "gate.tid2eid", {V, c.num_experts_per_tok});
  } else {
    b.add(m, "gate.e_score_correction_bias", {E});
  }
  b.add(m, "experts.gate_up_proj", {E, 2 * I, H});
  b.add(m, "experts.down_proj", {E, H, I});
  const auto Is = I * c.n_shared_experts;
  b.add(m, "shared_experts.gate_proj.weight", {Is, H});
  b.add(m, "shared_experts.up_proj.weight", {Is, H});
  b.add(m, "shared_experts.down_proj.weight", {H, Is});
}

void add_hyper_head(SchemaBuilder& b, const DeepseekV4Config& c, const std::string& p) {
  const auto hc = c.hc_mult;
  b.add(p, "hc_head.hc_fn", {hc, hc * c.hidden_size});
  b.add(p, "hc_head.hc_base", {hc});
  b.add(p, "hc_head.hc_scale", {1});
}

}  // namespace

std::vector<TensorSpec> deepseek_v4_tensors(const DeepseekV4Config& c) {
  std::vector<TensorSpec> out;
  SchemaBuilder b(out);
  const auto H = c.hidden_size, V = c.vocab_size;
  b.add("", "embed_tokens.weight", {V, H});
  if (!c.tie_word_embeddings) b.add("", "lm_head.weight", {V, H});
  b.add("", "norm.weight", {H});
  add_hyper_head(b, c, "");
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto u = static_cast<std::size_t>(i);
    add_layer(b, c, layer_prefix(i), c.layer_types[u], c.mlp_layer_types[u]);
  }
  return out;
}

std::vector<TensorSpec> deepseek_v4_mtp_tensors(const DeepseekV4Config& c) {
  std::vector<TensorSpec> out;
  SchemaBuilder b(out);
  const auto H = c.hidden_size;
  const std::string p = kDeepseekV4MtpPrefix;
  b.add(p, "enorm.weight", {H});
  b.add(p, "hnorm.weight", {H});
  b.add(p, "e_proj.weight", {H, H});
  b.add(p, "h_proj.weight", {H, H});
  add_layer(b, c, p, DsAttentionKind::kSliding, DsMlpKind::kMoe);
  add_hyper_head(b, c, p);
  b.add(p, "norm.weight", {H});
  return out;
}

}  // namespace fs
