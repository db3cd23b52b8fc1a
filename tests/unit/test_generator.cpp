// The decoder on the toy model: greedy MTP emits exactly the autoregressive tokens; every exit
// path, at every depth, greedy and sampled, leaves a state equal to the cold prefill of its key
// with the final commit run exactly once; sampled MTP has the autoregressive distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "chi_square.h"
#include "decode/generator.h"
#include "toy_model.h"

namespace fs {
namespace {

using test::chi_square;
using test::chi_square_critical;
using test::ToyConfig;
using test::ToyModel;

std::vector<TokenId> make_prompt(std::uint32_t seed, std::size_t length, std::int64_t vocab) {
  std::vector<TokenId> p;
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < length; ++i) {
    x = x * 1664525u + 1013904223u;
    p.push_back(static_cast<TokenId>((x >> 16) % static_cast<std::uint32_t>(vocab)));
  }
  return p;
}

DecodeState prefill(Model& model, std::span<const TokenId> tokens, std::int64_t chunk = 0) {
  DecodeState s = new_decode_state(model);
  const Status st = extend(model, s, tokens, chunk);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return s;
}

// The warm state must equal the cold prefill of its key, and continue identically.
void expect_equals_cold(Model& model, const DecodeState& warm) {
  ASSERT_TRUE(warm.check_invariant().ok()) << warm.check_invariant().to_string();
  DecodeState cold = prefill(model, warm.tokens);
  EXPECT_EQ(max_difference(compare_states(*warm.trunk, *cold.trunk)), 0.0);
  if (warm.mtp_history) {
    EXPECT_EQ(max_difference(compare_states(*warm.mtp_history, *cold.mtp_history)), 0.0);
  }
  EXPECT_EQ(warm.next_logits, cold.next_logits);
  EXPECT_EQ(warm.last_hidden, cold.last_hidden);
  // The next turn: two more tokens through both.
  DecodeState w = warm.clone();
  const std::vector<TokenId> more = {3, 5};
  ASSERT_TRUE(extend(model, w, more).ok());
  ASSERT_TRUE(extend(model, cold, more).ok());
  EXPECT_EQ(w.next_logits, cold.next_logits);
}

GenerateResult run(Model& model, std::span<const TokenId> prompt, GenerateOptions opt,
                   DecodeState* out = nullptr) {
  DecodeState s = prefill(model, prompt);
  auto r = generate(model, s, opt);
  if (out) *out = std::move(s);
  return r;
}

TEST(Generator, PrefillIsSplitInvariant) {
  ToyModel model;
  const auto prompt = make_prompt(1, 23, model.info().vocab_size);
  const DecodeState one = prefill(model, prompt);
  for (std::int64_t chunk : {1, 2, 5, 22}) {
    const DecodeState split = prefill(model, prompt, chunk);
    EXPECT_EQ(max_difference(compare_states(*one.trunk, *split.trunk)), 0.0);
    EXPECT_EQ(max_difference(compare_states(*one.mtp_history, *split.mtp_history)), 0.0);
    EXPECT_EQ(one.next_logits, split.next_logits);
  }
  EXPECT_EQ(one.mtp_history->covered_tokens().value(), 22);
}

TEST(Generator, GreedyMtpEmitsTheAutoregressiveTokens) {
  ToyModel model;
  int compared = 0;
  for (std::uint32_t seed = 0; seed < 12; ++seed) {
    const auto prompt = make_prompt(seed, 3 + seed % 9, model.info().vocab_size);
    for (std::int64_t max_tokens : {1, 2, 7, 30, 64}) {
      GenerateOptions opt;
      opt.max_tokens = max_tokens;
      const auto ar = run(model, prompt, opt);
      ASSERT_TRUE(ar.error.ok());
      ASSERT_EQ(static_cast<std::int64_t>(ar.tokens.size()), max_tokens);
      for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
        opt.mtp_depth = depth;
        DecodeState state;
        const auto mtp = run(model, prompt, opt, &state);
        ASSERT_TRUE(mtp.error.ok()) << mtp.error.to_string();
        EXPECT_EQ(mtp.tokens, ar.tokens)
            << "seed " << seed << " depth " << depth << " max " << max_tokens;
        EXPECT_TRUE(mtp.state_complete);
        EXPECT_EQ(mtp.stats.final_commits, 1);
        expect_equals_cold(model, state);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 12 * 5 * 3);
}

TEST(Generator, MtpAcceptsOnTheToyModel) {
  // The toy head predicts the trunk's next hidden, so acceptance is well above zero.
  ToyModel model;
  GenerateOptions opt;
  opt.max_tokens = 200;
  opt.mtp_depth = 3;
  const auto r = run(model, make_prompt(3, 8, model.info().vocab_size), opt);
  ASSERT_TRUE(r.error.ok());
  EXPECT_GT(r.stats.drafted[0], 10);
  EXPECT_GT(r.stats.accepted[0], r.stats.drafted[0] / 10);
  EXPECT_LT(r.stats.rounds, 200);
}

// Drafts that follow the model's own greedy continuation (full acceptance in greedy mode),
// optionally corrupted at one depth (a rejection there).
ScriptedDrafter oracle_drafter(ToyModel& model, int wrong_at) {
  return ScriptedDrafter(
      [&model, wrong_at](const std::vector<TokenId>& committed, TokenId primary, int depth) {
        DecodeState s = prefill(model, committed);
        std::vector<TokenId> out;
        TokenId next = primary;
        for (int d = 0; d < depth; ++d) {
          const TokenId in[1] = {next};
          EXPECT_TRUE(extend(model, s, in).ok());
          TokenId t = argmax(s.next_logits);
          if (d == wrong_at) t = static_cast<TokenId>((t + 1) % model.info().vocab_size);
          out.push_back(t);
          next = t;
        }
        return out;
      });
}

struct PathKey {
  ExitPath path;
  bool after_full_accept;
  auto operator<=>(const PathKey&) const = default;
};

TEST(Generator, EveryExitPathCommitsExactlyOnceAndMatchesColdPrefill) {
  ToyModel model;
  const auto V = model.info().vocab_size;
  for (bool sampled : {false, true}) {
    for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
      SCOPED_TRACE((sampled ? "sampled depth " : "greedy depth ") + std::to_string(depth));
      std::set<PathKey> seen;
      int runs = 0;
      for (std::uint32_t seed = 0; seed < 3; ++seed) {
        const auto prompt = make_prompt(seed + 100, 4 + seed, V);
        for (std::int64_t max_tokens : {1, 2, 3, 4, 6, 9}) {
          for (int stop = -1; stop < V; stop += 2) {
            for (int drafter_kind = 0; drafter_kind < 5;
                 ++drafter_kind) {  // MTP, oracle, wrong at 0/1/2
              GenerateOptions opt;
              opt.max_tokens = max_tokens;
              opt.mtp_depth = depth;
              opt.seed = seed * 1000 + static_cast<std::uint64_t>(max_tokens);
              if (sampled) opt.sampler.temperature = 0.6;
              if (stop >= 0) opt.stop_tokens = {stop};
              ScriptedDrafter scripted = oracle_drafter(model, drafter_kind - 2);
              if (drafter_kind > 0) opt.drafter = &scripted;
              DecodeState state;
              const auto r = run(model, prompt, opt, &state);
              ++runs;
              ASSERT_TRUE(r.error.ok()) << r.error.to_string();
              ASSERT_EQ(r.stats.final_commits, 1);
              ASSERT_TRUE(r.state_complete) << exit_path_name(r.exit_path);
              ASSERT_EQ(state.tokens.size(), prompt.size() + r.tokens.size());
              expect_equals_cold(model, state);
              if (HasFatalFailure()) return;
              seen.insert({r.exit_path, r.exit_after_full_accept});
            }
          }
        }
      }
      // Every path this mode can take was reached.
      std::vector<PathKey> required = {
          {ExitPath::kHeadStop, false},  // a fresh or corrected primary is a stop
          {ExitPath::kHeadStop, true},   // the bonus is a stop
          {ExitPath::kHeadCap, false},   // the primary fills max_tokens
          {ExitPath::kHeadCap, true},    // the cap right after a bonus
          {ExitPath::kDraftStop, true},  // full acceptance ending in a stop
          {ExitPath::kLoopCap, true},    // full acceptance fills max_tokens exactly
      };
      // A stop inside accepted drafts with more drafts after it needs two drafts.
      if (depth >= 2) required.push_back({ExitPath::kDraftStop, false});
      if (sampled) required.push_back({ExitPath::kCorrectionStop, false});
      for (const auto& k : required) {
        EXPECT_TRUE(seen.count(k))
            << "never reached " << exit_path_name(k.path)
            << (k.after_full_accept ? " after full acceptance" : "") << " in " << runs << " runs";
      }
    }
  }
}

TEST(Generator, CancellationAndFailureNeverPublishACompleteState) {
  ToyModel model;
  const auto prompt = make_prompt(5, 6, model.info().vocab_size);
  GenerateOptions opt;
  opt.max_tokens = 20;
  opt.mtp_depth = 2;
  int polls = 0;
  opt.cancelled = [&] { return ++polls > 3; };
  const auto c = run(model, prompt, opt);
  EXPECT_EQ(c.finish_reason, FinishReason::kCancelled);
  EXPECT_FALSE(c.state_complete);
  EXPECT_EQ(c.stats.final_commits, 1);

  opt.cancelled = nullptr;
  DecodeState s = prefill(model, prompt);
  model.fail_in = 2;  // a verify forward fails mid-turn
  const auto f = generate(model, s, opt);
  EXPECT_EQ(f.finish_reason, FinishReason::kError);
  EXPECT_FALSE(f.error.ok());
  EXPECT_FALSE(f.state_complete);
  EXPECT_EQ(f.stats.final_commits, 1);
}

// A stop the caller requests after a token (a stop sequence matched on the text) ends the turn
// AT that token, on every path (a fresh primary, an accepted draft, a sampled correction): the
// token is committed, nothing after it is emitted, the finish reason is stop, and the state is
// complete and equal to the cold prefill of prompt + tokens, so it can be banked.
TEST(Generator, RequestedStopEndsTheTurnAtThatTokenWithACompleteState) {
  ToyModel model;
  const auto V = model.info().vocab_size;
  std::set<ExitPath> paths;
  for (bool sampled : {false, true}) {
    for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
      for (std::uint32_t seed = 0; seed < 4; ++seed) {
        for (std::int64_t at = 1; at <= 7; ++at) {
          SCOPED_TRACE("depth " + std::to_string(depth) + " seed " + std::to_string(seed) +
                       " stop after token " + std::to_string(at) + (sampled ? " sampled" : ""));
          const auto prompt = make_prompt(seed + 40, 5 + seed, V);
          GenerateOptions opt;
          opt.max_tokens = 12;
          opt.mtp_depth = depth;
          opt.seed = seed;
          if (sampled) opt.sampler.temperature = 0.8;
          std::int64_t seen = 0;
          opt.on_token = [&](TokenId) { ++seen; };
          opt.stop_requested = [&] { return seen >= at; };
          DecodeState state;
          const auto r = run(model, prompt, opt, &state);
          ASSERT_TRUE(r.error.ok()) << r.error.to_string();
          EXPECT_EQ(r.finish_reason, FinishReason::kStop);
          EXPECT_EQ(static_cast<std::int64_t>(r.tokens.size()), at);
          EXPECT_EQ(seen, at);
          ASSERT_TRUE(r.state_complete) << exit_path_name(r.exit_path);
          ASSERT_EQ(state.tokens.size(), prompt.size() + r.tokens.size());
          expect_equals_cold(model, state);
          if (HasFatalFailure()) return;
          paths.insert(r.exit_path);
        }
      }
    }
  }
  EXPECT_TRUE(paths.count(ExitPath::kHeadStop));
  EXPECT_TRUE(paths.count(ExitPath::kDraftStop));
  EXPECT_TRUE(paths.count(ExitPath::kCorrectionStop));
}

