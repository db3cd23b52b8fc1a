#include "model/deepseek_v4/config.h"

namespace fs {
namespace {

// A rope sub-dict: {"rope_type": "default" | "yarn", "rope_theta", "factor", ...}.
DsRope parse_rope(ConfigReader& r, const std::string& field, const nlohmann::json& j,
                  double theta) {
  DsRope rope;
  rope.theta = j.contains("rope_theta") ? j["rope_theta"].get<double>() : theta;
  const auto type = j.contains("rope_type") ? j["rope_type"].get<std::string>()
                    : j.contains("type")    ? j["type"].get<std::string>()
                                            : "default";
  if (type == "yarn") {
    rope.yarn = true;
    rope.factor = j.value("factor", 1.0);
    rope.original_max_position_embeddings = j.value("original_max_position_embeddings", 0.0);
    rope.beta_fast = j.value("beta_fast", 32.0);
    rope.beta_slow = j.value("beta_slow", 1.0);
    rope.truncate = j.value("truncate", true);
    if (j.contains("attention_factor") && j["attention_factor"].get<double>() != 1.0)
      r.fail(field, "has a YaRN attention_factor other than 1 (V4 applies no mscale)");
    if (rope.original_max_position_embeddings <= 0)
      r.fail(field, "YaRN needs original_max_position_embeddings");
  } else if (type != "default") {
    r.fail(field, "has rope_type '" + type + "'; only default and yarn are supported");
  }
  return rope;
}

// HF DeepseekV4Config.__post_init__: a nested {"main", "compress"} dict, or a flat one (legacy
// rope_scaling) that becomes the compress rope; main is always plain rope at rope_theta.
void parse_ropes(ConfigReader& r, DeepseekV4Config& c) {
  c.main_rope.theta = c.rope_theta;
  c.compress_rope.theta = c.compress_rope_theta;
  for (const char* field : {"rope_parameters", "rope_scaling"}) {
    if (!r.has(field) || r.root()[field].is_null()) continue;
    const auto& rp = r.root()[field];
    if (!rp.is_object()) {
      r.fail(field, "must be an object");
      return;
    }
    if (rp.contains("main") || rp.contains("compress")) {
      if (rp.contains("main"))
        c.main_rope = parse_rope(r, std::string(field) + ".main", rp["main"], c.rope_theta);
      if (rp.contains("compress"))
        c.compress_rope =
            parse_rope(r, std::string(field) + ".compress", rp["compress"], c.compress_rope_theta);
    } else {
      auto flat = rp;
      flat.erase("rope_theta");  // the compress rope always runs at compress_rope_theta
      c.compress_rope = parse_rope(r, field, flat, c.compress_rope_theta);
    }
    return;
  }
}

}  // namespace

Expected<DeepseekV4Config> parse_deepseek_v4_config(ConfigReader& r) {
  DeepseekV4Config c;
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_key_value_heads = r.integer_or("num_key_value_heads", 1);
  c.head_dim = r.integer("head_dim");
  c.q_lora_rank = r.integer("q_lora_rank");
  c.o_groups = r.integer("o_groups");
  c.o_lora_rank = r.integer("o_lora_rank");
  c.sliding_window = r.integer("sliding_window");
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  c.compress_rope_theta = r.number_or("compress_rope_theta", 160000.0);
  if (r.has("partial_rotary_factor")) {
    c.partial_rotary_factor = r.number("partial_rotary_factor");
  } else if (r.has("qk_rope_head_dim") && r.integer("qk_rope_head_dim") > 0 && c.head_dim > 0) {
    c.partial_rotary_factor =
        static_cast<double>(r.integer("qk_rope_head_dim")) / static_cast<double>(c.head_dim);
  } else {
    c.partial_rotary_factor = c.head_dim > 0 ? 64.0 / static_cast<double>(c.head_dim) : 0;
  }
  if (r.has("compress_rates")) {
    const auto& cr = r.root()["compress_rates"];
    if (!cr.is_object()) {
      r.fail("compress_rates", "must be an object");
    } else {
      if (cr.contains("compressed_sparse_attention"))
        c.csa_compress_rate = cr["compressed_sparse_attention"].get<std::int64_t>();
      if (cr.contains("heavily_compressed_attention"))
        c.hca_compress_rate = cr["heavily_compressed_attention"].get<std::int64_t>();
    }
  }
  parse_ropes(r, c);
  c.index_n_heads = r.integer("index_n_heads");
  c.index_head_dim = r.integer("index_head_dim");
  c.index_topk = r.integer("index_topk");
  c.n_routed_experts = r.integer("n_routed_experts");
  c.n_shared_experts = r.integer_or("n_shared_experts", 1);
  c.num_experts_per_tok = r.integer("num_experts_per_tok");
  c.moe_intermediate_size = r.integer("moe_intermediate_size");
  c.routed_scaling_factor = r.number_or("routed_scaling_factor", 1.5);
  c.scoring_func = r.string_or("scoring_func", "sqrtsoftplus");
  c.swiglu_limit = r.number_or("swiglu_limit", 10.0);
  c.hc_mult = r.integer_or("hc_mult", 4);
  c.hc_sinkhorn_iters = r.integer_or("hc_sinkhorn_iters", 20);
  c.hc_eps = r.number_or("hc_eps", 1e-6);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.num_nextn_predict_layers = r.integer_or("num_nextn_predict_layers", 0);
  c.eos_token_ids = r.token_ids("eos_token_id");

  // The official release's config.json spells the layer kinds as HF's legacy fields do
  // (DeepseekV4Config.__post_init__): per-layer compress_ratios 0/4/128 (the MTP block's entry
  // after the trunk's), num_hash_layers, compress_rate_{csa,hca}.
  c.csa_compress_rate = r.integer_or("compress_rate_csa", c.csa_compress_rate);
  c.hca_compress_rate = r.integer_or("compress_rate_hca", c.hca_compress_rate);
  if (const auto types = r.strings_opt("layer_types")) {
    for (const auto& t : *types) {
      if (t == "sliding_attention") {
        c.layer_types.push_back(DsAttentionKind::kSliding);
      } else if (t == "compressed_sparse_attention") {
        c.layer_types.push_back(DsAttentionKind::kCompressedSparse);
      } else if (t == "heavily_compressed_attention") {
        c.layer_types.push_back(DsAttentionKind::kHeavilyCompressed);
      } else {
        r.fail("layer_types", "has unknown layer type '" + t + "'");
      }
    }
  } else if (const auto ratios = r.integers_opt("compress_ratios")) {
    for (std::size_t i = 0; i < ratios->size() && std::ssize(c.layer_types) < c.num_hidden_layers;
         ++i) {
      const auto v = (*ratios)[i];
      if (v == 0) {
        c.layer_types.push_back(DsAttentionKind::kSliding);
      } else if (v == 4) {
        c.layer_types.push_back(DsAttentionKind::kCompressedSparse);
      } else if (v == 128) {
        c.layer_types.push_back(DsAttentionKind::kHeavilyCompressed);
      } else {
        r.fail("compress_ratios", "has ratio " + std::to_string(v) + " (0, 4 or 128 expected)");
      }
    }
  } else {
    r.fail("layer_types", "is missing (and no legacy compress_ratios either)");
  }
  if (const auto mlp = r.strings_opt("mlp_layer_types")) {
    for (const auto& t : *mlp) {
      if (t == "hash_moe") {
        c.mlp_layer_types.push_back(DsMlpKind::kHashMoe);
      } else if (t == "moe") {
        c.mlp_layer_types.push_back(DsMlpKind::kMoe);
      } else {
        r.fail("mlp_layer_types", "has unknown MLP type '" + t + "'");
      }
    }
  } else {
    // HF default: three hash-routed layers (or legacy num_hash_layers), then score-routed ones.
    const auto hashed = r.integer_or("num_hash_layers", 3);
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.mlp_layer_types.push_back(i < hashed ? DsMlpKind::kHashMoe : DsMlpKind::kMoe);
    }
  }
  if (!r.status().ok()) return r.status();

