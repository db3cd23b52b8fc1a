#include "bench/bench_config.h"

#include "format/config_json.h"

namespace fs::bench {
namespace {

nlohmann::json layer_types(std::int64_t layers) {
  auto t = nlohmann::json::array();
  for (std::int64_t i = 0; i < layers; ++i)
    t.push_back((i + 1) % 4 == 0 ? "qwen_sparse_attention" : "linear_attention");
  return t;
}

}  // namespace

nlohmann::json flash_next_config_json(std::int64_t layers, std::int64_t ple_head_rows) {
  // arch-qwen.md section 1, "released Qwen3.8-Flash-Next"; rope as the released config states.
  return {
      {"model_type", "qwen4_exp_text"},
      {"vocab_size", 248320},
      {"hidden_size", 2560},
      {"num_hidden_layers", layers},
      {"num_attention_heads", 24},
      {"num_key_value_heads", 2},
      {"head_dim", 256},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"rope_parameters",
       {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
      {"linear_conv_kernel_dim", 4},
      {"linear_key_head_dim", 128},
      {"linear_value_head_dim", 128},
      {"linear_num_key_heads", 16},
      {"linear_num_value_heads", 48},
      {"num_experts", 512},
      {"num_experts_per_tok", 10},
      {"moe_intermediate_size", 640},
      {"shared_expert_intermediate_size", 640},
      {"norm_topk_prob", true},
      {"hc_count", 4},
      {"hc_lowrank", 320},
      {"ple_layer_ids", {2}},
      {"ple_embed_dim", 2560},
      {"ple_conv_kernel_size", 4},
      {"ngram_size", 3},
      {"heads_per_ngram", 8},
      {"ngram_vocab_size_base", ple_head_rows},
      {"make_ngram_vocab_size_divisible_by", 128},
      {"split_ngram_parts", 1},
      {"seed", 1234},
      {"indexer_n_heads", 4},
      {"indexer_kv_heads", 1},
      {"indexer_head_dim", 128},
      {"indexer_budget", 2048},
      {"indexer_compress_ratio", 4},
      {"output_gate_type", "sigmoid"},
      {"eos_token_id", 248044},
      {"layer_types", layer_types(layers)},
      {"mtp_num_hidden_layers", 1},
  };
}

nlohmann::json tiny_config_json(std::int64_t layers) {
  auto j = flash_next_config_json(layers, 101);
  j["vocab_size"] = 512;
  j["hidden_size"] = 64;
  j["num_attention_heads"] = 4;
  j["head_dim"] = 16;
  j["linear_key_head_dim"] = 16;
  j["linear_value_head_dim"] = 16;
  j["linear_num_key_heads"] = 2;
  j["linear_num_value_heads"] = 4;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["shared_expert_intermediate_size"] = 32;
  j["hc_lowrank"] = 8;
  j["ple_embed_dim"] = 64;
  j["heads_per_ngram"] = 2;
  j["make_ngram_vocab_size_divisible_by"] = 8;
  j["indexer_n_heads"] = 2;
  j["indexer_head_dim"] = 16;
  j["indexer_budget"] = 16;
  j["eos_token_id"] = 0;
  return j;
}

Expected<QwenNextConfig> parse_bench_config(const nlohmann::json& j) {
  ConfigReader r(j, "bench config");
  return parse_qwen_next_config(r);
}

}  // namespace fs::bench
