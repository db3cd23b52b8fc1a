#include "model/common/moe.h"

namespace fs {

void moe_route(Backend& be, const MoeWeights& w, const Tensor& x, Routing& r) {
  // Softmax, top-k and the renormalisation (fp32 as Q4M 976) in one backend op.
  be.route_experts(x, w.router, w.top_k, w.norm_topk_prob, r.experts, r.weights);
}

void moe(Backend& be, const MoeWeights& w, const Tensor& x, Tensor& y) {
  Routing routing;
  moe_route(be, w, x, routing);
  be.moe_experts(x, w.gate_up, w.down, routing.experts, routing.weights, y);
  be.shared_expert(x, w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj,
                   w.shared_expert_gate, y);
}

}  // namespace fs
