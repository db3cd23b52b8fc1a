// Philox known answers, and the sampler's filters, penalties, residual and draw.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "backend/backend.h"
#include "decode/penalties.h"
#include "decode/philox.h"
#include "decode/sampler.h"
#include "sampler_reference.h"

namespace fs {
namespace {

TEST(Philox, KnownAnswers) {
  // Known-answer vectors of Philox4x32-10 published with the Random123 library.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, StreamIsReproducibleAndUniform) {
  Rng a(42), b(42), c(43);
  double sum = 0;
  int differ = 0;
  for (int i = 0; i < 20000; ++i) {
    const double u = a.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u, b.uniform());
    differ += u != c.uniform();
    sum += u;
  }
  EXPECT_EQ(a.draws(), 20000u);
  EXPECT_GT(differ, 19990);
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

TEST(Sampler, ArgmaxTiesGoToLowestId) {
  const std::vector<float> l = {0.5f, 2.0f, 1.0f, 2.0f};
  EXPECT_EQ(argmax(l), 1);
  SamplerConfig greedy;
  const auto d = target_distribution(l, greedy);
  ASSERT_EQ(d.ids.size(), 1u);
  EXPECT_EQ(d.ids[0], 1);
}

TEST(Sampler, TemperatureSoftmax) {
  const std::vector<float> l = {0.0f, std::log(3.0f)};
  SamplerConfig c;
  c.temperature = 1.0;
  const auto d = target_distribution(l, c);
  EXPECT_NEAR(d.prob(0), 0.25, 1e-6);
  EXPECT_NEAR(d.prob(1), 0.75, 1e-6);
  c.temperature = 0.5;  // p ~ 1 : 9
  const auto d2 = target_distribution(l, c);
  EXPECT_NEAR(d2.prob(1), 0.9, 1e-6);
}

TEST(Sampler, TopKTopPMinPKeepTheShortestPrefix) {
  // probs 0.4, 0.3, 0.2, 0.1 at T=1 (ids 3, 0, 2, 1)
  const std::vector<float> l = {std::log(0.3f), std::log(0.1f), std::log(0.2f), std::log(0.4f)};
  SamplerConfig c;
  c.temperature = 1.0;
  c.top_k = 3;
  EXPECT_EQ(target_distribution(l, c).ids, (std::vector<TokenId>{0, 2, 3}));
  c.top_k = 0;
  c.top_p = 0.7;  // mass before id 0 is 0.4 < 0.7: kept; before id 2 is 0.7: dropped
  auto d = target_distribution(l, c);
  EXPECT_EQ(d.ids, (std::vector<TokenId>{0, 3}));
  EXPECT_NEAR(d.prob(3), 0.4 / 0.7, 1e-6);
  c.top_p = 1.0;
  c.min_p = 0.45;  // keep p >= 0.18
  EXPECT_EQ(target_distribution(l, c).ids, (std::vector<TokenId>{0, 2, 3}));
  c.top_k = 1;  // intersection with top-1
  EXPECT_EQ(target_distribution(l, c).ids, (std::vector<TokenId>{3}));
}

TEST(Sampler, PenaltiesFollowTheOpenAiFormula) {
  const std::vector<float> l = {1.0f, 1.0f, 1.0f};
  SamplerConfig c;
  c.presence_penalty = 0.5;
  c.frequency_penalty = 0.25;
  const auto p = apply_penalties(l, {{1, 2}, {2, 1}}, c);
  EXPECT_FLOAT_EQ(p[0], 1.0f);
  EXPECT_FLOAT_EQ(p[1], 1.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(p[2], 1.0f - 0.25f - 0.5f);
  c.presence_penalty = 3;
  EXPECT_FALSE(c.validate().ok());
}

// HF's RepetitionPenaltyLogitsProcessor (and vLLM's): every token of the prompt and the
// completion (count-0 entries are the prompt's), positive logits divided, others multiplied,
// before the presence and frequency penalties of the completion's tokens (vLLM's order).
TEST(Sampler, RepetitionPenaltyCoversThePromptAndScalesBySign) {
  const std::vector<float> l = {2.0f, -1.5f, 0.5f, 3.0f, -0.25f};
  SamplerConfig c;
  c.repetition_penalty = 1.5;
  c.presence_penalty = 0.5;
  c.frequency_penalty = 0.25;
  // 0 and 1 in the prompt only, 2 generated once, 4 generated twice; 3 unseen.
  const TokenCounts counts{{0, 0}, {1, 0}, {2, 1}, {4, 2}};
  const auto p = apply_penalties(l, counts, c);
  EXPECT_EQ(p[0], 2.0f / 1.5f);
  EXPECT_EQ(p[1], -1.5f * 1.5f);
  EXPECT_EQ(p[2], 0.5f / 1.5f - (0.25f + 0.5f));
  EXPECT_EQ(p[3], 3.0f);
  EXPECT_EQ(p[4], -0.25f * 1.5f - (0.5f + 0.5f));
  // Without it, the prompt's entries change nothing and name no entry for a backend.
  c.repetition_penalty = 1.0;
  EXPECT_FALSE(token_penalty(0, 0, 0, c).has_value());
  const auto q = apply_penalties(l, counts, c);
  EXPECT_EQ(q[0], 2.0f);
  EXPECT_EQ(q[1], -1.5f);
  EXPECT_EQ(q[2], 0.5f - 0.75f);
  // Only the repetition penalty: a prompt token is an entry.
  c.presence_penalty = c.frequency_penalty = 0;
  EXPECT_FALSE(c.has_penalties());
  c.repetition_penalty = 1.2;
  EXPECT_TRUE(c.has_penalties());
  const auto e = token_penalty(3, 7, 0, c);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->row, 3);
  EXPECT_EQ(e->col, 7);
  EXPECT_EQ(e->repetition, 1.2f);
  EXPECT_EQ(e->amount, 0.0f);
  for (const double bad : {0.0, -1.0, 2.5})
    EXPECT_FALSE((SamplerConfig{.repetition_penalty = bad}).validate().ok()) << bad;
  EXPECT_TRUE((SamplerConfig{.repetition_penalty = 2.0}).validate().ok());
}

// The turn's entries, kept one emitted token at a time, against the counts they stand for: for
// random contexts, completions and verify windows (drafts repeating, ids past a narrow row), row
// r of append_rows is token_penalty over a copy of the counts with the drafts before r added, as
// a set (none without penalties); apply() is apply_penalties over the counts.
TEST(Sampler, TurnPenaltiesAreTheEntriesOfTheirCounts) {
  std::mt19937 rng(7);
  const auto key = [](const EntryPenalty& e) {
    return std::tuple(e.row, e.col, std::bit_cast<std::uint32_t>(e.repetition),
                      std::bit_cast<std::uint32_t>(e.amount));
  };
  int cases = 0, narrow = 0, drafted_before = 0;
  for (const double repetition : {1.0, 1.05, 0.8})
    for (const double presence : {0.0, 0.6})
      for (const double frequency : {0.0, -0.3})
        for (int trial = 0; trial < 6; ++trial) {
          SamplerConfig c;
          c.temperature = 0.7;
          c.repetition_penalty = repetition;
          c.presence_penalty = presence;
          c.frequency_penalty = frequency;
          const TokenId vocab = 40;
          std::uniform_int_distribution<TokenId> id(0, vocab - 1);
          std::vector<TokenId> context(static_cast<std::size_t>(trial * 7));
          for (auto& t : context) t = id(rng);
          if (trial % 2 == 1) context.push_back(-1);  // not a row's id: never an entry
          TurnPenalties turn(c, context);
          TokenCounts counts;  // the counts as the sampler defines them
          if (repetition != 1.0)
            for (const TokenId t : context) counts.try_emplace(t, 0);
          std::vector<float> row(static_cast<std::size_t>(vocab));
          for (auto& v : row) v = std::normal_distribution<float>(0.0f, 2.0f)(rng);
          for (int step = 0; step < 12; ++step) {
            const auto a = turn.apply(row), b = apply_penalties(row, counts, c);
            ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
            // A verify of up to four rows; a narrow row leaves out the ids past it.
            std::vector<TokenId> drafts(static_cast<std::size_t>(step % 4));
            for (auto& t : drafts) t = id(rng) % 6;  // repeats, and ids the counts hold
            if (step % 5 == 4 && !drafts.empty()) drafts.back() = 30;  // past a narrow row
            const auto rows = static_cast<std::int64_t>(drafts.size()) + 1;
            const std::int64_t cols = step % 3 == 2 ? 25 : vocab;
            narrow += cols < vocab;
            drafted_before += !drafts.empty();
            std::vector<EntryPenalty> got;
            turn.append_rows(rows, drafts, cols, got);
            std::vector<EntryPenalty> want;
            TokenCounts row_counts = counts;
            for (std::int64_t r = 0; r < rows; ++r) {
              if (r > 0) ++row_counts[drafts[static_cast<std::size_t>(r - 1)]];
              for (const auto& [t, n] : row_counts) {
                if (t < 0 || t >= cols || !c.has_penalties()) continue;
                if (const auto e = token_penalty(static_cast<std::int32_t>(r), t, n, c))
                  want.push_back(*e);
              }
            }
            std::vector<std::tuple<std::int32_t, std::int32_t, std::uint32_t, std::uint32_t>> g, w;
            for (const auto& e : got) g.push_back(key(e));
            for (const auto& e : want) w.push_back(key(e));
            std::sort(g.begin(), g.end());
            std::sort(w.begin(), w.end());
            ASSERT_EQ(g, w) << "repetition " << repetition << " presence " << presence
                            << " frequency " << frequency << " trial " << trial << " step " << step;
            ++cases;
            const TokenId emitted = id(rng) % 10;
            turn.count(emitted);
            ++counts[emitted];
          }
        }
  EXPECT_GT(narrow, 50);
  EXPECT_GT(drafted_before, 150);
  std::printf("%d verify windows compared (%d narrow, %d with drafts)\n", cases, narrow,
              drafted_before);
  // No penalties: no entries, and the row unchanged.
  TurnPenalties none(SamplerConfig{}, std::vector<TokenId>{1, 2, 3});
  none.count(2);
  std::vector<EntryPenalty> out;
  none.append_rows(3, std::vector<TokenId>{2, 2}, 10, out);
  EXPECT_TRUE(out.empty());
}

TEST(Sampler, ResidualAndDraw) {
  TokenDistribution p{{0, 1, 2}, {0.5, 0.3, 0.2}};
  TokenDistribution q{{0, 1}, {0.8, 0.2}};
  const auto r = residual_distribution(p, q);  // max(p-q,0) = {0, 0.1, 0.2} -> {1/3, 2/3}
  EXPECT_EQ(r.ids, (std::vector<TokenId>{1, 2}));
  EXPECT_NEAR(r.prob(1), 1.0 / 3, 1e-12);
  EXPECT_EQ(residual_distribution(p, p).ids, p.ids);  // no mass: fall back to p
  EXPECT_EQ(sample_with(p, 0.0), 0);
  EXPECT_EQ(sample_with(p, 0.49), 0);
  EXPECT_EQ(sample_with(p, 0.51), 1);
  EXPECT_EQ(sample_with(p, 0.999999), 2);
}

// The residual's walk along q gives what q.prob gives id by id, bit for bit: distributions whose
// ids interleave (ids in p only, in q only, in both; q past p's last id and before its first).
TEST(Sampler, TheResidualIsMaxOfPMinusQRenormalisedOnEveryIdLayout) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<double> mass(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    TokenDistribution p, q;
    for (TokenId id = 0; id < 400; ++id) {
      const int where = static_cast<int>(rng() % 4);  // 0 neither, 1 p, 2 q, 3 both
      if (where & 1) {
        p.ids.push_back(id);
        p.probs.push_back(mass(rng));
      }
      if ((where & 2) && !(trial % 7 == 0 && id > 300)) {
        q.ids.push_back(id + (trial % 5 == 0 ? 100 : 0));
        q.probs.push_back(mass(rng));
      }
    }
    if (p.ids.empty()) continue;
    std::vector<TokenId> ids;
    std::vector<double> probs;
    double total = 0;
    for (std::size_t i = 0; i < p.ids.size(); ++i) {
      const double v = p.probs[i] - q.prob(p.ids[i]);
      if (v > 0) {
        ids.push_back(p.ids[i]);
        probs.push_back(v);
        total += v;
      }
    }
    const auto r = residual_distribution(p, q);
    if (!(total > 0)) {
      EXPECT_EQ(r.ids, p.ids);
      continue;
    }
    for (auto& v : probs) v /= total;
    ASSERT_EQ(r.ids, ids) << "trial " << trial;
    ASSERT_EQ(r.probs, probs) << "trial " << trial;
  }
}

TEST(Sampler, SelectingTheTopRanksEqualsSortingTheVocabulary) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int cases = 0, wide = 0;
  for (const std::size_t n : {1u, 7u, 300u, 5000u, 40000u}) {
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<float> l(n);
      const float spread = trial % 3 == 0 ? 0.2f : trial % 3 == 1 ? 3.0f : 12.0f;
      for (auto& v : l) v = normal(rng) * spread;
      // Ties: a row whose logits take few distinct values, ranked by id among equals.
      if (trial % 4 == 3)
        for (auto& v : l) v = std::round(v);
      for (const double t : {0.05, 0.7, 1.0, 3.0}) {
        for (const std::int64_t top_k : {0, 1, 40, 1000}) {
          for (const double top_p : {1.0, 0.5, 0.95, 0.999}) {
            for (const double min_p : {0.0, 0.05}) {
              SamplerConfig c;
              c.temperature = t;
              c.top_k = top_k;
              c.top_p = top_p;
              c.min_p = min_p;
              const auto want = test::full_sort_distribution(l, c);
              const auto got = target_distribution(l, c);
              ASSERT_EQ(got.ids, want.ids) << "n " << n << " T " << t << " k " << top_k << " p "
                                           << top_p << " min_p " << min_p;
              ASSERT_EQ(got.probs, want.probs);
              ++cases;
              wide += got.ids.size() > 256;  // kept sets past the first selection rounds
            }
          }
        }
      }
    }
  }
  EXPECT_GT(wide, 100);
  std::printf("%d configurations, %d keeping more than 256 ids\n", cases, wide);
}

