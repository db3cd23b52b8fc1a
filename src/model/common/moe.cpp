#include "model/common/moe.h"

#include <limits>

namespace fs {

void moe(Backend& be, const MoeWeights& w, const Tensor& x, const StreamsWrite& out) {
  // The routing (softmax, top-k and the renormalisation, fp32 as Q4M 976), the routed experts,
  // the gated shared expert and the streams write in one backend op (its default body is those
  // ops in order).
  Routing routing;
  be.moe_block_into_streams(x, w.router, w.top_k, w.norm_topk_prob, w.gate_up, w.down,
                            w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj,
                            w.shared_expert_gate, routing.experts, routing.weights, out);
}

void swiglu_mlp(Backend& be, const SwigluMlpWeights& w, const Tensor& x, Tensor& y) {
  Tensor g, u, act;
  be.linear(x, w.gate, g);
  be.linear(x, w.up, u);
  if (w.swiglu_limit > 0) {
    be.clamp(g, -std::numeric_limits<float>::infinity(), w.swiglu_limit);
    be.clamp(u, -w.swiglu_limit, w.swiglu_limit);
  }
  be.swiglu(g, u, act);
  be.linear(act, w.down, y);
}

void clamped_moe(Backend& be, const ClampedMoeWeights& w, const Tensor& x, const Tensor* token_ids,
                 Tensor& y) {
  Routing routing;
  route(be, w.router, x, token_ids, routing);
  be.moe_experts(x, w.gate_up, w.down, routing.experts, routing.weights, w.swiglu_limit, y);
  Tensor shared;
  swiglu_mlp(be, w.shared, x, shared);
  be.add(y, shared);
}

}  // namespace fs