// finish_turn's own work, observed from outside: on every exit that leaves a pending token, the
// turn's LAST forward is finish_turn forwarding it. Make exactly that forward fail: the turn
// must end in error, never claim a complete state, and still run the final commit once. Make
// the one after it fail instead: nothing changes. (A finish_turn that ignored the forward's
// status, skipped the forward or ran twice fails one of these.)
TEST(Generator, FinishTurnForwardsThePendingTokenAndReportsItsFailure) {
  ToyModel model;
  const auto V = model.info().vocab_size;
  int pending_exits = 0;
  for (bool sampled : {false, true}) {
    for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
      for (std::uint32_t seed = 0; seed < 6; ++seed) {
        const auto prompt = make_prompt(seed + 70, 4 + seed % 3, V);
        GenerateOptions opt;
        opt.max_tokens = 1 + seed;
        opt.mtp_depth = depth;
        opt.seed = seed;
        opt.stop_tokens = {static_cast<TokenId>(seed % V)};
        if (sampled) opt.sampler.temperature = 0.9;
        DecodeState base = prefill(model, prompt);
        DecodeState ok_state = base.clone();
        const auto before = model.forwards;
        const auto ok = generate(model, ok_state, opt);
        const auto forwards = model.forwards - before;
        ASSERT_TRUE(ok.state_complete);
        ASSERT_EQ(ok.stats.final_commits, 1);
        if (!ok.exit_with_pending) continue;
        ++pending_exits;
        ASSERT_EQ(ok_state.tokens.back(), ok.tokens.back());  // the pending token is in the key

        DecodeState failed_state = base.clone();
        model.fail_in = forwards - 1;  // the last forward: finish_turn's
        const auto failed = generate(model, failed_state, opt);
        model.fail_in = -1;
        EXPECT_EQ(failed.finish_reason, FinishReason::kError);
        EXPECT_FALSE(failed.error.ok());
        EXPECT_FALSE(failed.state_complete);
        EXPECT_EQ(failed.stats.final_commits, 1);
        EXPECT_EQ(failed.tokens, ok.tokens);  // everything before the commit went the same way

        DecodeState later_state = base.clone();
        model.fail_in = forwards;  // one past the turn: never reached
        const auto later = generate(model, later_state, opt);
        model.fail_in = -1;
        EXPECT_TRUE(later.state_complete);
        EXPECT_EQ(later.tokens, ok.tokens);
        EXPECT_EQ(later_state.tokens, ok_state.tokens);
      }
    }
  }
  EXPECT_GT(pending_exits, 20);
}

