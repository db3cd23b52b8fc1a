// The host sampler's target distribution at Qwen 3.8 Flash Next's vocabulary (248,320 ids): the
// selecting form (decode/sampler.cpp) beside the full sort it replaced (tests/support), the same
// rows and settings, median of 9 calls each. Prints milliseconds per row and the ratio, and the
// host time left when a device sends only the row's top 1,024 and its softmax denominator
// (target_distribution_from_top; "-" where the rules are not decided inside that top).
#include <algorithm>
#include <bit>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"

#include "decode/sampler.h"
#include "median_time.h"
#include "sampler_reference.h"

namespace {

// Median of 9 calls.
template <typename F>
double median_ms(F&& f) {
  return fs::bench_util::median_ms(f, 9);
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(248320);
  for (auto& v : logits) v = normal(rng);
  struct Case {
    const char* name;
    double temperature, top_p, min_p;
    std::int64_t top_k;
  };
  // The row's top 1,024 ids by logit (ties to the lower id), as Backend::topk returns them.
  constexpr std::size_t kTop = 1024;
  std::vector<fs::TokenId> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + kTop, order.end(), [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  order.resize(kTop);
  std::vector<float> top(kTop);
  for (std::size_t k = 0; k < kTop; ++k) top[k] = logits[static_cast<std::size_t>(order[k])];
  auto cpu = fs::make_cpu_backend();
  const fs::Tensor row({1, static_cast<std::int64_t>(logits.size())}, logits);
  std::printf("%-34s %10s %10s %7s %6s %12s\n", "settings", "select ms", "sort ms", "ratio", "kept",
              "from top ms");
  for (const Case c : {Case{"T 0.7 top_p 0.95 top_k 20", 0.7, 0.95, 0.0, 20},
                       Case{"T 0.7 top_p 0.8", 0.7, 0.8, 0.0, 0},
                       Case{"T 1.0 top_p 0.95 min_p 0.05", 1.0, 0.95, 0.05, 0},
                       Case{"T 1.0 (no prefix rule)", 1.0, 1.0, 0.0, 0}}) {
    fs::SamplerConfig s;
    s.temperature = c.temperature;
    s.top_p = c.top_p;
    s.min_p = c.min_p;
    s.top_k = c.top_k;
    std::size_t kept = 0;
    const double fast = median_ms([&] { kept = fs::target_distribution(logits, s).ids.size(); });
    const double full = median_ms([&] { fs::test::full_sort_distribution(logits, s); });
    fs::Tensor totals;
    cpu->softmax_denominators(row, s.temperature, totals);
    const fs::RankedTop ranked{order, top, std::bit_cast<double>(totals.data_as<std::int64_t>()[0]),
                               logits.size()};
    bool decided = false;
    const double from_top =
        median_ms([&] { decided = fs::target_distribution_from_top(ranked, s).has_value(); });
    char tail[32] = "-";
    if (decided) std::snprintf(tail, sizeof tail, "%.3f", from_top);
    std::printf("%-34s %10.2f %10.2f %6.1fx %6zu %12s\n", c.name, fast, full, full / fast, kept,
                tail);
  }
}
