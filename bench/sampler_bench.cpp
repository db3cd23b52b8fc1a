// The host sampler's target distribution at Qwen 3.8 Flash Next's vocabulary (248,320 ids): the
// selecting form (decode/sampler.cpp) beside the full sort it replaced (tests/support), the same
// rows and settings, median of 9 calls each. Prints milliseconds per row and the ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "decode/sampler.h"
#include "sampler_reference.h"

namespace {

template <typename F>
double median_ms(F&& f) {
  std::vector<double> t;
  for (int i = 0; i < 9; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
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
  std::printf("%-34s %10s %10s %7s %6s\n", "settings", "select ms", "sort ms", "ratio", "kept");
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
    std::printf("%-34s %10.2f %10.2f %6.1fx %6zu\n", c.name, fast, full, full / fast, kept);
  }
}
