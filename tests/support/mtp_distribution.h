// The sampled-distribution invariant of MTP decoding on a real model: speculative sampling at
// temperature > 0 (with top-k / top-p / min-p and penalties) emits the tokens autoregressive
// sampling emits, in distribution. One-sample tests against the exact distribution: the first
// `positions` tokens of a turn are enumerated prefix by prefix (the sampler's support must be
// small: top-k or a tight top-p), and seeded turns are counted against it with Pearson's
// chi-square (chi_square.h), per position and for each pair of neighbouring positions.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "chi_square.h"
#include "decode/drafter.h"
#include "decode/generator.h"
#include "mtp_harness.h"

namespace fs::test {

// The exact probability of every sequence of the first `positions` tokens after `base`, under
// autoregressive sampling with `sampler` (penalties counted over the completion).
struct SequenceDistribution {
  int positions = 0;
  std::map<std::vector<TokenId>, double> p;
  std::int64_t forwards = 0;  // one-token forwards the enumeration ran
};
SequenceDistribution exact_sequences(Model& model, const DecodeState& base,
                                     const SamplerConfig& sampler, int positions);

struct SampledCase {
  SamplerConfig sampler;
  int depth = 1;
  std::int64_t draws = 0;
  std::uint64_t first_seed = 0;  // turn i uses seed first_seed + i
  Drafter* drafter = nullptr;    // null: the model's MTP head
};

// One chi-square of the case: a position ("t2") or a pair of neighbours ("t2,t3").
struct DistributionStat {
  std::string cells;
  ChiSquare chi;
  double critical = 0;
  bool passes() const { return chi.statistic < critical; }
};
struct SampledReport {
  std::vector<DistributionStat> stats;
  std::array<std::int64_t, kMaxMtpDepth> drafted{}, accepted{};
  // The largest statistic over its critical value (below 1: every statistic passes).
  double worst_ratio() const;
};

// `draws` seeded turns of `positions` tokens from clones of `base`; each statistic fails with
// probability at most `alpha` when the decoder is exact (its critical value is the upper alpha/2
// point, and a pool expected below one cell fails by its Poisson tail at alpha/2).
SampledReport sample_against_exact(Model& model, const DecodeState& base,
                                   const SequenceDistribution& exact, const SampledCase& c,
                                   double alpha);
// Prints one line per case: its statistics, critical values and acceptance.
void print_report(const std::string& what, const SampledReport& report);

// The invariant on one model, from `prompt`, with `sampler` (small support: see above), 4
// positions, `draws` seeded turns per case:
//   - TrunkDrafter (temperature x3) at depths 1, 2 and 3, and the model's MTP head at depth 3,
//     must pass every statistic, each at alpha = 1e-3 / (the number of statistics, 28): a
//     correct decoder fails the test with probability at most 0.1% for a fresh seed set
//     (Bonferroni; up to the chi-square approximation, which Cochran's pooling keeps sound);
//   - the trunk drafter must be accepted and rejected at every depth (both branches run);
//   - the misreporting TrunkDrafter at depth 3 (a biased acceptance rule) must fail at least one
//     statistic: the test has the power to see a wrong rule with this many draws.
// Returns the biased case's worst statistic over its critical value (printed with the rest).
double expect_sampled_mtp_has_the_autoregressive_distribution(Model& model,
                                                              std::span<const TokenId> prompt,
                                                              const SamplerConfig& sampler,
                                                              std::int64_t draws,
                                                              const std::string& what);

}  // namespace fs::test
