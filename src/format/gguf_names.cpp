#include "format/gguf_names.h"

#include <array>
#include <cstdint>

namespace fs {
namespace {

struct Rule {
  std::string_view gguf;  // "{N}" stands for the layer number
  std::string_view hf;
  GgufPart part = GgufPart::kWhole;
};

// ds4's DeepSeek V4 names (arch-dsv4.md section 6), in the order a layer lists them.
constexpr std::array<Rule, 41> kDeepseek4 = {{
    {"token_embd.weight", "embed_tokens.weight"},
    {"output.weight", "lm_head.weight"},
    {"output_norm.weight", "norm.weight"},
    {"output_hc_fn.weight", "hc_head.hc_fn"},
    {"output_hc_base.weight", "hc_head.hc_base"},
    {"output_hc_scale.weight", "hc_head.hc_scale"},
    {"blk.{N}.hc_attn_fn.weight", "layers.{N}.attn_hc.fn"},
    {"blk.{N}.hc_attn_base.weight", "layers.{N}.attn_hc.base"},
    {"blk.{N}.hc_attn_scale.weight", "layers.{N}.attn_hc.scale"},
    {"blk.{N}.hc_ffn_fn.weight", "layers.{N}.ffn_hc.fn"},
    {"blk.{N}.hc_ffn_base.weight", "layers.{N}.ffn_hc.base"},
    {"blk.{N}.hc_ffn_scale.weight", "layers.{N}.ffn_hc.scale"},
    {"blk.{N}.attn_norm.weight", "layers.{N}.input_layernorm.weight"},
    {"blk.{N}.ffn_norm.weight", "layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.attn_q_a.weight", "layers.{N}.self_attn.q_a_proj.weight"},
    {"blk.{N}.attn_q_a_norm.weight", "layers.{N}.self_attn.q_a_norm.weight"},
    {"blk.{N}.attn_q_b.weight", "layers.{N}.self_attn.q_b_proj.weight"},
    {"blk.{N}.attn_kv.weight", "layers.{N}.self_attn.kv_proj.weight"},
    {"blk.{N}.attn_kv_a_norm.weight", "layers.{N}.self_attn.kv_norm.weight"},
    {"blk.{N}.attn_sinks.weight", "layers.{N}.self_attn.sinks"},
    {"blk.{N}.attn_output_a.weight", "layers.{N}.self_attn.o_a_proj.weight"},
    {"blk.{N}.attn_output_b.weight", "layers.{N}.self_attn.o_b_proj.weight"},
    {"blk.{N}.attn_compressor_kv.weight", "layers.{N}.self_attn.compressor.kv_proj.weight"},
    {"blk.{N}.attn_compressor_gate.weight", "layers.{N}.self_attn.compressor.gate_proj.weight"},
    {"blk.{N}.attn_compressor_ape.weight", "layers.{N}.self_attn.compressor.position_bias"},
    {"blk.{N}.attn_compressor_norm.weight", "layers.{N}.self_attn.compressor.kv_norm.weight"},
    {"blk.{N}.indexer.attn_q_b.weight", "layers.{N}.self_attn.compressor.indexer.q_b_proj.weight"},
    {"blk.{N}.indexer.proj.weight",
     "layers.{N}.self_attn.compressor.indexer.scorer.weights_proj.weight"},
    {"blk.{N}.indexer_compressor_kv.weight",
     "layers.{N}.self_attn.compressor.indexer.kv_proj.weight"},
    {"blk.{N}.indexer_compressor_gate.weight",
     "layers.{N}.self_attn.compressor.indexer.gate_proj.weight"},
    {"blk.{N}.indexer_compressor_ape.weight",
     "layers.{N}.self_attn.compressor.indexer.position_bias"},
    {"blk.{N}.indexer_compressor_norm.weight",
     "layers.{N}.self_attn.compressor.indexer.kv_norm.weight"},
    {"blk.{N}.ffn_gate_inp.weight", "layers.{N}.mlp.gate.weight"},
    {"blk.{N}.exp_probs_b.bias", "layers.{N}.mlp.gate.e_score_correction_bias"},
    {"blk.{N}.ffn_gate_tid2eid.weight", "layers.{N}.mlp.gate.tid2eid"},
    {"blk.{N}.ffn_gate_exps.weight", "layers.{N}.mlp.experts.gate_up_proj", GgufPart::kFirstHalf},
    {"blk.{N}.ffn_up_exps.weight", "layers.{N}.mlp.experts.gate_up_proj", GgufPart::kSecondHalf},
    {"blk.{N}.ffn_down_exps.weight", "layers.{N}.mlp.experts.down_proj"},
    {"blk.{N}.ffn_gate_shexp.weight", "layers.{N}.mlp.shared_experts.gate_proj.weight"},
    {"blk.{N}.ffn_up_shexp.weight", "layers.{N}.mlp.shared_experts.up_proj.weight"},
    {"blk.{N}.ffn_down_shexp.weight", "layers.{N}.mlp.shared_experts.down_proj.weight"},
}};

struct Table {
  std::string_view architecture;
  const Rule* begin;
  const Rule* end;
};

constexpr std::array<Table, 1> kTables = {
    {{"deepseek4", kDeepseek4.data(), kDeepseek4.data() + kDeepseek4.size()}}};

const Table* table_of(std::string_view arch) {
  for (const auto& t : kTables) {
    if (t.architecture == arch) return &t;
  }
  return nullptr;
}

std::string substitute(std::string_view pattern, const std::string& n) {
  std::string out(pattern);
  if (const auto at = out.find("{N}"); at != std::string::npos) out.replace(at, 3, n);
  return out;
}

// The layer number of `name` against `pattern` ("blk.{N}.x" vs "blk.12.x" -> "12").
std::optional<std::string> match(std::string_view pattern, std::string_view name) {
  const auto at = pattern.find("{N}");
  if (at == std::string_view::npos) {
    if (pattern == name) return std::string();
    return std::nullopt;
  }
  const auto head = pattern.substr(0, at);
  const auto tail = pattern.substr(at + 3);
  if (name.size() <= head.size() + tail.size()) return std::nullopt;
  if (name.substr(0, head.size()) != head || name.substr(name.size() - tail.size()) != tail)
    return std::nullopt;
  const auto digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.size() > 6) return std::nullopt;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  return std::string(digits);
}

}  // namespace

