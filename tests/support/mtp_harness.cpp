#include "mtp_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/loader.h"
#include "test_backend.h"

namespace fs::test {

Status ToolMadeModel::make(const std::string& command, const std::string& name) {
  dir_ = std::make_unique<ScratchDir>();
  folder_ = dir_->file(name);
  std::string text;
  if (run_command(command + " --out " + folder_, &text) != 0)
    return internal_error("'" + command + "' failed (it needs python3): " + text);
  auto m = load_model(folder_, test_load_options());
  if (!m.ok()) return m.status();
  model_ = std::move(m).value();
  return {};
}

DecodeState prefill(Model& model, std::span<const TokenId> tokens) {
  DecodeState s = new_decode_state(model);
  const Status st = extend(model, s, tokens);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return s;
}

Status TrunkDrafter::propose(DecodeState& state, TokenId primary, int depth,
                             const SamplerConfig& sampler, Rng& rng, std::vector<DraftToken>& out) {
  out.clear();
  SamplerConfig draft_sampler = sampler;
  draft_sampler.temperature *= options_.temperature_factor;
  auto trunk = state.trunk->clone();
  const auto vocab = static_cast<TokenId>(model_.info().vocab_size);
  TokenId next = primary;
  for (int d = 0; d < depth; ++d) {
    ForwardOutput o;
    const TokenId in[1] = {next};
    if (auto s = model_.forward(*trunk, in, LogitsRows::kLast, o); !s.ok()) return s;
    DraftToken draft;
    draft.q = target_distribution(o.logits, draft_sampler);
    draft.token = sampler.greedy() ? draft.q.ids.front() : sample(draft.q, rng);
    if (options_.misreport_q) draft.q = target_distribution(o.logits, sampler);
    if (d == options_.wrong_at) {
      draft.token = (draft.token + 1) % vocab;
      draft.q = TokenDistribution::point(draft.token);
    }
    out.push_back(draft);
    next = draft.token;
  }
  return {};
}

namespace {

double max_abs_difference(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

}  // namespace

ColdDistance distance_from_cold(Model& model, const DecodeState& warm,
                                std::span<const TokenId> more) {
  ColdDistance d;
  EXPECT_TRUE(warm.check_invariant().ok()) << warm.check_invariant().to_string();
  DecodeState cold = prefill(model, warm.tokens);
  d.state = max_difference(compare_states(*warm.trunk, *cold.trunk));
  if (warm.mtp_history || cold.mtp_history) {
    EXPECT_TRUE(warm.mtp_history && cold.mtp_history);
    if (warm.mtp_history && cold.mtp_history)
      d.state =
          std::max(d.state, max_difference(compare_states(*warm.mtp_history, *cold.mtp_history)));
  }
  d.logits = max_abs_difference(warm.host_logits(), cold.host_logits());
  if (!more.empty()) {
    DecodeState next = warm.clone();
    EXPECT_TRUE(extend(model, next, more).ok());
    EXPECT_TRUE(extend(model, cold, more).ok());
    d.logits = std::max(d.logits, max_abs_difference(next.host_logits(), cold.host_logits()));
  }
  return d;
}

void expect_greedy_mtp_is_autoregressive(Model& model, std::span<const TokenId> all,
                                         const std::vector<std::size_t>& prompt_lengths,
                                         const std::vector<std::int64_t>& max_tokens,
                                         double state_tolerance) {
  for (const std::size_t length : prompt_lengths) {
    ASSERT_LE(length, all.size());
    const auto prompt = all.first(length);
    for (const std::int64_t cap : max_tokens) {
      GenerateOptions opt;
      opt.max_tokens = cap;
      DecodeState ar_state = prefill(model, prompt);
      const auto ar = generate(model, ar_state, opt);
      ASSERT_TRUE(ar.error.ok()) << ar.error.to_string();
      for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
        const std::string what = "prompt " + std::to_string(length) + " max_tokens " +
                                 std::to_string(cap) + " depth " + std::to_string(depth);
        opt.mtp_depth = depth;
        DecodeState s = prefill(model, prompt);
        const auto r = generate(model, s, opt);
        ASSERT_TRUE(r.error.ok()) << r.error.to_string();
        EXPECT_EQ(r.tokens, ar.tokens) << what;
        EXPECT_EQ(r.stats.final_commits, 1) << what;
        ASSERT_TRUE(r.state_complete) << what;
        if (state_tolerance >= 0) {
          EXPECT_LE(distance_from_cold(model, s).state, state_tolerance) << what;
        }
      }
    }
  }
}

void expect_partial_acceptance_rewinds_to_cold(Model& model, std::span<const TokenId> prompt,
                                               std::int64_t max_tokens, double tolerance) {
  GenerateOptions opt;
  opt.max_tokens = max_tokens;
  DecodeState ar_state = prefill(model, prompt);
  const auto ar = generate(model, ar_state, opt);
  ASSERT_TRUE(ar.error.ok()) << ar.error.to_string();
  for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
    for (int wrong_at = 0; wrong_at < depth; ++wrong_at) {
      const std::string what =
          "depth " + std::to_string(depth) + " wrong at " + std::to_string(wrong_at);
      opt.mtp_depth = depth;
      TrunkDrafter drafter(model, {.wrong_at = wrong_at});
      opt.drafter = &drafter;
      DecodeState s = prefill(model, prompt);
      const auto r = generate(model, s, opt);
      ASSERT_TRUE(r.error.ok()) << r.error.to_string();
      EXPECT_EQ(r.tokens, ar.tokens) << what;
      EXPECT_GT(r.stats.rollbacks, 0) << what;
      EXPECT_EQ(r.stats.rewinds, r.stats.rollbacks) << what << ": a rollback forwarded again";
      ASSERT_TRUE(r.state_complete) << what;
      EXPECT_LE(distance_from_cold(model, s).state, tolerance) << what;
    }
  }
}

