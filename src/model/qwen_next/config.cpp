#include "model/qwen_next/config.h"

#include <algorithm>

namespace fs {

std::int64_t QwenNextConfig::ple_layer_index(std::int64_t layer) const {
  const auto it = std::find(ple_layer_ids.begin(), ple_layer_ids.end(), layer + 1);
  return it == ple_layer_ids.end() ? -1 : static_cast<std::int64_t>(it - ple_layer_ids.begin());
}

Expected<QwenNextConfig> parse_qwen_next_config(ConfigReader& r) {
  QwenNextConfig c;
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_key_value_heads = r.integer("num_key_value_heads");
  c.head_dim = r.integer("head_dim");
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.attention_bias = r.boolean_or("attention_bias", false);
  c.hidden_act = r.string_or("hidden_act", "silu");
  c.output_gate_type = r.string_or("output_gate_type", c.hidden_act);

  if (r.has("rope_parameters")) {
    const auto& rp = r.root()["rope_parameters"];
    if (!rp.is_object()) {
      r.fail("rope_parameters", "must be an object");
    } else {
      if (rp.contains("rope_theta") && rp["rope_theta"].is_number())
        c.rope_theta = rp["rope_theta"].get<double>();
      if (rp.contains("partial_rotary_factor") && rp["partial_rotary_factor"].is_number()) {
        c.partial_rotary_factor = rp["partial_rotary_factor"].get<double>();
      }
      const auto type = rp.value("rope_type", std::string("default"));
      if (type != "default")
        r.fail("rope_parameters.rope_type", "'" + type + "' is not supported (only 'default')");
    }
  } else {
    c.rope_theta = r.number_or("rope_theta", 10000.0);
    c.partial_rotary_factor = r.number_or("partial_rotary_factor", 1.0);
  }

  c.linear_conv_kernel_dim = r.integer_or("linear_conv_kernel_dim", 4);
  c.linear_key_head_dim = r.integer("linear_key_head_dim");
  c.linear_value_head_dim = r.integer("linear_value_head_dim");
  c.linear_num_key_heads = r.integer("linear_num_key_heads");
  c.linear_num_value_heads = r.integer("linear_num_value_heads");

  c.num_experts = r.integer("num_experts");
  c.num_experts_per_tok = r.integer("num_experts_per_tok");
  c.moe_intermediate_size = r.integer("moe_intermediate_size");
  c.shared_expert_intermediate_size = r.integer("shared_expert_intermediate_size");
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", true);

  c.hc_count = r.integer_or("hc_count", 4);
  c.hc_lowrank = r.integer("hc_lowrank");

  auto ple_ids = r.integers_opt("ple_layer_ids").value_or(std::vector<std::int64_t>{});
  std::sort(ple_ids.begin(), ple_ids.end());
  ple_ids.erase(std::unique(ple_ids.begin(), ple_ids.end()), ple_ids.end());
  c.ple_layer_ids = ple_ids;
  c.ple_embed_dim = r.integer_or("ple_embed_dim", c.hidden_size);
  c.ple_conv_kernel_size = r.integer_or("ple_conv_kernel_size", 4);
  c.ngram_size = r.integer_or("ngram_size", 3);
  c.heads_per_ngram = r.integer_or("heads_per_ngram", 8);
  c.ngram_vocab_size_base = r.integer_or("ngram_vocab_size_base", 20'000'000);
  c.make_ngram_vocab_size_divisible_by = r.integer_or("make_ngram_vocab_size_divisible_by", 128);
  c.split_ngram_parts = r.integer_or("split_ngram_parts", 512);
  c.seed = r.integer_or("seed", 1234);

  c.indexer_n_heads = r.integer_or("indexer_n_heads", 0);
  c.indexer_kv_heads = r.integer_or("indexer_kv_heads", 0);
  c.indexer_head_dim = r.integer_or("indexer_head_dim", 0);
  c.indexer_budget = r.integer_or("indexer_budget", 0);
  c.indexer_compress_ratio = r.integer_or("indexer_compress_ratio", 0);

  c.eos_token_ids = r.token_ids("eos_token_id");
  c.mtp_num_hidden_layers = r.integer_or("mtp_num_hidden_layers", 0);

  if (const auto types = r.strings_opt("layer_types")) {
    for (const auto& t : *types) {
      if (t == "linear_attention") {
        c.layer_types.push_back(QwenLayerKind::kLinearAttention);
      } else if (t == "qwen_sparse_attention" || t == "full_attention") {
        // Released checkpoints say full_attention; those layers run the indexer too (Q4C 180-184).
        c.layer_types.push_back(QwenLayerKind::kSparseAttention);
      } else {
        r.fail("layer_types", "has unknown layer type '" + t + "'");
      }
    }
  } else {
    const auto interval = r.integer_or("full_attention_interval", 4);
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.layer_types.push_back(interval > 0 && (i + 1) % interval == 0
                                  ? QwenLayerKind::kSparseAttention
                                  : QwenLayerKind::kLinearAttention);
    }
  }
  if (!r.status().ok()) return r.status();