TEST(Generator, StateInvariantCatchesAKeyLongerThanTheState) {
  ToyModel model;
  DecodeState s = prefill(model, make_prompt(9, 5, model.info().vocab_size));
  ASSERT_TRUE(s.check_invariant().ok());
  s.tokens.push_back(1);  // DS4Server's corruption: a key one token longer than the state
  const Status st = s.check_invariant();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("covers 5 tokens but the key has 6"), std::string::npos)
      << st.message();
}

TEST(Generator, BadOptionsAreErrors) {
  ToyModel plain(ToyConfig{.with_mtp = false});
  const auto prompt = make_prompt(1, 4, plain.info().vocab_size);
  GenerateOptions opt;
  opt.mtp_depth = 1;
  auto r = run(plain, prompt, opt);
  EXPECT_NE(r.error.message().find("MTP head"), std::string::npos);
  opt.mtp_depth = 4;
  EXPECT_FALSE(run(plain, prompt, opt).error.ok());
  opt.mtp_depth = 0;
  opt.sampler.top_p = 0;
  EXPECT_NE(run(plain, prompt, opt).error.message().find("top_p"), std::string::npos);
  DecodeState empty = new_decode_state(plain);
  opt.sampler.top_p = 1;
  EXPECT_FALSE(generate(plain, empty, opt).error.ok());
}

