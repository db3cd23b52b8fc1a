#include "mtp_distribution.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

namespace fs::test {

namespace {

void walk(Model& model, const DecodeState& s, const SamplerConfig& sampler,
          const TokenCounts& counts, std::vector<TokenId>& prefix, double mass,
          SequenceDistribution& out) {
  const auto d = target_distribution(apply_penalties(s.host_logits(), counts, sampler), sampler);
  for (std::size_t i = 0; i < d.ids.size(); ++i) {
    const TokenId x = d.ids[i];
    const double m = mass * d.probs[i];
    prefix.push_back(x);
    if (static_cast<int>(prefix.size()) == out.positions) {
      out.p[prefix] += m;
    } else {
      DecodeState next = s.clone();
      const TokenId in[1] = {x};
      const Status st = extend(model, next, in);
      EXPECT_TRUE(st.ok()) << st.to_string();
      ++out.forwards;
      // A copy: a count taken back to 0 would leave an entry that a repetition penalty reaches.
      TokenCounts next_counts = counts;
      ++next_counts[x];
      walk(model, next, sampler, next_counts, prefix, m, out);
    }
    prefix.pop_back();
  }
}

}  // namespace

SequenceDistribution exact_sequences(Model& model, const DecodeState& base,
                                     const SamplerConfig& sampler, int positions) {
  SequenceDistribution out;
  out.positions = positions;
  // The counts a turn starts from (sampler.h TokenCounts): the context's tokens at 0 under a
  // repetition penalty.
  TokenCounts counts;
  if (sampler.repetition_penalty != 1.0)
    for (const TokenId t : base.tokens) counts.try_emplace(t, 0);
  std::vector<TokenId> prefix;
  walk(model, base, sampler, counts, prefix, 1.0, out);
  return out;
}

double SampledReport::worst_ratio() const {
  double worst = 0;
  for (const auto& s : stats) worst = std::max(worst, s.chi.statistic / s.critical);
  return worst;
}

SampledReport sample_against_exact(Model& model, const DecodeState& base,
                                   const SequenceDistribution& exact, const SampledCase& c,
                                   double alpha) {
  SampledReport report;
  const int positions = exact.positions;
  std::vector<std::vector<TokenId>> seen;
  seen.reserve(static_cast<std::size_t>(c.draws));
  for (std::int64_t i = 0; i < c.draws; ++i) {
    GenerateOptions opt;
    opt.max_tokens = positions;
    opt.mtp_depth = c.depth;
    opt.sampler = c.sampler;
    opt.seed = c.first_seed + static_cast<std::uint64_t>(i);
    opt.drafter = c.drafter;
    DecodeState s = base.clone();
    const auto r = generate(model, s, opt);
    EXPECT_TRUE(r.error.ok()) << r.error.to_string();
    EXPECT_TRUE(r.state_complete);
    if (!r.error.ok() || static_cast<int>(r.tokens.size()) != positions) {
      ADD_FAILURE() << "turn " << i << " emitted " << r.tokens.size() << " tokens";
      return report;
    }
    for (int d = 0; d < kMaxMtpDepth; ++d) {
      report.drafted[static_cast<std::size_t>(d)] += r.stats.drafted[static_cast<std::size_t>(d)];
      report.accepted[static_cast<std::size_t>(d)] += r.stats.accepted[static_cast<std::size_t>(d)];
    }
    seen.push_back(r.tokens);
  }
  // Cells: one position's token, or the tokens of two neighbouring positions.
  const auto test = [&](int first, int width) {
    std::map<std::vector<TokenId>, std::pair<double, std::int64_t>> cells;
    const auto key = [&](const std::vector<TokenId>& seq) {
      return std::vector<TokenId>(seq.begin() + first, seq.begin() + first + width);
    };
    for (const auto& [seq, p] : exact.p) cells[key(seq)].first += p;
    for (const auto& seq : seen) ++cells[key(seq)].second;
    std::vector<double> p;
    std::vector<std::int64_t> observed;
    for (const auto& [k, v] : cells) {
      p.push_back(v.first);
      observed.push_back(v.second);
    }
    DistributionStat stat;
    for (int k = first; k < first + width; ++k)
      stat.cells += (stat.cells.empty() ? "t" : ",t") + std::to_string(k + 1);
    // A statistic fails by its value or by its pool's Poisson tail: alpha split between them.
    stat.chi = chi_square(observed, p, c.draws, alpha / 2);
    stat.critical = chi_square_critical(stat.chi.df, alpha / 2);
    report.stats.push_back(stat);
  };
  for (int k = 0; k < positions; ++k) test(k, 1);
  for (int k = 0; k + 1 < positions; ++k) test(k, 2);
  return report;
}

void print_report(const std::string& what, const SampledReport& report) {
  std::printf("%s:", what.c_str());
  for (const auto& s : report.stats)
    std::printf(" %s %.1f/%d(<%.1f)", s.cells.c_str(), s.chi.statistic, s.chi.df, s.critical);
  std::printf("; accepted/drafted");
  for (int d = 0; d < kMaxMtpDepth; ++d) {
    if (report.drafted[static_cast<std::size_t>(d)] == 0) break;
    std::printf(" %lld/%lld", static_cast<long long>(report.accepted[static_cast<std::size_t>(d)]),
                static_cast<long long>(report.drafted[static_cast<std::size_t>(d)]));
  }
  std::printf("\n");
}

double expect_sampled_mtp_has_the_autoregressive_distribution(Model& model,
                                                              std::span<const TokenId> prompt,
                                                              const SamplerConfig& sampler,
                                                              std::int64_t draws,
                                                              const std::string& what) {
  constexpr int kPositions = 4;  // a depth-3 round and the token after it
  const DecodeState base = prefill(model, prompt);
  const auto exact = exact_sequences(model, base, sampler, kPositions);
  std::printf("%s: %zu sequences of %d tokens (%lld forwards to enumerate them)\n", what.c_str(),
              exact.p.size(), kPositions, static_cast<long long>(exact.forwards));
  TrunkDrafter near(model, {.temperature_factor = 3.0}),
      biased(model, {.temperature_factor = 3.0, .misreport_q = true});
  struct Case {
    std::string name;
    Drafter* drafter;  // null: the MTP head
    int depth;
  };
  const std::vector<Case> honest = {
      {"trunk drafter, depth 1", &near, 1},
      {"trunk drafter, depth 2", &near, 2},
      {"trunk drafter, depth 3", &near, 3},
      {"MTP head, depth 3", nullptr, 3},
  };
  // Per case: every position and every pair of neighbours.
  const int stats_per_case = kPositions + kPositions - 1;
  const double alpha = 1e-3 / static_cast<double>(stats_per_case * honest.size());
  std::uint64_t seed = 1;
  for (const auto& c : honest) {
    const auto report = sample_against_exact(model, base, exact,
                                             {.sampler = sampler,
                                              .depth = c.depth,
                                              .draws = draws,
                                              .first_seed = seed,
                                              .drafter = c.drafter},
                                             alpha);
    seed += static_cast<std::uint64_t>(draws);
    print_report(what + ", " + c.name, report);
    for (const auto& s : report.stats) {
      EXPECT_TRUE(s.passes()) << what << ", " << c.name << ": " << s.cells << " chi2 "
                              << s.chi.statistic << " df " << s.chi.df << " >= " << s.critical;
    }
    if (c.drafter != &near) continue;
    for (int d = 0; d < c.depth; ++d) {
      const auto i = static_cast<std::size_t>(d);
      EXPECT_GT(report.accepted[i], 0) << what << ", " << c.name << ": none accepted at " << d + 1;
      EXPECT_LT(report.accepted[i], report.drafted[i])
          << what << ", " << c.name << ": none rejected at " << d + 1;
    }
  }
  const auto wrong = sample_against_exact(
      model, base, exact,
      {.sampler = sampler, .depth = 3, .draws = draws, .first_seed = seed, .drafter = &biased},
      alpha);
  print_report(what + ", biased acceptance (misreported q), depth 3", wrong);
  EXPECT_GT(wrong.worst_ratio(), 1.0) << what << ": the test did not see a biased acceptance rule";
  return wrong.worst_ratio();
}

}  // namespace fs::test
