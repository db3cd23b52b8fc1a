// The median wall time of `runs` calls of f, in milliseconds: what the host-side benches report.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace fs::bench_util {

template <typename F>
double median_ms(F&& f, int runs) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace fs::bench_util
