#include "model/deepseek_v4/official_names.h"

#include <cctype>
#include <span>

namespace fs {
namespace {

struct NamePair {
  const char* official;
  const char* hf;
};

// Whole-model tensors.
constexpr NamePair kGlobal[] = {
    {"embed.weight", "embed_tokens.weight"}, {"head.weight", "lm_head.weight"},
    {"norm.weight", "norm.weight"},          {"hc_head_fn", "hc_head.hc_fn"},
    {"hc_head_base", "hc_head.hc_base"},     {"hc_head_scale", "hc_head.hc_scale"},
};

// A decoder layer's tensors after its prefix (`layers.i.`, or the MTP block's `mtp.0.`).
constexpr NamePair kLayer[] = {
    {"hc_attn_fn", "attn_hc.fn"},
    {"hc_attn_base", "attn_hc.base"},
    {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},
    {"hc_ffn_base", "ffn_hc.base"},
    {"hc_ffn_scale", "ffn_hc.scale"},
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attn.q_norm.weight", "self_attn.q_a_norm.weight"},
    {"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attn.wkv.weight", "self_attn.kv_proj.weight"},
    {"attn.kv_norm.weight", "self_attn.kv_norm.weight"},
    {"attn.wo_a.weight", "self_attn.o_a_proj.weight"},
    {"attn.wo_b.weight", "self_attn.o_b_proj.weight"},
    {"attn.attn_sink", "self_attn.sinks"},
    {"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
    {"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
    // HF nests the indexer under the compressor; the release keeps it beside.
    {"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"},
    {"attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"},
    {"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
    {"attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"},
    {"ffn.gate.weight", "mlp.gate.weight"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
    {"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
};

// The MTP block's own tensors after `mtp.0.` (beside its decoder layer's).
constexpr NamePair kMtp[] = {
    {"e_proj.weight", "e_proj.weight"},  {"h_proj.weight", "h_proj.weight"},
    {"enorm.weight", "enorm.weight"},    {"hnorm.weight", "hnorm.weight"},
    {"norm.weight", "norm.weight"},      {"hc_head_fn", "hc_head.hc_fn"},
    {"hc_head_base", "hc_head.hc_base"}, {"hc_head_scale", "hc_head.hc_scale"},
};

// The length of a layer prefix `layers.<n>.` or `mtp.<n>.` at the start of `name` (0: none),
// and whether it is the MTP block's.
std::size_t layer_prefix_length(const std::string& name, bool& mtp) {
  for (const std::string_view head : {"layers.", "mtp."}) {
    if (!name.starts_with(head)) continue;
    auto i = head.size();
    const auto digits = i;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    if (i == digits || i >= name.size() || name[i] != '.') return 0;
    mtp = head == "mtp.";
    return i + 1;
  }
  return 0;
}

// `name` through the table from column `from` to the other.
std::optional<std::string> translate(const std::string& name, bool to_official) {
  auto lookup = [&](std::span<const NamePair> table,
                    std::string_view key) -> std::optional<std::string> {
    for (const auto& p : table)
      if (key == (to_official ? p.hf : p.official))
        return std::string(to_official ? p.official : p.hf);
    return std::nullopt;
  };
  bool mtp = false;
  if (const auto n = layer_prefix_length(name, mtp); n > 0) {
    const auto prefix = name.substr(0, n);
    const std::string_view rest = std::string_view(name).substr(n);
    if (auto t = lookup(kLayer, rest)) return prefix + *t;
    if (mtp)
      if (auto t = lookup(kMtp, rest)) return prefix + *t;
    return std::nullopt;
  }
  return lookup(kGlobal, name);
}

}  // namespace

bool deepseek_v4_official_names(const Checkpoint& ck) {
  return ck.contains("embed.weight") && !ck.contains("embed_tokens.weight");
}

std::optional<std::string> deepseek_v4_official_name(const std::string& hf) {
  return translate(hf, true);
}

std::optional<std::string> deepseek_v4_hf_name(const std::string& official) {
  return translate(official, false);
}

std::string official_expert_name(const std::string& layer_prefix, std::int64_t expert,
                                 DsExpertProjection p) {
  const char* w = p == DsExpertProjection::kGate   ? "w1"
                  : p == DsExpertProjection::kDown ? "w2"
                                                   : "w3";
  return layer_prefix + "ffn.experts." + std::to_string(expert) + "." + w;
}

std::string official_scale_name(const std::string& weight_name) {
  constexpr std::string_view kWeight = ".weight";
  if (weight_name.ends_with(kWeight))
    return weight_name.substr(0, weight_name.size() - kWeight.size()) + ".scale";
  return weight_name + ".scale";
}

}  // namespace fs