namespace {

// A stop token ends the turn at index `i` of its stop-free run only if it does not occur earlier.
bool first_seen_at(const std::vector<TokenId>& c, std::size_t i) {
  return i < c.size() && std::find(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(i), c[i]) ==
                             c.begin() + static_cast<std::ptrdiff_t>(i);
}

enum class StopKind { kNone, kToken, kString };

}  // namespace

ExitSweepResult sweep_exit_paths(Model& model, std::span<const TokenId> all,
                                 const ExitSweepOptions& options) {
  ExitSweepResult out;
  // A greedy stop inside the drafts needs a continuation that does not repeat its first tokens
  // (code does): the first prompt length, stepping by 3, whose greedy continuation has tokens
  // first seen at 1 and 3.
  for (std::size_t n = options.prompt_length; n + 2 < all.size() && out.prompt_length == 0;
       n += 3) {
    GenerateOptions probe;
    probe.max_tokens = 6;
    DecodeState probe_state = prefill(model, all.first(n));
    const auto continuation = generate(model, probe_state, probe).tokens;
    if (first_seen_at(continuation, 1) && first_seen_at(continuation, 3)) out.prompt_length = n;
  }
  EXPECT_GT(out.prompt_length, 0u) << "no prompt has a varied greedy continuation";
  if (out.prompt_length == 0) return out;
  const auto prompt = all.first(out.prompt_length);
  const std::vector<TokenId> more = {all[out.prompt_length], all[out.prompt_length + 1]};
  const DecodeState base = prefill(model, prompt);
  constexpr std::size_t kLate = 3;  // the fourth token: inside a depth-3 round, or a later round
  const std::vector<std::pair<StopKind, std::size_t>> every_stop = {{StopKind::kNone, 0},
                                                                    {StopKind::kToken, 0},
                                                                    {StopKind::kToken, kLate},
                                                                    {StopKind::kString, 0},
                                                                    {StopKind::kString, kLate}};
  const std::vector<std::pair<StopKind, std::size_t>> no_stop = {{StopKind::kNone, 0}};

  for (const bool sampled : {false, true}) {
    for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
      for (const std::int64_t max_tokens : {1, 3, 6}) {
        // -2: the MTP head; -1: TrunkDrafter, every draft right; 0..depth-1: wrong there. The
        // stops go with the drafters that reach them; the wrong drafts end in a rejection.
        for (int drafter_kind = -2; drafter_kind < depth; ++drafter_kind) {
          if (max_tokens == 1 && drafter_kind != -2) continue;  // no round: one head cap
          TrunkDrafter trunk(model, {.wrong_at = drafter_kind});
          std::vector<TokenId> stop_free;  // the turn's tokens without a stop
          for (const auto& [stop, stop_at] : drafter_kind < 0 ? every_stop : no_stop) {
            GenerateOptions opt;
            opt.max_tokens = max_tokens;
            opt.mtp_depth = depth;
            opt.seed = 7 + static_cast<std::uint64_t>(depth * 100 + max_tokens * 10 + drafter_kind);
            if (sampled) opt.sampler.temperature = options.temperature;
            if (drafter_kind > -2) opt.drafter = &trunk;
            if (stop == StopKind::kString && stop_at >= static_cast<std::size_t>(max_tokens))
              continue;
            std::size_t at = stop_at;
            if (stop == StopKind::kToken) {
              // The same seed emits the same tokens up to the stop: a stop at index `at`. A late
              // stop whose token occurred earlier (code repeats tokens) moves to index 1 or 2,
              // which end a depth-1 or depth-2 round at its last draft too.
              if (at == kLate) {
                for (const std::size_t i : {kLate, std::size_t{1}, std::size_t{2}}) {
                  if (first_seen_at(stop_free, i)) {
                    at = i;
                    break;
                  }
                }
              }
              if (!first_seen_at(stop_free, at)) {
                ++out.stops_skipped;
                continue;
              }
              opt.stop_tokens = {stop_free[at]};
            }
            std::size_t emitted = 0;
            opt.on_token = [&emitted](TokenId) { ++emitted; };
            // A stop string whose last character is in the (at+1)-th emitted token.
            if (stop == StopKind::kString)
              opt.stop_requested = [&emitted, at] { return emitted == at + 1; };
            DecodeState warm = base.clone();
            const auto r = generate(model, warm, opt);
            ++out.turns;
            EXPECT_TRUE(r.error.ok()) << r.error.to_string();
            EXPECT_EQ(r.stats.final_commits, 1);
            EXPECT_TRUE(r.state_complete) << exit_path_name(r.exit_path);
            if (!r.error.ok() || !r.state_complete) return out;
            if (stop == StopKind::kNone) stop_free = r.tokens;
            if (stop != StopKind::kNone) {
              // Ended at its stop, with the stop-free turn's tokens (the same draws) before it.
              EXPECT_EQ(r.tokens.size(), at + 1) << "the turn did not end at its stop";
              EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), stop_free.begin()));
            }
            if (r.stats.rollbacks > 0) ++out.turns_with_rollback;
            out.reached.insert(
                {r.exit_path, r.exit_after_full_accept, stop == StopKind::kString, sampled});
            const auto d = distance_from_cold(model, warm, more);
            out.worst_state = std::max(out.worst_state, d.state);
            out.worst_logits = std::max(out.worst_logits, d.logits);
          }
        }
      }
    }
  }
  return out;
}
void expect_every_exit_reached(const ExitSweepResult& sweep, const std::string& what) {
  std::printf(
      "%s: %d turns from a %zu-token prompt (%d with a rollback, %d stop tokens seen "
      "earlier skipped): max |warm - cold| state %.3g, logits %.3g; exits:",
      what.c_str(), sweep.turns, sweep.prompt_length, sweep.turns_with_rollback,
      sweep.stops_skipped, sweep.worst_state, sweep.worst_logits);
  for (const auto& e : sweep.reached)
    std::printf(" %s%s%s%s", e.sampled ? "sampled:" : "", exit_path_name(e.path).c_str(),
                e.after_full_accept ? "+full" : "", e.by_stop_string ? "+string" : "");
  std::printf("\n");
  EXPECT_GT(sweep.turns_with_rollback, 0) << what;
  for (const bool sampled : {false, true}) {
    for (const auto& need : std::vector<ExitReached>{{ExitPath::kHeadStop, false, false, sampled},
                                                     {ExitPath::kHeadCap, false, false, sampled},
                                                     {ExitPath::kHeadCap, true, false, sampled},
                                                     {ExitPath::kDraftStop, true, false, sampled},
                                                     {ExitPath::kLoopCap, true, false, sampled},
                                                     {ExitPath::kHeadStop, false, true, sampled},
                                                     {ExitPath::kDraftStop, true, true, sampled}}) {
      EXPECT_TRUE(sweep.reached.count(need))
          << what << (sampled ? ", sampled: " : ", greedy: ") << "never reached "
          << exit_path_name(need.path) << (need.after_full_accept ? " after full acceptance" : "")
          << (need.by_stop_string ? " by a stop string" : "");
    }
  }
}

}  // namespace fs::test
