#include "chi_square.h"

#include <algorithm>
#include <cmath>

namespace fs::test {

ChiSquare chi_square(const std::vector<std::int64_t>& observed, const std::vector<double>& p,
                     std::int64_t n, double pool_alpha) {
  double stat = 0, pooled_e = 0;
  std::int64_t pooled_o = 0;
  int cells = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * static_cast<double>(n);
    if (e == 0 && observed[i] > 0) return {INFINITY, 1};
    if (e < 5) {
      pooled_e += e;
      pooled_o += observed[i];
      continue;
    }
    const double d = static_cast<double>(observed[i]) - e;
    stat += d * d / e;
    ++cells;
  }
  if (pooled_e >= 1) {
    const double d = static_cast<double>(pooled_o) - pooled_e;
    stat += d * d / pooled_e;
    ++cells;
  } else if (pooled_o > 0) {
    // P(X >= pooled_o) for X ~ Poisson(pooled_e).
    double term = std::exp(-pooled_e), below = 0;
    for (std::int64_t k = 0; k < pooled_o; ++k) {
      below += term;
      term *= pooled_e / static_cast<double>(k + 1);
    }
    if (1.0 - below < pool_alpha) return {INFINITY, std::max(cells - 1, 1)};
  }
  return {stat, std::max(cells - 1, 1)};
}

double chi_square_critical(int df, double alpha) {
  // The standard normal's upper alpha point, by bisection on its tail 0.5 erfc(z / sqrt 2).
  double lo = 0, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > alpha ? lo : hi) = mid;
  }
  const double z = 0.5 * (lo + hi), a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

}  // namespace fs::test
