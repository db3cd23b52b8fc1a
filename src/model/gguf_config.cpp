#include "model/gguf_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "format/gguf_names.h"
#include "model/gguf_inspect.h"

namespace fs {
namespace {

// Reads `<arch>.<key>` values, remembering the first failure (naming the key).
class MetadataReader {
 public:
  MetadataReader(const GgufModel& m, std::string arch, std::string source)
      : m_(m), arch_(std::move(arch)), source_(std::move(source)) {}

  const GgufValue* find(const std::string& key) const { return m_.find(arch_ + "." + key); }

  std::int64_t integer(const std::string& key) {
    const GgufValue* v = require(key);
    if (!v) return 0;
    if (const auto i = v->as_int()) return *i;
    return wrong(key, *v, "an integer");
  }
  double number(const std::string& key) {
    const GgufValue* v = require(key);
    if (!v) return 0;
    if (const auto f = v->as_float()) return *f;
    if (const auto i = v->as_int()) return static_cast<double>(*i);
    return wrong(key, *v, "a number");
  }
  bool boolean(const std::string& key) {
    const GgufValue* v = require(key);
    if (!v) return false;
    if (const auto b = v->as_bool()) return *b;
    return wrong(key, *v, "a bool") != 0;
  }
  std::vector<std::int64_t> ints(const std::string& key) {
    const GgufValue* v = require(key);
    if (!v) return {};
    if (const auto a = v->as_int_array()) return *a;
    wrong(key, *v, "an integer array");
    return {};
  }
  // A float array, or a scalar as an array of one.
  std::vector<double> numbers(const std::string& key) {
    const GgufValue* v = require(key);
    if (!v) return {};
    if (!v->floats.empty()) return v->floats;
    wrong(key, *v, "a float or a float array");
    return {};
  }
  void fail(const std::string& key, const std::string& what) {
    if (status_.ok()) status_ = corrupt(source_ + ": GGUF key " + arch_ + "." + key + " " + what);
  }
  const Status& status() const { return status_; }

 private:
  const GgufValue* require(const std::string& key) {
    const GgufValue* v = find(key);
    if (!v && status_.ok())
      status_ = not_found(source_ + ": the " + arch_ + " metadata lacks the key " + arch_ + "." +
                          key + " (ds4's loader requires it)");
    return v;
  }
  std::int64_t wrong(const std::string& key, const GgufValue& v, const char* want) {
    fail(key, "is " + v.summary() + ", expected " + want);
    return 0;
  }

