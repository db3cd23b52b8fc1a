#include "sampler_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace fs::test {

TokenDistribution full_sort_distribution(std::span<const float> logits, const SamplerConfig& c) {
  const std::size_t n = logits.size();
  double max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
  std::vector<double> p(n);
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / c.temperature);
    total += p[i];
  }
  for (auto& v : p) v /= total;
  std::vector<TokenId> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    const double pa = p[static_cast<std::size_t>(a)], pb = p[static_cast<std::size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  });
  std::size_t keep = n;
  if (c.top_k > 0) keep = std::min(keep, static_cast<std::size_t>(c.top_k));
  if (c.top_p < 1.0) {
    double before = 0;
    std::size_t k = 0;
    while (k < n && before < c.top_p) before += p[static_cast<std::size_t>(order[k++])];
    keep = std::min(keep, std::max<std::size_t>(k, 1));
  }
  if (c.min_p > 0.0) {
    const double floor = c.min_p * p[static_cast<std::size_t>(order[0])];
    std::size_t k = 0;
    while (k < n && p[static_cast<std::size_t>(order[k])] >= floor) ++k;
    keep = std::min(keep, std::max<std::size_t>(k, 1));
  }
  while (keep > 1 && p[static_cast<std::size_t>(order[keep - 1])] <= 0.0) --keep;
  std::vector<TokenId> kept(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep));
  std::sort(kept.begin(), kept.end());
  TokenDistribution d;
  double mass = 0;
  for (TokenId id : kept) mass += p[static_cast<std::size_t>(id)];
  for (TokenId id : kept) {
    d.ids.push_back(id);
    d.probs.push_back(p[static_cast<std::size_t>(id)] / mass);
  }
  return d;
}

}  // namespace fs::test