TEST(Generator, SameSeedSameOutput) {
  ToyModel model;
  const auto prompt = make_prompt(4, 7, model.info().vocab_size);
  GenerateOptions opt;
  opt.max_tokens = 40;
  opt.mtp_depth = 3;
  opt.sampler.temperature = 0.8;
  opt.sampler.top_p = 0.95;
  opt.seed = 1234;
  const auto a = run(model, prompt, opt);
  const auto b = run(model, prompt, opt);
  EXPECT_EQ(a.tokens, b.tokens);
  opt.seed = 1235;
  EXPECT_NE(run(model, prompt, opt).tokens, a.tokens);
}

// The counts a turn starts from: none, or the prompt's tokens at count 0 under a repetition
// penalty (sampler.h TokenCounts).
TokenCounts prompt_counts(const std::vector<TokenId>& prompt, const SamplerConfig& c) {
  TokenCounts counts;
  if (c.repetition_penalty != 1.0)
    for (const TokenId t : prompt) counts.try_emplace(t, 0);
  return counts;
}

// Exact marginal distribution of the k-th generated token under autoregressive sampling,
// by enumeration over all prefixes (penalties counted over the completion, and the repetition
// penalty over the prompt too).
std::vector<double> exact_marginal(ToyModel& model, const std::vector<TokenId>& prompt,
                                   const SamplerConfig& c, int k) {
  const auto V = static_cast<std::size_t>(model.info().vocab_size);
  std::vector<double> out(V, 0.0);
  std::function<void(DecodeState&, TokenCounts&, std::vector<TokenId>&, double)> walk =
      [&](DecodeState& s, TokenCounts& counts, std::vector<TokenId>& gen, double mass) {
        const auto d = target_distribution(apply_penalties(s.next_logits, counts, c), c);
        for (std::size_t i = 0; i < d.ids.size(); ++i) {
          const TokenId x = d.ids[i];
          const double m = mass * d.probs[i];
          if (static_cast<int>(gen.size()) == k) {
            out[static_cast<std::size_t>(x)] += m;
            continue;
          }
          DecodeState next = s.clone();
          const TokenId in[1] = {x};
          ASSERT_TRUE(extend(model, next, in).ok());
          // A copy: a count taken back to 0 would leave an entry that the repetition penalty
          // reaches.
          TokenCounts next_counts = counts;
          ++next_counts[x];
          gen.push_back(x);
          walk(next, next_counts, gen, m);
          gen.pop_back();
        }
      };
  DecodeState s = prefill(model, prompt);
  TokenCounts counts = prompt_counts(prompt, c);
  std::vector<TokenId> gen;
  walk(s, counts, gen, 1.0);
  return out;
}

