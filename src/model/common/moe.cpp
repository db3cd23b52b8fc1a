#include "model/common/moe.h"

namespace fs {

void moe_route(Backend& be, const MoeWeights& w, const Tensor& x, Routing& r) {
  Tensor probs;
  be.linear(x, w.router, probs);
  be.softmax(probs);
  be.topk(probs, w.top_k, {}, r.experts, r.weights);
  if (!w.norm_topk_prob) return;
  // Renormalise the k picks of each token (a k-element bookkeeping step, fp32 as Q4M 976).
  for (std::size_t t = 0; t < r.weights.size(); t += static_cast<std::size_t>(w.top_k)) {
    float sum = 0;
    for (std::int64_t j = 0; j < w.top_k; ++j) sum += r.weights[t + static_cast<std::size_t>(j)];
    for (std::int64_t j = 0; j < w.top_k; ++j) r.weights[t + static_cast<std::size_t>(j)] /= sum;
  }
}

void moe(Backend& be, const MoeWeights& w, const Tensor& x, Tensor& y) {
  Routing routing;
  moe_route(be, w, x, routing);
  y.reset({x.rows(), x.cols()});
  std::vector<std::int32_t> rows;
  std::vector<float> weights;
  Tensor xe, gu, act, he;
  for (std::int64_t e = 0; e < w.experts; ++e) {
    rows.clear();
    weights.clear();
    for (std::size_t i = 0; i < routing.experts.size(); ++i) {
      if (routing.experts[i] != e) continue;
      rows.push_back(static_cast<std::int32_t>(i / static_cast<std::size_t>(w.top_k)));
      weights.push_back(routing.weights[i]);
    }
    if (rows.empty()) continue;
    be.gather_rows(x, rows, xe);
    be.linear(xe, w.gate_up.expert(e), gu);
    be.swiglu_packed(gu, act);
    be.linear(act, w.down.expert(e), he);
    be.scatter_add_rows(y, rows, he, weights);
  }
  Tensor g, u, shared, gate;
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
