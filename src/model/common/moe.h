// Sparse MoE blocks. Qwen's: a softmax router, top-k (optionally renormalised) and a shared
// expert behind a scalar sigmoid gate (Qwen3-Next / Qwen 3.8 Flash Next, Q4M 904-1000).
// DeepSeek V4's and GLM 5.3's: the parameterised router (router.h), SwiGLU clamped at
// `swiglu_limit` in the routed experts and in an ungated shared expert (DS V4 M:965-1094, GLM
// M:87-208); the same clamped SwiGLU MLP is GLM's dense FFN.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/common/router.h"

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

// y [S, H]: the routing (softmax over the router logits in fp32, top-k, renormalised to sum 1
// when norm_topk_prob), the routed experts (reading only the routed experts' weights), then the
// gated shared expert, written into the hyper-connection streams; one backend op
// (Backend::moe_block_into_streams).
void moe(Backend& be, const MoeWeights& w, const Tensor& x, const StreamsWrite& out);

// y = down(silu(min(gate x, L)) * clamp(up x, -L, L)); L = swiglu_limit, 0 for no clamp.
struct SwigluMlpWeights {
  Weight gate;  // [I, D]
  Weight up;    // [I, D]
  Weight down;  // [D, I]
  float swiglu_limit = 0;
};
void swiglu_mlp(Backend& be, const SwigluMlpWeights& w, const Tensor& x, Tensor& y);

struct ClampedMoeWeights {
  RouterWeights router;
  Weight gate_up;  // [E, 2I, D]: gate rows then up rows
  Weight down;     // [E, D, I]
  SwigluMlpWeights shared;
  float swiglu_limit = 0;
};
// y [S, D] = the routed experts (clamped SwiGLU) + the shared expert. token_ids [S, 1] int32 in
// backend memory, read only when the router is a hash table.
void clamped_moe(Backend& be, const ClampedMoeWeights& w, const Tensor& x, const Tensor* token_ids,
                 Tensor& y);

}  // namespace fs