// Exact joint distribution of the first two generated tokens, as a V*V table (t1 * V + t2).
std::vector<double> exact_joint_first_two(ToyModel& model, const std::vector<TokenId>& prompt,
                                          const SamplerConfig& c) {
  const auto V = static_cast<std::size_t>(model.info().vocab_size);
  std::vector<double> out(V * V, 0.0);
  DecodeState s = prefill(model, prompt);
  const TokenCounts counts = prompt_counts(prompt, c);
  const auto d1 = target_distribution(apply_penalties(s.next_logits, counts, c), c);
  for (std::size_t i = 0; i < d1.ids.size(); ++i) {
    DecodeState next = s.clone();
    const TokenId in[1] = {d1.ids[i]};
    EXPECT_TRUE(extend(model, next, in).ok());
    TokenCounts c1 = counts;
    ++c1[d1.ids[i]];
    const auto d2 = target_distribution(apply_penalties(next.next_logits, c1, c), c);
    for (std::size_t j = 0; j < d2.ids.size(); ++j)
      out[static_cast<std::size_t>(d1.ids[i]) * V + static_cast<std::size_t>(d2.ids[j])] +=
          d1.probs[i] * d2.probs[j];
  }
  return out;
}

TEST(Generator, ChiSquareCountsEveryObservation) {
  // Two rare cells (expected 2 each) hold 44 observations: their pool (expected 4) used to be
  // dropped for being under 5, so this passed; counted now, it fails, as it must.
  const std::vector<double> p = {0.498, 0.498, 0.002, 0.002};
  const auto [stat, df] = chi_square({478, 478, 22, 22}, p, 1000);
  EXPECT_GT(stat, chi_square_critical(df));
  const auto [fair, fair_df] = chi_square({497, 497, 3, 3}, p, 1000);
  EXPECT_LT(fair, chi_square_critical(fair_df));
  // A pool expected below 1 that holds many observations fails by its Poisson tail.
  const std::vector<double> q = {0.4998, 0.4998, 0.0002, 0.0002};
  EXPECT_TRUE(std::isinf(chi_square({494, 494, 6, 6}, q, 1000).statistic));  // pool expects 0.4
  EXPECT_FALSE(std::isinf(chi_square({499, 500, 1, 0}, q, 1000).statistic));
  // The critical values against the tables' upper 0.1% and 5% points.
  EXPECT_NEAR(chi_square_critical(10), 29.588, 0.3);  // Wilson-Hilferty: within 1%
  EXPECT_NEAR(chi_square_critical(30), 59.703, 0.3);
  EXPECT_NEAR(chi_square_critical(10, 0.05), 18.307, 0.05);
}