  r.require_positive("vocab_size", c.vocab_size);
  r.require_positive("hidden_size", c.hidden_size);
  r.require_positive("num_hidden_layers", c.num_hidden_layers);
  r.require_positive("num_attention_heads", c.num_attention_heads);
  r.require_positive("head_dim", c.head_dim);
  r.require_positive("q_lora_rank", c.q_lora_rank);
  r.require_positive("o_groups", c.o_groups);
  r.require_positive("o_lora_rank", c.o_lora_rank);
  r.require_positive("sliding_window", c.sliding_window);
  r.require_positive("n_routed_experts", c.n_routed_experts);
  r.require_positive("moe_intermediate_size", c.moe_intermediate_size);
  r.require_positive("hc_mult", c.hc_mult);
  r.require_positive("compress_rates.compressed_sparse_attention", c.csa_compress_rate);
  r.require_positive("compress_rates.heavily_compressed_attention", c.hca_compress_rate);
  if (c.num_key_value_heads != 1) r.fail("num_key_value_heads", "must be 1 (one shared K=V head)");
  if (c.o_groups > 0 && c.num_attention_heads % c.o_groups != 0) {
    r.fail("o_groups", "must divide num_attention_heads");
  }
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.n_routed_experts) {
    r.fail("num_experts_per_tok", "must be in [1, n_routed_experts]");
  }
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "sigmoid" &&
      c.scoring_func != "softmax") {
    r.fail("scoring_func", "'" + c.scoring_func + "' is not supported");
  }
  if (static_cast<std::int64_t>(c.layer_types.size()) != c.num_hidden_layers) {
    r.fail("layer_types", "has " + std::to_string(c.layer_types.size()) + " entries for " +
                              std::to_string(c.num_hidden_layers) + " layers");
  }
  if (static_cast<std::int64_t>(c.mlp_layer_types.size()) != c.num_hidden_layers) {
    r.fail("mlp_layer_types", "has " + std::to_string(c.mlp_layer_types.size()) + " entries for " +
                                  std::to_string(c.num_hidden_layers) + " layers");
  }
  if (c.rope_head_dim() <= 0 || c.rope_head_dim() % 2 != 0 || c.rope_head_dim() > c.head_dim) {
    r.fail("partial_rotary_factor", "must give an even rotary width in (0, head_dim]");
  }
  if (!r.status().ok()) return r.status();
  return c;
}

}  // namespace fs
