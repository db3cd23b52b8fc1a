// The router of a sparse MoE, parameterised for the three families: Qwen's
// softmax top-k, the sigmoid / sqrt-softplus scores with a selection bias and
// group-limited top-k of DeepSeek V3/V4 and GLM 5.3, and DeepSeek V4's hash
// layers, whose experts are a fixed table row per token id.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "util/status.h"

namespace fs {

// In backend memory: the routing never returns to the host (the grouped-expert
// op reads it).
struct Routing {
  Tensor experts;  // [S, k] int32
  Tensor weights;  // [S, k] f32
};

enum class RouterScore { kSoftmax, kSigmoid, kSqrtSoftplus };
// The config spelling ("softmax", "sigmoid", "sqrtsoftplus"; DeepSeek's
// scoring_func).
Expected<RouterScore> router_score_from_name(const std::string& name);

struct RouterWeights {
  Weight gate;            // [E, D]
  Weight selection_bias;  // [E] f32 (e_score_correction_bias): for choosing
                          // only; may be empty
  Weight token_experts;   // [vocab, k] int32/int64 (tid2eid): set on hash layers
  RouterScore score = RouterScore::kSoftmax;
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  std::int64_t groups = 1;      // n_group: top-k limited to the best `top_groups` groups
  std::int64_t top_groups = 1;  // topk_group
  bool normalize = true;        // weights / (sum + 1e-20)
  float routed_scaling = 1.0f;
};

// scores = score(x · gate^T) in fp32, then Backend::select_experts. token_ids
// [S, 1] int32 in backend memory, read only on hash layers.
void route(Backend& be, const RouterWeights& w, const Tensor& x, const Tensor* token_ids,
           Routing& r);

}  // namespace fs
