// Pearson's chi-square against an exact distribution, for the tests that sample a decoder and
// compare what it emits with the distribution it must emit (the toy model's and the real
// families' MTP distribution tests).
#pragma once

#include <cstdint>
#include <vector>

namespace fs::test {

struct ChiSquare {
  double statistic = 0;
  int df = 0;  // degrees of freedom after pooling (>= 1; a single cell tests nothing)
};

// Pearson's chi-square of observed counts (n draws in all) against expected probabilities p.
// Cells with an expected count below 5 are pooled into one cell, which is kept (none of its
// observations is dropped) when its expectation is at least 1 (Cochran's rule); a pool below 1
// is judged by the exact Poisson tail instead: observing its count or more must not be below
// `pool_alpha` (else the statistic is infinite). A draw the exact distribution gives no mass
// makes the statistic infinite.
ChiSquare chi_square(const std::vector<std::int64_t>& observed, const std::vector<double>& p,
                     std::int64_t n, double pool_alpha = 1e-3);

// The upper `alpha` point of chi-square with `df` degrees of freedom (Wilson-Hilferty; within
// 1% of the exact point for df >= 3 at the levels the tests use).
double chi_square_critical(int df, double alpha = 1e-3);

}  // namespace fs::test