// Backend::sample_rows on the CPU draws what the host sampler draws from the whole row with the
// same uniform (sample_with of target_distribution with no prefix rule), bit for bit: rows of
// several widths and spreads, ties, ids with no mass (-inf), uniforms at 0 and just below 1.
TEST(Sampler, ADrawOnTheBackendIsTheHostSamplersDraw) {
  auto be = make_cpu_backend();
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int draws = 0;
  for (const std::size_t n : {1u, 7u, 300u, 5000u, 40000u}) {
    for (int trial = 0; trial < 4; ++trial) {
      const float spread = trial % 2 == 0 ? 0.5f : 8.0f;
      std::vector<float> l(2 * n);  // two rows
      for (auto& v : l) v = normal(rng) * spread;
      if (trial == 2)
        for (auto& v : l) v = std::round(v);
      if (trial == 3 && n > 1)
        for (std::size_t i = 0; i < l.size(); i += 3) l[i] = -INFINITY;
      const Tensor rows({2, static_cast<std::int64_t>(n)}, l);
      for (const double t : {0.05, 0.7, 1.5}) {
        std::vector<double> us = {0.0, 1.0 - 1e-16, 0.5};
        for (int i = 0; i < 8; ++i) us.push_back(uniform(rng));
        for (const double u0 : us) {
          const double u[2] = {u0, 1.0 - u0 * 0.999};
          Tensor ids;
          be->sample_rows(rows, t, u, ids);
          ASSERT_TRUE(be->status().ok()) << be->status().to_string();
          SamplerConfig c;
          c.temperature = t;
          // And token_probs of the drawn ids and of id 0 (which may have no mass): the host
          // distribution's prob, bit for bit.
          const std::int32_t picked[2] = {ids.data_as<std::int32_t>()[0],
                                          ids.data_as<std::int32_t>()[1]};
          const std::int32_t zero[2] = {0, 0};
          Tensor p_picked, p_zero;
          be->token_probs(rows, t, picked, p_picked);
          be->token_probs(rows, t, zero, p_zero);
          ASSERT_TRUE(be->status().ok()) << be->status().to_string();
          for (int r = 0; r < 2; ++r) {
            const std::span<const float> row(l.data() + r * n, n);
            const auto d = target_distribution(row, c);
            EXPECT_EQ(picked[r], sample_with(d, u[r]))
                << "n " << n << " trial " << trial << " T " << t << " u " << u[r];
            EXPECT_EQ(std::bit_cast<double>(p_picked.data_as<std::int64_t>()[r]),
                      d.prob(picked[r]));
            EXPECT_EQ(std::bit_cast<double>(p_zero.data_as<std::int64_t>()[r]), d.prob(0));
            ++draws;
          }
        }
      }
    }
  }
  std::printf("%d draws\n", draws);
}

