#include "model/common/router.h"

namespace fs {

Expected<RouterScore> router_score_from_name(const std::string& name) {
  if (name == "softmax") return RouterScore::kSoftmax;
  if (name == "sigmoid") return RouterScore::kSigmoid;
  if (name == "sqrtsoftplus") return RouterScore::kSqrtSoftplus;
  return unsupported("unknown router scoring function '" + name +
                     "' (expected softmax, sigmoid or sqrtsoftplus)");
}

void route(Backend& be, const RouterWeights& w, const Tensor& x, const Tensor* token_ids,
           Routing& r) {
  Tensor scores;
  be.linear(x, w.gate, scores);
  switch (w.score) {
    case RouterScore::kSoftmax:
      be.softmax(scores);
      break;
    case RouterScore::kSigmoid:
      be.activate(scores, Activation::kSigmoid);
      break;
    case RouterScore::kSqrtSoftplus:
      be.activate(scores, Activation::kSqrtSoftplus);
      break;
  }
  be.select_experts(scores, w.selection_bias, w.token_experts, token_ids, w.groups, w.top_groups,
                    w.top_k, w.normalize, w.routed_scaling, r.experts, r.weights);
}

}  // namespace fs