TEST(Generator, SampledMtpHasTheAutoregressiveDistribution) {
  ToyModel model(ToyConfig{.vocab = 8, .logit_scale = 1.5f});
  const auto prompt = make_prompt(11, 5, 8);
  // draft_vocab 5: the head drafts only ids 0-4 (MtpHead::set_draft_vocabulary); the emitted
  // distribution must not change. Penalties 1: presence and frequency; 2: those and a repetition
  // penalty, which reaches the prompt's tokens too.
  for (const auto& [with_penalties, draft_vocab] :
       {std::pair{0, 0}, std::pair{1, 0}, std::pair{2, 0}, std::pair{0, 5}}) {
    ASSERT_TRUE(model.mtp()->set_draft_vocabulary(draft_vocab).ok());
    SamplerConfig c;
    c.temperature = 1.0;
    c.top_p = 0.98;
    if (with_penalties > 0) {
      c.presence_penalty = 0.7;
      c.frequency_penalty = 0.3;
    }
    if (with_penalties == 2) c.repetition_penalty = 1.6;
    const int positions = 3;
    std::vector<std::vector<double>> exact;
    for (int k = 0; k < positions; ++k) exact.push_back(exact_marginal(model, prompt, c, k));
    const auto joint = exact_joint_first_two(model, prompt, c);
    const std::int64_t draws = 20000;
    for (int depth = draft_vocab > 0 ? 1 : 0; depth <= kMaxMtpDepth; ++depth) {
      std::vector<std::vector<std::int64_t>> counts(positions, std::vector<std::int64_t>(8, 0));
      std::vector<std::int64_t> pairs(64, 0);
      DecodeState base = prefill(model, prompt);
      for (std::int64_t i = 0; i < draws; ++i) {
        GenerateOptions opt;
        opt.max_tokens = 4;
        opt.mtp_depth = depth;
        opt.sampler = c;
        opt.seed =
            static_cast<std::uint64_t>(i) + 1'000'000u * static_cast<std::uint64_t>(depth + 1);
        DecodeState s = base.clone();
        const auto r = generate(model, s, opt);
        ASSERT_TRUE(r.error.ok());
        ASSERT_GE(r.tokens.size(), static_cast<std::size_t>(positions));
        for (int k = 0; k < positions; ++k)
          ++counts[static_cast<std::size_t>(k)]
                  [static_cast<std::size_t>(r.tokens[static_cast<std::size_t>(k)])];
        ++pairs[static_cast<std::size_t>(r.tokens[0] * 8 + r.tokens[1])];
      }
      for (int k = 0; k < positions; ++k) {
        const auto [stat, df] = chi_square(counts[static_cast<std::size_t>(k)],
                                           exact[static_cast<std::size_t>(k)], draws);
        const double crit = chi_square_critical(df);
        std::printf(
            "penalties %d draft vocab %d depth %d token %d: chi2 %.2f df %d (0.1%% critical "
            "%.2f)\n",
            with_penalties, draft_vocab, depth, k + 1, stat, df, crit);
        EXPECT_LT(stat, crit) << "depth " << depth << " token " << k + 1;
      }
      // Jointly: the pair (token 1, token 2) against its exact distribution, so a dependence
      // between positions that keeps each marginal right still shows.
      const auto [jstat, jdf] = chi_square(pairs, joint, draws);
      const double jcrit = chi_square_critical(jdf);
      std::printf("penalties %d depth %d tokens 1-2 jointly: chi2 %.2f df %d (critical %.2f)\n",
                  with_penalties, depth, jstat, jdf, jcrit);
      EXPECT_LT(jstat, jcrit) << "depth " << depth << " joint";
    }
  }
  ASSERT_TRUE(model.mtp()->set_draft_vocabulary(0).ok());
}

}  // namespace
}  // namespace fs