// Backend::sample_residual_rows on the CPU draws what the host draws for a rejected MTP draft
// (sample_with of residual_distribution of the two rows' target distributions, no prefix rule),
// bit for bit: q as wide as p and narrower (a draft vocabulary), ids with no mass in either, q
// equal to p (no residual mass: a draw from p), uniforms at 0 and just below 1.
TEST(Sampler, AResidualDrawOnTheBackendIsTheHostsCorrection) {
  auto be = make_cpu_backend();
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int draws = 0, from_p = 0;
  for (const std::size_t n : {1u, 9u, 300u, 40000u}) {
    for (int trial = 0; trial < 4; ++trial) {
      // trial 1: q narrower than p; 2: q equals p; 3: a third of the ids at -inf in each.
      const std::size_t nq = trial == 1 && n > 1 ? n / 2 + 1 : n;
      std::vector<float> p(n), q(nq);
      for (auto& v : p) v = normal(rng) * 3.0f;
      for (std::size_t i = 0; i < nq; ++i) q[i] = trial == 2 ? p[i] : p[i] + normal(rng);
      if (trial == 3 && n > 1) {
        for (std::size_t i = 0; i < n; i += 3) p[i] = -INFINITY;
        for (std::size_t i = 1; i < nq; i += 3) q[i] = -INFINITY;
      }
      const Tensor pt({1, static_cast<std::int64_t>(n)}, p),
          qt({1, static_cast<std::int64_t>(nq)}, q);
      for (const double t : {0.05, 0.7, 1.5}) {
        SamplerConfig c;
        c.temperature = t;
        const auto residual =
            residual_distribution(target_distribution(p, c), target_distribution(q, c));
        std::vector<double> us = {0.0, 1.0 - 1e-16, 0.5};
        for (int i = 0; i < 6; ++i) us.push_back(uniform(rng));
        for (const double u : us) {
          Tensor ids;
          be->sample_residual_rows(pt, qt, t, {&u, 1}, ids);
          ASSERT_TRUE(be->status().ok()) << be->status().to_string();
          EXPECT_EQ(ids.data_as<std::int32_t>()[0], sample_with(residual, u))
              << "n " << n << " trial " << trial << " T " << t << " u " << u;
          ++draws;
        }
        from_p += trial == 2 ? 1 : 0;
      }
    }
  }
  EXPECT_GT(from_p, 0);
  // Rows in pairs: a q wider than p, or a row count that differs, is refused.
  Tensor ids;
  const double u = 0.5;
  be->sample_residual_rows(Tensor(Shape{1, 4}), Tensor(Shape{1, 5}), 1.0, {&u, 1}, ids);
  EXPECT_FALSE(be->status().ok());
  be->clear_status();
  be->sample_residual_rows(Tensor(Shape{2, 4}), Tensor(Shape{1, 4}), 1.0, {&u, 1}, ids);
  EXPECT_FALSE(be->status().ok());
  be->clear_status();
  std::printf("%d draws\n", draws);
}

