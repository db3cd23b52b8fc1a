#include "model/common/moe.h"

namespace fs {

void moe_route(Backend& be, const MoeWeights& w, const Tensor& x, Routing& r) {
  Tensor probs;
  be.linear(x, w.router, probs);
  be.softmax(probs);
  be.topk(probs, w.top_k, r.experts, r.weights);
  // Renormalise the k picks of each token (fp32 as Q4M 976).
  if (w.norm_topk_prob) be.normalize_rows(r.weights);
}

void moe(Backend& be, const MoeWeights& w, const Tensor& x, Tensor& y) {
  Routing routing;
  moe_route(be, w, x, routing);
  be.moe_experts(x, w.gate_up, w.down, routing.experts, routing.weights, y);
  Tensor g, u, act, shared, gate;
  be.linear(x, w.shared_gate_proj, g);
  be.linear(x, w.shared_up_proj, u);
  be.swiglu(g, u, act);
  be.linear(act, w.shared_down_proj, shared);
  be.linear(x, w.shared_expert_gate, gate);
  be.activate(gate, Activation::kSigmoid);
  be.mul_rows(shared, gate);
  be.add(y, shared);
}

}  // namespace fs
