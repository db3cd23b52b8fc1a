#include "model/family_table.h"

#include <algorithm>

#include "format/config_json.h"
#include "model/deepseek_v4/schema.h"
#include "model/glm5/schema.h"
#include "model/qwen_next/schema.h"

namespace fs {
namespace {

Status describe_qwen_next(ConfigReader& r, ModelDescription& d) {
  auto c = parse_qwen_next_config(r);
  if (!c.ok()) return c.status();
  d.layers = qwen_next_schedule(*c);
  d.tensors = qwen_next_tensors(*c);
  d.config = std::move(c).value();
  return {};
}

Status describe_deepseek_v4(ConfigReader& r, ModelDescription& d) {
  auto c = parse_deepseek_v4_config(r);
  if (!c.ok()) return c.status();
  d.layers = deepseek_v4_schedule(*c);
  d.tensors = deepseek_v4_tensors(*c);
  // The MTP block ships as "mtp.0.*" (HF ignores it; arch-dsv4.md 4).
  d.mtp_prefixes.push_back("mtp.");
  d.config = std::move(c).value();
  return {};
}

Status describe_glm5(ConfigReader& r, ModelDescription& d) {
  auto c = parse_glm5_config(r);
  if (!c.ok()) return c.status();
  d.layers = glm5_schedule(*c);
  d.tensors = glm5_tensors(*c);
  // GLM stores its MTP layer as the decoder layer after the last one (arch-glm.md 4).
  for (std::int64_t k = 0; k < std::max<std::int64_t>(c->num_nextn_predict_layers, 1); ++k) {
    d.mtp_prefixes.push_back("layers." + std::to_string(c->num_hidden_layers + k) + ".");
  }
  d.config = std::move(c).value();
  return {};
}

const std::vector<FamilyEntry>& entries() {
  static const std::vector<FamilyEntry> table = {
      {Family::kQwenNext,
       "qwen4_exp",
       {"qwen4_exp_text"},
       {'F', 'S', 'C', 'K', 'Q', 'N', 'X', '1'},
       1,
       describe_qwen_next},
      {Family::kDeepseekV4,
       "deepseek_v4",
       {},
       {'F', 'S', 'C', 'K', 'D', 'S', '4', '1'},
       1,
       describe_deepseek_v4},
      {Family::kGlm5,
       "glm5_next",
       {"glm5_next_text"},
       {'F', 'S', 'C', 'K', 'G', 'L', '5', '1'},
       1,
       describe_glm5},
  };
  return table;
}

}  // namespace

std::span<const FamilyEntry> family_table() {
  return entries();
}

const FamilyEntry& family_entry(Family f) {
  for (const auto& e : entries()) {
    if (e.family == f) return e;
  }
  return entries().front();  // unreachable: every Family has an entry
}

}  // namespace fs