// The top N of a row (Backend::topk's order) and the row's softmax denominator
// (Backend::softmax_denominators on the CPU) give target_distribution of the whole row bit for
// bit whenever the prefix rules decide inside the top, and ask for the row otherwise.
TEST(Sampler, TheTopOfARowGivesItsDistributionOrAsksForTheRow) {
  constexpr std::size_t kTop = 256;
  auto be = make_cpu_backend();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int from_top = 0, asked = 0;
  for (const std::size_t n : {7u, 300u, 5000u, 40000u}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> l(n);
      const float spread = trial % 3 == 0 ? 0.2f : trial % 3 == 1 ? 3.0f : 12.0f;
      for (auto& v : l) v = normal(rng) * spread;
      if (trial % 4 == 3)
        for (auto& v : l) v = std::round(v);  // ties, ranked by id
      std::vector<TokenId> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
        return l[static_cast<std::size_t>(a)] > l[static_cast<std::size_t>(b)];
      });
      const std::size_t m = std::min(kTop, n);
      std::vector<TokenId> ids(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m));
      std::vector<float> top(m);
      for (std::size_t k = 0; k < m; ++k) top[k] = l[static_cast<std::size_t>(ids[k])];
      const Tensor row({1, static_cast<std::int64_t>(n)}, l);
      for (const double t : {0.05, 0.7, 1.0, 3.0}) {
        Tensor totals;
        be->softmax_denominators(row, t, totals);
        ASSERT_TRUE(be->status().ok()) << be->status().to_string();
        const RankedTop ranked{ids, top, std::bit_cast<double>(totals.data_as<std::int64_t>()[0]),
                               n};
        for (const std::int64_t top_k : {0, 1, 40, 1000}) {
          for (const double top_p : {1.0, 0.5, 0.95, 0.999}) {
            for (const double min_p : {0.0, 0.05}) {
              SamplerConfig c;
              c.temperature = t;
              c.top_k = static_cast<std::int32_t>(top_k);
              c.top_p = top_p;
              c.min_p = min_p;
              const auto want = target_distribution(l, c);
              const auto got = target_distribution_from_top(ranked, c);
              if (!got) {
                // Only a rule that keeps every token, or a kept set that reaches the top's end.
                const bool rule = top_k > 0 || top_p < 1.0 || min_p > 0.0;
                EXPECT_TRUE(!rule || want.ids.size() >= m)
                    << "n " << n << " T " << t << " k " << top_k << " p " << top_p;
                ++asked;
                continue;
              }
              ASSERT_EQ(got->ids, want.ids) << "n " << n << " T " << t << " k " << top_k << " p "
                                            << top_p << " min_p " << min_p;
              ASSERT_EQ(got->probs, want.probs);
              ++from_top;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(from_top, 500);
  EXPECT_GT(asked, 100);
  std::printf("%d configurations from the top, %d asked for the row\n", from_top, asked);
}

}  // namespace
}  // namespace fs