  const GgufModel& m_;
  std::string arch_;
  std::string source_;
  Status status_;
};

// ds4's `deepseek4` keys -> DeepSeek V4's HF config (arch-dsv4.md 1.1, 1.2).
Expected<nlohmann::json> deepseek4_config(const GgufModel& m, const std::string& source) {
  MetadataReader r(m, "deepseek4", source);
  nlohmann::json c;
  c["model_type"] = "deepseek_v4";
  const auto layers = r.integer("block_count");
  c["num_hidden_layers"] = layers;
  c["hidden_size"] = r.integer("embedding_length");
  c["vocab_size"] = r.integer("vocab_size");
  c["num_attention_heads"] = r.integer("attention.head_count");
  c["num_key_value_heads"] = r.integer("attention.head_count_kv");
  const auto head_dim = r.integer("attention.key_length");
  c["head_dim"] = head_dim;
  if (const auto v = r.integer("attention.value_length"); r.status().ok() && v != head_dim)
    r.fail("attention.value_length", "is " + std::to_string(v) +
                                         "; DeepSeek V4's one K=V head "
                                         "needs it equal to attention.key_length (" +
                                         std::to_string(head_dim) + ")");
  c["qk_rope_head_dim"] = r.integer("rope.dimension_count");
  c["q_lora_rank"] = r.integer("attention.q_lora_rank");
  c["o_lora_rank"] = r.integer("attention.output_lora_rank");
  c["o_groups"] = r.integer("attention.output_group_count");
  c["n_routed_experts"] = r.integer("expert_count");
  c["num_experts_per_tok"] = r.integer("expert_used_count");
  c["moe_intermediate_size"] = r.integer("expert_feed_forward_length");
  c["n_shared_experts"] = r.integer("expert_shared_count");
  const auto hash_layers = r.integer("hash_layer_count");
  c["sliding_window"] = r.integer("attention.sliding_window");
  c["index_n_heads"] = r.integer("attention.indexer.head_count");
  c["index_head_dim"] = r.integer("attention.indexer.key_length");
  c["index_topk"] = r.integer("attention.indexer.top_k");
  c["hc_mult"] = r.integer("hyper_connection.count");
  c["hc_sinkhorn_iters"] = r.integer("hyper_connection.sinkhorn_iterations");
  c["hc_eps"] = r.number("hyper_connection.epsilon");
  c["rms_norm_eps"] = r.number("attention.layer_norm_rms_epsilon");
  c["routed_scaling_factor"] = r.number("expert_weights_scale");
  // ds4 routes by sqrt(softplus) always; its files carry no key for it.
  c["scoring_func"] = "sqrtsoftplus";
  if (!r.boolean("expert_weights_norm") && r.status().ok())
    r.fail("expert_weights_norm", "is false; DeepSeek V4 normalises the selected experts' weights");
  for (const char* key : {"expert_group_count", "expert_group_used_count"}) {
    if (const GgufValue* v = r.find(key); v && v->as_int().value_or(-1) > 1)
      r.fail(key, "is " + v->summary() + "; group-limited routing is not DeepSeek V4's");
  }
  // One clamp for every layer (ds4 stores it per layer; V4 uses 10 throughout).
  const auto clamps = r.numbers("swiglu_clamp_exp");
  if (!clamps.empty()) {
    c["swiglu_limit"] = clamps.front();
    for (const double x : clamps) {
      if (x != clamps.front()) {
        r.fail("swiglu_clamp_exp", "holds different clamps per layer; one is supported");
        break;
      }
    }
  }

  // Ropes: main is plain at rope.freq_base; compress is YaRN at compress_rope_freq_base when
  // the scaling factor exceeds 1 (a factor of 1 leaves every frequency as plain rope has it).
  const double main_theta = r.number("rope.freq_base");
  const double compress_theta = r.number("attention.compress_rope_freq_base");
  const double factor = r.number("rope.scaling.factor");
  const double original = r.number("rope.scaling.original_context_length");
  const double beta_fast = r.number("rope.scaling.yarn_beta_fast");
  const double beta_slow = r.number("rope.scaling.yarn_beta_slow");
  c["rope_theta"] = main_theta;
  c["compress_rope_theta"] = compress_theta;
  nlohmann::json compress = {{"rope_theta", compress_theta}, {"rope_type", "default"}};
  if (factor > 1.0) {
    compress = {{"rope_type", "yarn"},    {"rope_theta", compress_theta},
                {"factor", factor},       {"original_max_position_embeddings", original},
                {"beta_fast", beta_fast}, {"beta_slow", beta_slow}};
  }
  c["rope_parameters"] = {{"main", {{"rope_type", "default"}, {"rope_theta", main_theta}}},
                          {"compress", compress}};

  // Per-layer attention from the compression ratios (0 sliding, 4 CSA with its indexer, any
  // other ratio HCA), the first hash_layer_count MoE layers hash-routed.
  const auto ratios = r.ints("attention.compress_ratios");
  if (r.status().ok() && static_cast<std::int64_t>(ratios.size()) < layers)
    r.fail("attention.compress_ratios", "has " + std::to_string(ratios.size()) +
                                            " entries for block_count " + std::to_string(layers));
  if (!r.status().ok()) return r.status();
  std::vector<std::string> types, mlp;
  std::int64_t hca = 0;
  for (std::int64_t i = 0; i < layers; ++i) {
    const auto ratio = ratios[static_cast<std::size_t>(i)];
    if (ratio == 0) {
      types.emplace_back("sliding_attention");
    } else if (ratio == 4) {
      types.emplace_back("compressed_sparse_attention");
    } else if (ratio > 0 && (hca == 0 || hca == ratio)) {
      hca = ratio;
      types.emplace_back("heavily_compressed_attention");
    } else {
      r.fail("attention.compress_ratios",
             "has ratio " + std::to_string(ratio) + " at layer " + std::to_string(i) +
                 " (expected 0, 4, or one heavily compressed ratio for every such layer)");
      return r.status();
    }
    mlp.emplace_back(i < hash_layers ? "hash_moe" : "moe");
  }
  c["layer_types"] = types;
  c["mlp_layer_types"] = mlp;
  c["compress_rates"] = {{"compressed_sparse_attention", 4},
                         {"heavily_compressed_attention", hca > 0 ? hca : 128}};
  if (const GgufValue* v = r.find("context_length"))
    c["max_position_embeddings"] = v->as_int().value_or(0);
  // ds4 keeps the MTP block in a separate file.
  c["num_nextn_predict_layers"] = 0;
  c["tie_word_embeddings"] = m.tensors().count("output.weight") == 0;
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                   std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"}}) {
    if (const GgufValue* v = m.find(key); v && v->as_int()) c[field] = *v->as_int();
  }
  if (!r.status().ok()) return r.status();
  return c;
}

}  // namespace

Expected<std::string> hf_config_from_gguf(const GgufModel& model) {
  const std::string source = model.split(0).path();
  const GgufValue* a = model.find("general.architecture");
  if (!a || !a->as_string())
    return corrupt(source + ": the GGUF file has no general.architecture string");
  const std::string arch = *a->as_string();
  if (arch != "deepseek4")
    return unsupported(source + ": GGUF architecture '" + arch +
                       "' is not loaded (the GGUF loader knows deepseek4, ds4's DeepSeek V4)");
  auto c = deepseek4_config(model, source);
  if (!c.ok()) return c.status();
  return c->dump();
}

std::optional<nlohmann::json> gguf_hf_config(const std::string& path) {
  if (!is_gguf_file(path)) return std::nullopt;
  auto m = GgufModel::open(path);
  if (!m.ok()) return std::nullopt;
  auto text = hf_config_from_gguf(*m);
  if (!text.ok()) return std::nullopt;
  return nlohmann::json::parse(*text);
}

Expected<ModelDescription> describe_gguf_model(const std::string& path) {
  auto m = GgufModel::open(path);
  if (!m.ok()) return m.status();
  auto text = hf_config_from_gguf(*m);
  if (!text.ok()) return text.status();
  auto d = describe_model_config(*text, path + " (its GGUF metadata)");
  if (!d.ok()) return d.status();
  // The GGUF names of MTP tensors stay apart (ds4's side file).
  return d;
}

}  // namespace fs
