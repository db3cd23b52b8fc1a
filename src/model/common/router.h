// RECONSTRUCTED by the glm5 helper at 18:10 UTC after it overwrote this file by accident (a `cd`
// that did not apply): rebuilt from router.cpp, moe.h and notes/shared_api.md. Please check it
// against your own copy.
//
// The parameterised MoE router (DeepSeek V4, GLM 5.3; Qwen's softmax router as a special case).
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "util/status.h"

namespace fs {

enum class RouterScore { kSoftmax, kSigmoid, kSqrtSoftplus };
Expected<RouterScore> router_score_from_name(const std::string& name);

struct RouterWeights {
  Weight gate;  // [E, D]
  Weight
      selection_bias;  // [E] f32 (e_score_correction_bias), added for selection only; may be empty
  Weight token_experts;  // [vocab, k] int32 (DS V4 tid2eid hash table); when set, selection = table
                         // row
  RouterScore score = RouterScore::kSoftmax;
  std::int64_t experts = 0, top_k = 0;
  std::int64_t groups = 1, top_groups = 1;  // GLM group-limited top-k (n_group, topk_group)
  bool normalize = true;                    // weights / (sum + 1e-20)
  float routed_scaling = 1.0f;
};

// In backend memory: the routing never returns to the host (the grouped-expert op reads it).
struct Routing {
  Tensor experts;  // [S, k] int32
  Tensor weights;  // [S, k] f32
};

// token_ids [S, 1] int32 in backend memory, only read for the hash table.
void route(Backend& be, const RouterWeights& w, const Tensor& x, const Tensor* token_ids,
           Routing& r);

}  // namespace fs
