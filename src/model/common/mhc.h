// SCRATCH (uncommitted): host stand-in for the lead's mhc/router/clamped MoE, to debug the GLM
// forward before they land. Deleted before `git merge main`.
#pragma once
#include <cstdint>
#include "backend/backend.h"
#include "model/common/moe.h"
namespace fs {
struct MhcWeights {
  Weight fn, base, scale;
  std::int64_t streams = 0, width = 0;
  float norm_eps = 1e-6f, hc_eps = 1e-6f;
  std::int64_t sinkhorn_iters = 20;
};
struct MhcMix {
  Tensor post;
  Tensor comb;
};
void mhc_read(Backend&, const MhcWeights&, const Tensor& h, Tensor& collapsed, MhcMix& mix);
void mhc_write(Backend&, const MhcMix& mix, const Tensor& y, Tensor& h);
enum class RouterScore { kSoftmax, kSigmoid, kSqrtSoftplus };
struct RouterWeights {
  Weight gate, selection_bias, token_experts;
  RouterScore score = RouterScore::kSoftmax;
  std::int64_t experts = 0, top_k = 0, groups = 1, top_groups = 1;
  bool normalize = true;
  float routed_scaling = 1.0f;
};
struct SwigluMlpWeights {
  Weight gate, up, down;
  float swiglu_limit = 0;
};
void swiglu_mlp(Backend&, const SwigluMlpWeights&, const Tensor& x, Tensor& y);
struct ClampedMoeWeights {
  RouterWeights router;
  Weight gate_up, down;
  SwigluMlpWeights shared;
  float swiglu_limit = 0;
};
void clamped_moe(Backend&, const ClampedMoeWeights&, const Tensor& x, const Tensor* token_ids,
                 Tensor& y);
}  // namespace fs