  // validate_architecture (Q4C 188-257) and the sizes the model cannot run without.
  r.require_positive("vocab_size", c.vocab_size);
  r.require_positive("hidden_size", c.hidden_size);
  r.require_positive("num_hidden_layers", c.num_hidden_layers);
  r.require_positive("num_attention_heads", c.num_attention_heads);
  r.require_positive("num_key_value_heads", c.num_key_value_heads);
  r.require_positive("head_dim", c.head_dim);
  r.require_positive("linear_key_head_dim", c.linear_key_head_dim);
  r.require_positive("linear_value_head_dim", c.linear_value_head_dim);
  r.require_positive("linear_num_key_heads", c.linear_num_key_heads);
  r.require_positive("linear_num_value_heads", c.linear_num_value_heads);
  r.require_positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  r.require_positive("num_experts", c.num_experts);
  r.require_positive("moe_intermediate_size", c.moe_intermediate_size);
  r.require_positive("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  r.require_positive("hc_lowrank", c.hc_lowrank);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    r.fail("num_attention_heads", "must be a multiple of num_key_value_heads");
  }
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    r.fail("linear_num_value_heads", "must be a multiple of linear_num_key_heads");
  }
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
    r.fail("num_experts_per_tok", "must be in [1, num_experts]");
  }
  if (c.hc_count <= 1) r.fail("hc_count", "must be greater than 1");
  if (c.output_gate_type != "sigmoid" && c.output_gate_type != "silu") {
    r.fail("output_gate_type", "must be 'sigmoid' or 'silu', got '" + c.output_gate_type + "'");
  }
  if (static_cast<std::int64_t>(c.layer_types.size()) != c.num_hidden_layers) {
    r.fail("layer_types", "has " + std::to_string(c.layer_types.size()) + " entries for " +
                              std::to_string(c.num_hidden_layers) + " layers");
  }
  if (c.partial_rotary_factor <= 0 || c.partial_rotary_factor > 1 || c.rotary_dim() % 2 != 0) {
    r.fail("rope_parameters.partial_rotary_factor",
           "must give an even rotary width in (0, head_dim]");
  }
  const bool any_sparse =
      std::count(c.layer_types.begin(), c.layer_types.end(), QwenLayerKind::kSparseAttention) > 0;
  if (any_sparse) {
    r.require_positive("indexer_n_heads", c.indexer_n_heads);
    r.require_positive("indexer_head_dim", c.indexer_head_dim);
    r.require_positive("indexer_budget", c.indexer_budget);
    r.require_positive("indexer_compress_ratio", c.indexer_compress_ratio);
    if (c.indexer_kv_heads != 1) r.fail("indexer_kv_heads", "must be 1");
    if (c.indexer_compress_ratio > 0 && c.indexer_budget % c.indexer_compress_ratio != 0) {
      r.fail("indexer_budget", "must be a multiple of indexer_compress_ratio");
    }
    if (c.rotary_dim() > c.indexer_head_dim)
      r.fail("indexer_head_dim", "must be at least the rotary width");
  }
  if (!c.ple_layer_ids.empty()) {
    r.require_positive("ngram_size", c.ngram_size - 1);
    r.require_positive("heads_per_ngram", c.heads_per_ngram);
    r.require_positive("ple_embed_dim", c.ple_embed_dim);
    r.require_positive("ple_conv_kernel_size", c.ple_conv_kernel_size);
    r.require_positive("split_ngram_parts", c.split_ngram_parts);
    r.require_positive("ngram_vocab_size_base", c.ngram_vocab_size_base);
    r.require_positive("make_ngram_vocab_size_divisible_by", c.make_ngram_vocab_size_divisible_by);
    if (c.ngram_heads() > 0 && c.ple_embed_dim % c.ngram_heads() != 0) {
      r.fail("ple_embed_dim", "must be a multiple of (ngram_size-1)*heads_per_ngram");
    }
    for (const auto id : c.ple_layer_ids) {
      if (id < 1 || id > c.num_hidden_layers) {
        r.fail("ple_layer_ids",
               "entry " + std::to_string(id) + " is outside [1, num_hidden_layers]");
      } else if (c.layer_types[static_cast<std::size_t>(id - 1)] !=
                 QwenLayerKind::kLinearAttention) {
        r.fail("ple_layer_ids", "entry " + std::to_string(id) + " is not a linear_attention layer");
      }
    }
    if (c.eos_token_ids.empty())
      r.fail("eos_token_id", "is required when PLE is on (n-gram boundary token)");
  }
  if (!r.status().ok()) return r.status();
  return c;
}

namespace {
bool is_prime(std::int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (std::int64_t d = 3; d * d <= n; d += 2) {
    if (n % d == 0) return false;
  }
  return true;
}
}  // namespace

std::vector<std::int64_t> ple_head_vocab_sizes(const QwenNextConfig& c, std::int64_t ple_index) {
  const std::int64_t nh = c.ngram_heads();
  const std::int64_t skip = ple_index * nh;  // primes used by earlier PLE layers
  std::vector<std::int64_t> sizes;
  std::int64_t seen = 0;
  for (std::int64_t n = c.ngram_vocab_size_base; static_cast<std::int64_t>(sizes.size()) < nh;
       ++n) {
    if (!is_prime(n)) continue;
    if (seen++ >= skip) sizes.push_back(n);
  }
  return sizes;
}

std::int64_t ple_table_rows(const QwenNextConfig& c, std::int64_t ple_index) {
  std::int64_t total = 0;
  for (const auto s : ple_head_vocab_sizes(c, ple_index)) total += s;
  const std::int64_t div = c.make_ngram_vocab_size_divisible_by;
  return (total + div - 1) / div * div;
}

}  // namespace fs
