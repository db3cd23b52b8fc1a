// Qwen 3.8 Flash Next (HF model_type qwen4_exp): typed config, validated as the reference's
// validate_architecture does (../shared/research/arch-qwen.md section 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/config_json.h"
#include "util/status.h"

namespace fs {

enum class QwenLayerKind { kLinearAttention, kSparseAttention };

struct QwenNextConfig {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string hidden_act = "silu";
  std::string output_gate_type = "sigmoid";  // activation of the GDN gated RMSNorm

  // RoPE (text-only input: the interleaved MRoPE rows are all equal, so plain 1-D RoPE).
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;

  // GatedDeltaNet
  std::int64_t linear_conv_kernel_dim = 4;
  std::int64_t linear_key_head_dim = 0;
  std::int64_t linear_value_head_dim = 0;
  std::int64_t linear_num_key_heads = 0;
  std::int64_t linear_num_value_heads = 0;

  // MoE
  std::int64_t num_experts = 0;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t moe_intermediate_size = 0;
  std::int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;

  // Hyper-connections
  std::int64_t hc_count = 4;
  std::int64_t hc_lowrank = 0;

  // PLE hashed n-gram embeddings
  std::vector<std::int64_t> ple_layer_ids;  // ONE-indexed decoder layers, sorted, unique
  std::int64_t ple_embed_dim = 0;
  std::int64_t ple_conv_kernel_size = 4;
  std::int64_t ngram_size = 3;
  std::int64_t heads_per_ngram = 8;
  std::int64_t ngram_vocab_size_base = 20'000'000;
  std::int64_t make_ngram_vocab_size_divisible_by = 128;
  std::int64_t split_ngram_parts = 1;
  std::int64_t seed = 1234;

  // QSA block indexer
  std::int64_t indexer_n_heads = 0;
  std::int64_t indexer_kv_heads = 0;
  std::int64_t indexer_head_dim = 0;
  std::int64_t indexer_budget = 0;
  std::int64_t indexer_compress_ratio = 0;

  std::vector<std::int64_t> eos_token_ids;
  std::vector<QwenLayerKind> layer_types;
  std::int64_t mtp_num_hidden_layers = 0;

  // Derived values, named as in arch-qwen.md.
  std::int64_t rotary_dim() const {
    return static_cast<std::int64_t>(head_dim * partial_rotary_factor);
  }
  std::int64_t gdn_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  std::int64_t gdn_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  std::int64_t gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  std::int64_t ngram_heads() const { return (ngram_size - 1) * heads_per_ngram; }  // NH
  std::int64_t ple_head_dim() const { return ple_embed_dim / ngram_heads(); }      // de
  std::int64_t stream_width() const { return hc_count * hidden_size; }             // hc*H
  // Index of decoder layer `layer` (0-based) among the PLE layers, or -1 when it has none.
  std::int64_t ple_layer_index(std::int64_t layer) const;
};

Expected<QwenNextConfig> parse_qwen_next_config(ConfigReader& r);

// Per-head prime table sizes of the n-gram table of the `ple_index`-th PLE layer: the
// (ple_index*NH + j + 1)-th prime >= ngram_vocab_size_base, j in [0, NH).
std::vector<std::int64_t> ple_head_vocab_sizes(const QwenNextConfig& c, std::int64_t ple_index);
// Rows of that table: the sum of the sizes, rounded up to make_ngram_vocab_size_divisible_by.
std::int64_t ple_table_rows(const QwenNextConfig& c, std::int64_t ple_index);

}  // namespace fs
