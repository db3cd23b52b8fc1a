#include "model/qwen_next/schema.h"

#include "model/schema_builder.h"

namespace fs {

namespace {

void add_hyper_connection(SchemaBuilder& b, const QwenNextConfig& c, const std::string& p,
                          bool inject) {
  const auto W = c.stream_width(), r = c.hc_lowrank;
  b.add(p, "hc_norm.weight", {W});
  b.add(p, "input_mix_weight_down.weight", {r, W});
  b.add(p, "input_mix_weight_up.weight", {W, r});
  if (inject) b.add(p, "block_inject_weight.weight", {c.hc_count, W});
}

void add_moe(SchemaBuilder& b, const QwenNextConfig& c, const std::string& m) {
  const auto H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const auto Is = c.shared_expert_intermediate_size;
  b.add(m, "gate.weight", {E, H});
  b.add(m, "experts.gate_up_proj", {E, 2 * I, H});
  b.add(m, "experts.down_proj", {E, H, I});
  b.add(m, "shared_expert.gate_proj.weight", {Is, H});
  b.add(m, "shared_expert.up_proj.weight", {Is, H});
  b.add(m, "shared_expert.down_proj.weight", {H, Is});
  b.add(m, "shared_expert_gate.weight", {1, H});
}

void add_qsa(SchemaBuilder& b, const QwenNextConfig& c, const std::string& a) {
  const auto H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads,
             Hkv = c.num_key_value_heads;
  b.add(a, "q_proj.weight", {2 * Hq * D, H});  // query and output gate, interleaved per head
  b.add(a, "k_proj.weight", {Hkv * D, H});
  b.add(a, "v_proj.weight", {Hkv * D, H});
  b.add(a, "o_proj.weight", {H, Hq * D});
  if (c.attention_bias) {
    b.add(a, "q_proj.bias", {2 * Hq * D});
    b.add(a, "k_proj.bias", {Hkv * D});
    b.add(a, "v_proj.bias", {Hkv * D});
    b.add(a, "o_proj.bias", {H});
  }
  b.add(a, "q_norm.weight", {D});
  b.add(a, "k_norm.weight", {D});
  b.add(a, "indexer.index_qk_proj.weight", {(c.indexer_n_heads + 1) * c.indexer_head_dim, H});
  b.add(a, "indexer.q_layernorm.weight", {c.indexer_head_dim});
  b.add(a, "indexer.k_layernorm.weight", {c.indexer_head_dim});
}

}  // namespace

std::vector<LayerSchedule> qwen_next_schedule(const QwenNextConfig& c) {
  std::vector<LayerSchedule> out;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerSchedule s;
    const bool linear =
        c.layer_types[static_cast<std::size_t>(i)] == QwenLayerKind::kLinearAttention;
    s.attention = linear ? "linear_attention" : "qwen_sparse_attention";
    s.mlp = "moe";
    if (c.ple_layer_index(i) >= 0) s.features.push_back("ple");
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<TensorSpec> qwen_next_tensors(const QwenNextConfig& c) {
  std::vector<TensorSpec> out;
  SchemaBuilder b(out);
  const auto H = c.hidden_size, V = c.vocab_size, W = c.stream_width();
  b.add("", "embed_tokens.weight", {V, H});
  if (!c.tie_word_embeddings) b.add("", "lm_head.weight", {V, H});
  add_hyper_connection(b, c, "hyper_connection_mixer.", false);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto L = layer_prefix(i);
    add_hyper_connection(b, c, L + "attn_hyper_connection.", true);
    add_hyper_connection(b, c, L + "mlp_hyper_connection.", true);
    add_moe(b, c, L + "mlp.");

    if (c.layer_types[static_cast<std::size_t>(i)] == QwenLayerKind::kLinearAttention) {
      const auto a = L + "linear_attn.";
      const auto Hv = c.linear_num_value_heads;
      b.add(a, "in_proj_qkv.weight", {c.gdn_conv_dim(), H});
      b.add(a, "in_proj_z.weight", {c.gdn_value_dim(), H});
      b.add(a, "in_proj_b.weight", {Hv, H});
      b.add(a, "in_proj_a.weight", {Hv, H});
      b.add(a, "conv1d.weight", {c.gdn_conv_dim(), 1, c.linear_conv_kernel_dim});
      b.add(a, "dt_bias", {Hv});
      b.add(a, "A_log", {Hv});
      b.add(a, "norm.weight", {c.linear_value_head_dim});
      b.add(a, "out_proj.weight", {H, c.gdn_value_dim()});
    } else {
      add_qsa(b, c, L + "self_attn.");
    }

    const auto ple = c.ple_layer_index(i);
    if (ple >= 0) {
      const auto p = L + "ple.";
      const auto NH = c.ngram_heads(), Ep = c.ple_embed_dim;
      const auto rows = ple_table_rows(c, ple);
      if (c.split_ngram_parts <= 1) {
        b.add(p, "ple_embedding.ngram_embedding.weight", {rows, c.ple_head_dim()});
      } else {
        // The real layout: row shards, concatenated in numeric order (never loaded whole).
        for (std::int64_t s = 0; s < c.split_ngram_parts; ++s) {
          b.add(p, "ple_embedding.ngram_embedding.shard_" + std::to_string(s) + ".weight",
                {rows / c.split_ngram_parts, c.ple_head_dim()});
        }
      }
      b.add_index(p, "ple_embedding.layer_multipliers", {c.ngram_size});
      b.add_index(p, "ple_embedding.ngram_heads_vocab_sizes", {NH});
      b.add_index(p, "ple_embedding.ngram_heads_offsets", {NH});
      b.add(p, "key_proj.weight", {W, Ep});
      b.add(p, "value_proj.weight", {H, Ep});
      b.add(p, "norm_key.weight", {W});
      b.add(p, "norm_query.weight", {W});
      b.add(p, "norm_conv.weight", {W});
      b.add(p, "conv1d.weight", {W, 1, c.ple_conv_kernel_size});
    }
  }
  return out;
}

std::vector<TensorSpec> qwen_next_mtp_tensors(const QwenNextConfig& c) {
  std::vector<TensorSpec> out;
  SchemaBuilder b(out);
  const auto H = c.hidden_size;
  b.add("mtp.", "hidden_norm.weight", {c.stream_width()});
  b.add("mtp.", "embed_norm.weight", {H});
  b.add("mtp.", "fc_hidden.weight", {H, H});
  b.add("mtp.", "fc_embedding.weight", {H, H});
  add_hyper_connection(b, c, "mtp.layers.0.attn_hyper_connection.", true);
  add_hyper_connection(b, c, "mtp.layers.0.mlp_hyper_connection.", true);
  add_qsa(b, c, "mtp.layers.0.self_attn.");
  add_moe(b, c, "mtp.layers.0.mlp.");
  add_hyper_connection(b, c, "mtp.hyper_connection_mixer.", false);
  return out;
}

}  // namespace fs