bool gguf_architecture_mapped(std::string_view architecture) {
  return table_of(architecture) != nullptr;
}

std::optional<GgufNameMapping> map_gguf_name(std::string_view architecture,
                                             std::string_view gguf_name) {
  const Table* t = table_of(architecture);
  if (!t) return std::nullopt;
  for (const Rule* r = t->begin; r != t->end; ++r) {
    if (auto n = match(r->gguf, gguf_name)) return GgufNameMapping{substitute(r->hf, *n), r->part};
  }
  return std::nullopt;
}

std::optional<GgufNameMapping> map_gguf_mtp_name(std::string_view architecture,
                                                 std::string_view gguf_name) {
  constexpr std::string_view kPrefix = "mtp.0.";
  if (architecture != "deepseek4" || !gguf_name.starts_with(kPrefix)) return std::nullopt;
  const auto rest = gguf_name.substr(kPrefix.size());
  // The block's own tensors (arch-dsv4.md 4).
  constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kOwn = {{
      {"enorm.weight", "enorm.weight"},
      {"hnorm.weight", "hnorm.weight"},
      {"e_proj.weight", "e_proj.weight"},
      {"h_proj.weight", "h_proj.weight"},
      {"norm.weight", "norm.weight"},
      {"hc_head_fn.weight", "hc_head.hc_fn"},
      {"hc_head_base.weight", "hc_head.hc_base"},
      {"hc_head_scale.weight", "hc_head.hc_scale"},
  }};
  for (const auto& [g, hf] : kOwn) {
    if (rest == g) return GgufNameMapping{std::string(kPrefix) + std::string(hf)};
  }
  // Its decoder layer: the trunk's names for layer 0, re-rooted.
  auto layer = map_gguf_name(architecture, "blk.0." + std::string(rest));
  constexpr std::string_view kLayer = "layers.0.";
  if (!layer || !std::string_view(layer->hf_name).starts_with(kLayer)) return std::nullopt;
  layer->hf_name = std::string(kPrefix) + layer->hf_name.substr(kLayer.size());
  return layer;
}

std::vector<std::string> gguf_names_of(std::string_view architecture, int layers) {
  std::vector<std::string> out;
  const Table* t = table_of(architecture);
  if (!t) return out;
  for (const Rule* r = t->begin; r != t->end; ++r) {
    if (r->gguf.find("{N}") == std::string_view::npos) {
      out.emplace_back(r->gguf);
      continue;
    }
    for (int l = 0; l < layers; ++l) out.push_back(substitute(r->gguf, std::to_string(l)));
  }
  return out;
}

}  // namespace fs
