// DeepSeek V4's tensor names as the official release (deepseek-ai's safetensors) writes them,
// against the HF names the schema uses (HF's conversion mapping, arch-dsv4.md section 6):
//   embed.weight -> embed_tokens.weight, head.weight -> lm_head.weight, hc_head_fn ->
//   hc_head.hc_fn, layers.i.attn.wq_a.weight -> layers.i.self_attn.q_a_proj.weight,
//   layers.i.hc_attn_fn -> layers.i.attn_hc.fn, layers.i.ffn.shared_experts.w1.weight ->
//   ...mlp.shared_experts.gate_proj .weight, and so on; the MTP block's layer (`mtp.0.`) is named
//   as a trunk layer.
// The routed experts are one tensor per expert and projection in the release
// (`layers.i.ffn.experts.e.w1.weight`, w1 = gate, w3 = up, w2 = down) where HF stacks them
// (`mlp.experts.gate_up_proj` [E, 2I, H] = each expert's w1 rows then its w3 rows, `down_proj`
// [E, H, I]); official_experts.h stacks them.
// Block scales sit beside their weight as `<base>.scale` (`layers.i.attn.wq_a.scale` for
// `layers.i.attn.wq_a.weight`), F8_E8M0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "format/safetensors.h"

namespace fs {

// Whether the checkpoint is named as the official release is (its embedding is `embed.weight`),
// rather than as HF's conversion (`embed_tokens.weight`).
bool deepseek_v4_official_names(const Checkpoint& ck);

// The official name of an HF-named tensor (the schema's canonical names, the MTP block's included);
// nullopt for the stacked experts (see official_expert_name) and for names the release does not
// have.
std::optional<std::string> deepseek_v4_official_name(const std::string& hf);
// The HF name of an official one; nullopt for the per-expert tensors, block scales and names the
// release does not have.
std::optional<std::string> deepseek_v4_hf_name(const std::string& official);

// The three projections of a routed expert, by the release's names.
enum class DsExpertProjection { kGate, kDown, kUp };  // w1, w2, w3
// `layers.3.ffn.experts.5.w1` (no `.weight` / `.scale`) for layer prefix "layers.3." (or
// "mtp.0."), expert 5, kGate.
std::string official_expert_name(const std::string& layer_prefix, std::int64_t expert,
                                 DsExpertProjection p);
// The scale tensor beside an official weight: `<base>.scale` for `<base>.weight`.
std::string official_scale_name(const std::string& weight_name);

}  // namespace fs