namespace fs {
namespace {

// log softmax((logits - penalties) / T) at `token`, computed from a cold prefill of the key.
double reference_logprob(Model& model, const std::vector<TokenId>& key, TokenId token,
                         const TokenCounts& counts, const SamplerConfig& sampler) {
  DecodeState s = new_decode_state(model);
  EXPECT_TRUE(extend(model, s, key).ok());
  const auto row = apply_penalties(s.next_logits, counts, sampler);
  const double t = sampler.greedy() ? 1.0 : sampler.temperature;
  double m = -INFINITY;
  for (const float l : row) m = std::max(m, static_cast<double>(l));
  double total = 0;
  for (const float l : row) total += std::exp((static_cast<double>(l) - m) / t);
  return static_cast<double>(row[static_cast<std::size_t>(token)]) / t - (m / t + std::log(total));
}

// Every emitted token is scored once, in order, before on_token, on the distribution it was drawn
// from; with MTP the verify rows give the same values as autoregressive decoding.
TEST(Generator, LogprobsScoreEachTokenOnItsDistribution) {
  ToyModel model;
  const auto prompt = make_prompt(5, 9, model.info().vocab_size);
  for (const double temperature : {0.0, 0.7}) {
    std::vector<std::vector<double>> by_depth;
    for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
      GenerateOptions opt;
      opt.max_tokens = 24;
      opt.mtp_depth = depth;
      opt.seed = 11;
      opt.sampler.temperature = temperature;
      opt.sampler.presence_penalty = 0.4;
      opt.top_logprobs = 3;
      std::vector<TokenLogprobs> scored;
      std::size_t tokens_seen = 0;
      opt.on_logprobs = [&](const TokenLogprobs& lp) {
        EXPECT_EQ(scored.size(), tokens_seen) << "scored before on_token";
        scored.push_back(lp);
      };
      opt.on_token = [&](TokenId) { ++tokens_seen; };
      const auto r = run(model, prompt, opt);
      ASSERT_TRUE(r.error.ok());
      ASSERT_EQ(scored.size(), r.tokens.size());
      std::vector<double> values;
      TokenCounts counts;
      std::vector<TokenId> key = prompt;
      for (std::size_t i = 0; i < r.tokens.size(); ++i) {
        EXPECT_EQ(scored[i].token, r.tokens[i]);
        ASSERT_EQ(scored[i].top.size(), 3u);
        EXPECT_GE(scored[i].top[0].second, scored[i].top[1].second);
        EXPECT_GE(scored[i].top[1].second, scored[i].top[2].second);
        if (temperature == 0.0) {
          EXPECT_EQ(scored[i].top[0].first, r.tokens[i]);
        }
        EXPECT_NEAR(scored[i].logprob,
                    reference_logprob(model, key, r.tokens[i], counts, opt.sampler), 1e-4)
            << "depth " << depth << " token " << i;
        values.push_back(scored[i].logprob);
        ++counts[r.tokens[i]];
        key.push_back(r.tokens[i]);
      }
      by_depth.push_back(values);
    }
    // Greedy MTP emits the autoregressive tokens, so their scores agree too.
    if (temperature != 0.0) continue;
    for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
      for (std::size_t i = 0; i < by_depth[0].size(); ++i) {
        EXPECT_NEAR(by_depth[static_cast<std::size_t>(depth)][i], by_depth[0][i], 1e-4);
      }
    }
  }
}

}  // namespace
}  // namespace fs
