// Sparse MoE with a softmax router, top-k (optionally renormalised) and a shared expert behind a
// scalar sigmoid gate (Qwen3-Next / Qwen 3.8 Flash Next, Q4M 904-1000).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace fs {

struct MoeWeights {
  Weight router;              // [E, H]
  Weight gate_up;             // [E, 2I, H]: gate rows then up rows
  Weight down;                // [E, H, I]
  Weight shared_gate_proj;    // [Is, H]
  Weight shared_up_proj;      // [Is, H]
  Weight shared_down_proj;    // [H, Is]
  Weight shared_expert_gate;  // [1, H]
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  bool norm_topk_prob = true;
};

// In backend memory: the routing never returns to the host (the grouped-expert op reads it).
struct Routing {
  Tensor experts;  // [S, k] int32
  Tensor weights;  // [S, k] f32
};

// Softmax over the router logits in fp32, top-k, renormalised to sum 1 when norm_topk_prob.
void moe_route(Backend& be, const MoeWeights& w, const Tensor& x, Routing& r);
// y [S, H]: the routed experts (one grouped op that reads only the routed experts' weights),
// then the gated shared expert.
void moe(Backend& be, const MoeWeights& w, const Tensor& x, Tensor& y);

}  // namespace fs
