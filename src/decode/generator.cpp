#include "decode/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "decode/penalties.h"
#include "decode/row_sampling.h"

namespace fs {

std::string finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

std::string exit_path_name(ExitPath p) {
  switch (p) {
    case ExitPath::kHeadStop:
      return "head_stop";
    case ExitPath::kHeadCap:
      return "head_cap";
    case ExitPath::kDraftStop:
      return "draft_stop";
    case ExitPath::kCorrectionStop:
      return "correction_stop";
    case ExitPath::kLoopCap:
      return "loop_cap";
    case ExitPath::kCancelled:
      return "cancelled";
    case ExitPath::kError:
      return "error";
  }
  return "?";
}

namespace {

std::int64_t nanoseconds_since(std::chrono::steady_clock::time_point began) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              began)
      .count();
}

// log softmax(row / temperature) at `token`, and the `top` most likely ids, from what they read
// of the row (the host's row, or the backend's: row_scores_on_backend), in one arithmetic.
TokenLogprobs score(const RowScore& row, TokenId token, const SamplerConfig& sampler) {
  const double t = sampler.greedy() ? 1.0 : sampler.temperature;
  const double lse = row.max_logit / t + std::log(row.total);
  const auto logprob = [&](float logit) { return static_cast<double>(logit) / t - lse; };
  TokenLogprobs out;
  out.token = token;
  out.logprob = logprob(row.token_logit);
  for (std::size_t i = 0; i < row.top_ids.size(); ++i)
    out.top.emplace_back(row.top_ids[i], logprob(row.top_logits[i]));
  return out;
}

TokenLogprobs score(std::span<const float> row, TokenId token, const SamplerConfig& sampler,
                    int top) {
  const double t = sampler.greedy() ? 1.0 : sampler.temperature;
  RowScore r;
  r.max_logit = -INFINITY;
  for (const float l : row) r.max_logit = std::max(r.max_logit, static_cast<double>(l));
  for (const float l : row) r.total += std::exp((static_cast<double>(l) - r.max_logit) / t);
  r.token_logit = row[static_cast<std::size_t>(token)];
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(std::max(top, 0)), row.size());
  if (k > 0) {
    std::vector<TokenId> ids(row.size());
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<TokenId>(i);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](TokenId a, TokenId b) {
                        const float la = row[static_cast<std::size_t>(a)];
                        const float lb = row[static_cast<std::size_t>(b)];
                        return la != lb ? la > lb : a < b;
                      });
    for (std::size_t i = 0; i < k; ++i) {
      r.top_ids.push_back(ids[i]);
      r.top_logits.push_back(row[static_cast<std::size_t>(ids[i])]);
    }
  }
  return score(r, token, sampler);
}

// The entries of verify row `row` among a round's (`penalties`, rows counted from 0), re-counted
// from that row: what the ops over one row take.
std::vector<EntryPenalty> own_penalties(std::span<const EntryPenalty> penalties, std::int64_t row) {
  std::vector<EntryPenalty> own;
  for (const auto& e : penalties) {
    if (e.row != row) continue;
    own.push_back(e);
    own.back().row = 0;
  }
  return own;
}

class Turn {
 public:
  Turn(Model& model, DecodeState& state, const GenerateOptions& options)
      : model_(model),
        state_(state),
        opt_(options),
        rng_(options.seed),
        prompt_length_(state.tokens.size()),
        on_backend_(picks_on_backend(model, options)),
        last_rows_(on_backend_ ? LogitsRows::kLastArgmax : LogitsRows::kLast),
        penalties_(options.sampler, state.tokens) {}

  GenerateResult run() {
    if (auto s = validate(); !s.ok()) {
      result_.error = s;
      result_.finish_reason = FinishReason::kError;
      return std::move(result_);
    }
    MtpDrafter mtp_drafter(model_, on_backend_);
    Drafter* drafter = opt_.drafter ? opt_.drafter : &mtp_drafter;
    std::optional<TokenId> pending;
    Status failure;
    bool stopped = false, cancelled = false;
    ExitPath exit = ExitPath::kLoopCap;

    while (emitted() < opt_.max_tokens) {
      if (opt_.cancelled && opt_.cancelled()) {
        cancelled = true;
        exit = ExitPath::kCancelled;
        break;
      }
      ++result_.stats.rounds;
      TokenId primary;
      if (pending) {
        primary = *pending;
        pending.reset();
      } else if (on_backend_ && state_.next_argmax && state_.next_logits.empty()) {
        // The logits never left the backend.
        auto& penalties = penalty_rows_;
        penalties.clear();
        penalties_.append_rows(1, {}, state_.next_logits_device.cols(), penalties);
        if (opt_.sampler.greedy() && !opt_.sampler.has_penalties()) {
          primary = *state_.next_argmax;
        } else if (opt_.sampler.greedy()) {
          auto ids =
              penalised_argmax_on_backend(*model_.backend(), state_.next_logits_device,
                                          state_.next_logits_row, 1, opt_.sampler, penalties);
          if (!ids.ok()) {
            failure = ids.status();
            exit = ExitPath::kError;
            break;
          }
          primary = ids->front();
        } else if (!opt_.sampler.has_prefix_rule()) {
          // Every token kept: the draw itself on the backend (the uniform sample() would take),
          // so neither the row nor a distribution over the whole vocabulary crosses.
          const double u[1] = {rng_.uniform()};
          auto ids = draws_on_backend(*model_.backend(), state_.next_logits_device,
                                      state_.next_logits_row, 1, opt_.sampler, u, penalties);
          if (!ids.ok()) {
            failure = ids.status();
            exit = ExitPath::kError;
            break;
          }
          ++result_.stats.rows_drawn;
          primary = ids->front();
        } else {
          auto p = backend_distributions(state_.next_logits_device, state_.next_logits_row, 1,
                                         penalties);
          if (!p.ok()) {
            failure = p.status();
            exit = ExitPath::kError;
            break;
          }
          primary = sample(p->front(), rng_);
        }
        auto logprobs =
            score_on_backend(state_.next_logits_device, state_.next_logits_row, primary, penalties);
        if (!logprobs.ok()) {
          failure = logprobs.status();
          exit = ExitPath::kError;
          break;
        }
        emit_scored(primary, *logprobs);
      } else {
        state_.materialize_logits();
        const auto penalised = penalties_.apply(state_.next_logits);
        primary = pick(penalised);
        emit(primary, penalised);
      }
      if (stops_at(primary) || emitted() >= opt_.max_tokens) {
        pending = primary;  // forwarded by finish_turn, never left out of the state
        stopped = stops_at(primary);
        exit = stopped ? ExitPath::kHeadStop : ExitPath::kHeadCap;
        break;
      }
      const int depth =
          static_cast<int>(std::min<std::int64_t>(opt_.mtp_depth, opt_.max_tokens - emitted()));
      RoundOutcome outcome;
      result_.exit_after_full_accept = false;
      failure = depth == 0 ? autoregressive_step(primary)
                           : speculative_round(*drafter, primary, depth, outcome);
      if (!failure.ok()) {
        exit = ExitPath::kError;
        break;
      }
      result_.exit_after_full_accept = outcome.full_accept;
      if (opt_.on_commit) opt_.on_commit(state_);
      if (outcome.correction) {
        if (outcome.correction_logprobs)
          emit_scored(*outcome.correction, outcome.correction_logprobs);
        else
          emit(*outcome.correction, outcome.correction_row);
        pending = outcome.correction;
        if (stops_at(*outcome.correction)) {
          stopped = true;
          exit = ExitPath::kCorrectionStop;
          break;
        }
      }
      if (outcome.stopped) {
        stopped = true;
        exit = ExitPath::kDraftStop;
        break;
      }
    }

    const FinishReason reason = !failure.ok() ? FinishReason::kError
                                : cancelled   ? FinishReason::kCancelled
                                : stopped     ? FinishReason::kStop
                                              : FinishReason::kLength;
    result_.exit_path = exit;
    result_.exit_with_pending = pending.has_value();
    finish_turn(pending, reason, failure);
    return std::move(result_);
  }

 private:
  struct RoundOutcome {
    bool stopped = false;               // an accepted draft was a stop token
    bool full_accept = false;           // every draft was accepted
    std::optional<TokenId> correction;  // sampled rejection: emitted and pending
    std::vector<float> correction_row;  // its penalised verify row, when logprobs are asked for
    // Or, its row on the backend, its log-probabilities (when asked for).
    std::optional<TokenLogprobs> correction_logprobs;
  };

  Status validate() const {
    if (opt_.max_tokens < 0) return invalid_argument("max_tokens must be >= 0");
    if (opt_.mtp_depth < 0 || opt_.mtp_depth > kMaxMtpDepth) {
      return invalid_argument("mtp depth must be in [0, " + std::to_string(kMaxMtpDepth) + "]");
    }
    if (auto s = opt_.sampler.validate(); !s.ok()) return s;
    if (!state_.has_logits())
      return failed_precondition("generate needs a prefilled prompt (no logits yet)");
    if (opt_.mtp_depth > 0 && !opt_.drafter && !model_.mtp()) {
      return failed_precondition(
          "MTP depth " + std::to_string(opt_.mtp_depth) +
          " needs a checkpoint with an MTP head; this one has none (use depth 0)");
    }
    return state_.check_invariant();
  }

  std::int64_t emitted() const { return static_cast<std::int64_t>(result_.tokens.size()); }

  bool is_stop(TokenId t) const {
    return std::find(opt_.stop_tokens.begin(), opt_.stop_tokens.end(), t) != opt_.stop_tokens.end();
  }

  // A stop token, or a stop the caller requested after the tokens emitted so far.
  bool stops_at(TokenId t) const {
    return is_stop(t) || (opt_.stop_requested && opt_.stop_requested());
  }

  // The log-probabilities of token t on row `row` of logits left on the backend, penalised by
  // `penalties` (counted from that row), when they are asked for: score()'s values from what the
  // backend sends of the row (bit for bit the host path's on the CPU backend).
  Expected<std::optional<TokenLogprobs>> score_on_backend(const Tensor& logits, std::int64_t row,
                                                          TokenId t,
                                                          std::span<const EntryPenalty> penalties) {
    if (!opt_.on_logprobs) return std::optional<TokenLogprobs>{};
    const double temperature = opt_.sampler.greedy() ? 1.0 : opt_.sampler.temperature;
    auto r = row_scores_on_backend(*model_.backend(), logits, row, 1, temperature, {&t, 1},
                                   opt_.top_logprobs, penalties);
    if (!r.ok()) return r.status();
    return std::optional<TokenLogprobs>(score(r->front(), t, opt_.sampler));
  }

  // A token picked on the backend, with its log-probabilities when they were asked for.
  void emit_scored(TokenId t, const std::optional<TokenLogprobs>& logprobs) {
    if (opt_.on_logprobs && logprobs) opt_.on_logprobs(*logprobs);
    emit(t, {});
  }

  // `row`: the penalised logits the token was chosen from (scored for on_logprobs).
  void emit(TokenId t, std::span<const float> row) {
    if (opt_.on_logprobs && !row.empty())
      opt_.on_logprobs(score(row, t, opt_.sampler, opt_.top_logprobs));
    result_.tokens.push_back(t);
    penalties_.count(t);
    if (opt_.on_token) opt_.on_token(t);
  }

  TokenId pick(std::span<const float> penalised) {
    if (opt_.sampler.greedy()) return argmax(penalised);
    return sample(target_distribution(penalised, opt_.sampler), rng_);
  }

  // The speculative-sampling test of a draft against its row's target distribution p: accepted
  // with probability min(1, p(x) / q(x)); on rejection the correction is drawn from the residual
  // max(0, p - q), renormalised, so the emitted token has distribution p whatever q was.
  bool accept_draft(const TokenDistribution& p, const DraftToken& draft, RoundOutcome& outcome) {
    const double px = p.prob(draft.token), qx = draft.q_prob();
    const double accept_prob = qx > 0 ? std::min(1.0, px / qx) : (px > 0 ? 1.0 : 0.0);
    if (rng_.uniform() <= accept_prob) return true;
    outcome.correction = sample(residual_distribution(p, draft.q), rng_);
    return false;
  }

  // accept_draft with p(x) alone, for a verify row no top can decide (no prefix rule): its whole
  // distribution is fetched only for a rejection's residual. The same uniforms in the same order
  // as accept_draft, and (on the CPU backend) the same p(x) bit for bit, so the same tokens.
  // `penalties` are the verify rows' (row r counted from 0); row `row`'s are re-counted from it.
  Expected<bool> accept_draft_from_prob(double px, const DraftToken& draft, const Tensor& logits,
                                        std::int64_t row, std::span<const EntryPenalty> penalties,
                                        RoundOutcome& outcome) {
    const double qx = draft.q_prob();
    const double accept_prob = qx > 0 ? std::min(1.0, px / qx) : (px > 0 ? 1.0 : 0.0);
    if (rng_.uniform() <= accept_prob) return true;
    const auto own = own_penalties(penalties, row);
    if (draft.q_on_backend()) {  // both rows on the backend: only the correction's id comes back
      const double u = rng_.uniform();
      auto id = residual_draws_on_backend(*model_.backend(), logits, row, 1, draft.q_row,
                                          opt_.sampler, {&u, 1}, own);
      if (!id.ok()) return id.status();
      ++result_.stats.rows_drawn;
      outcome.correction = id->front();
      return false;
    }
    auto p = backend_distributions(logits, row, 1, own);
    if (!p.ok()) return p.status();
    outcome.correction = sample(residual_distribution(p->front(), draft.q), rng_);
    return false;
  }

  // The target distributions of rows [first, first + count) of logits left on the backend, with
  // the penalties given (row r's counted from `first`).
  Expected<std::vector<TokenDistribution>> backend_distributions(
      const Tensor& logits, std::int64_t first, std::int64_t count,
      std::span<const EntryPenalty> penalties) {
    RowSamplingStats rows;
    auto p = distributions_on_backend(*model_.backend(), logits, first, count, opt_.sampler, &rows,
                                      penalties);
    result_.stats.rows_from_top += rows.from_top;
    result_.stats.rows_read_back += rows.read_back;
    return p;
  }

  Status autoregressive_step(TokenId primary) {
    const TokenId in[1] = {primary};
    return extend(model_, state_, in, 0, last_rows_);
  }

  Status speculative_round(Drafter& drafter, TokenId primary, int depth, RoundOutcome& outcome) {
    std::vector<DraftToken> drafts;
    const auto covered = static_cast<std::int64_t>(state_.tokens.size());
    const std::int64_t history_rows = std::max<std::int64_t>(covered - 1, 0);
    const auto draft_began = std::chrono::steady_clock::now();
    if (auto s = drafter.propose(state_, primary, depth, opt_.sampler, rng_, drafts); !s.ok())
      return s;
    result_.stats.draft_ns += nanoseconds_since(draft_began);
    for (const auto& d : drafts) result_.stats.rows_drawn += d.q_on_backend() ? 1 : 0;
    // Rows the drafter appended are speculative; committed rows come from the trunk's hiddens.
    if (state_.mtp_history) {
      if (auto s = state_.mtp_history->truncate(history_rows); !s.ok()) return s;
    }
    if (drafts.empty()) return autoregressive_step(primary);

    std::vector<TokenId> verify_in = {primary};
    for (const auto& d : drafts) verify_in.push_back(d.token);
    const auto rollback =
        RollbackPoint::take(*state_.trunk, static_cast<std::int64_t>(verify_in.size()));
    ForwardOutput verify;
    const auto verify_rows = on_backend_ ? LogitsRows::kAllArgmax : LogitsRows::kAll;
    const auto verify_began = std::chrono::steady_clock::now();
    if (auto s = model_.forward(*state_.trunk, verify_in, verify_rows, verify); !s.ok()) return s;
    result_.stats.verify_ns += nanoseconds_since(verify_began);
    const auto vocab = static_cast<std::size_t>(model_.info().vocab_size);
    // On the backend: the target distributions of the drafts' rows, from their tops (sampled), or
    // their penalised argmaxes (greedy with penalties). Row j is tested only after drafts 0..j-1
    // were accepted, so its penalties count the completion so far and those drafts, as the host
    // path's do below (there the drafts are counted as they are emitted).
    std::vector<TokenDistribution> p_rows;
    std::vector<double> p_of_drafts;  // instead of p_rows where no top decides a row
    std::vector<TokenId> penalised_picks;
    if (on_backend_) {
      const auto rows = static_cast<std::int64_t>(drafts.size());
      auto& penalties = penalty_rows_;
      penalties.clear();
      penalties_.append_rows(rows, std::span<const TokenId>(verify_in).subspan(1),
                             verify.device_logits.cols(), penalties);
      if (!opt_.sampler.greedy() && !opt_.sampler.has_prefix_rule()) {
        std::vector<TokenId> ids;
        for (const auto& d : drafts) ids.push_back(d.token);
        auto px = token_probs_on_backend(*model_.backend(), verify.device_logits, 0, rows,
                                         opt_.sampler, ids, penalties);
        if (!px.ok()) return px.status();
        p_of_drafts = std::move(px).value();
      } else if (!opt_.sampler.greedy()) {
        auto p = backend_distributions(verify.device_logits, 0, rows, penalties);
        if (!p.ok()) return p.status();
        p_rows = std::move(p).value();
      } else if (opt_.sampler.has_penalties()) {
        auto ids = penalised_argmax_on_backend(*model_.backend(), verify.device_logits, 0, rows,
                                               opt_.sampler, penalties);
        if (!ids.ok()) return ids.status();
        penalised_picks = std::move(ids).value();
      }
    }

    std::size_t accepted = 0;
    for (std::size_t j = 0; j < drafts.size(); ++j) ++result_.stats.drafted[j];
    for (std::size_t j = 0; j < drafts.size(); ++j) {
      const TokenId x = drafts[j].token;
      if (on_backend_) {  // verify row j's argmax (greedy), its distribution from the top, or p(x)
        bool accept;
        if (opt_.sampler.greedy()) {
          accept = (penalised_picks.empty() ? verify.argmax.at(j) : penalised_picks[j]) == x;
        } else if (!p_of_drafts.empty()) {
          auto a = accept_draft_from_prob(p_of_drafts[j], drafts[j], verify.device_logits,
                                          static_cast<std::int64_t>(j), penalty_rows_, outcome);
          if (!a.ok()) return a.status();
          accept = *a;
        } else {
          accept = accept_draft(p_rows[j], drafts[j], outcome);
        }
        // The token emitted on this verify row, scored there: the draft when accepted, else a
        // sampled rejection's correction (a greedy rejection emits nothing here).
        const std::optional<TokenId> scored = accept ? x : outcome.correction;
        std::optional<TokenLogprobs> logprobs;
        if (scored && opt_.on_logprobs) {
          auto lp = score_on_backend(verify.device_logits, static_cast<std::int64_t>(j), *scored,
                                     own_penalties(penalty_rows_, static_cast<std::int64_t>(j)));
          if (!lp.ok()) return lp.status();
          logprobs = std::move(*lp);
        }
        if (!accept) {
          outcome.correction_logprobs = std::move(logprobs);
          break;
        }
        ++result_.stats.accepted[j];
        ++accepted;
        emit_scored(x, logprobs);
        if (stops_at(x)) {
          outcome.stopped = true;
          break;
        }
        continue;
      }
      const std::span<const float> row(verify.logits.data() + j * vocab, vocab);
      const auto penalised = penalties_.apply(row);  // the drafts before it counted as emitted
      bool accept;
      if (opt_.sampler.greedy()) {
        accept = argmax(penalised) == x;
      } else {
        accept = accept_draft(target_distribution(penalised, opt_.sampler), drafts[j], outcome);
        if (!accept && opt_.on_logprobs) outcome.correction_row = penalised;
      }
      if (!accept) break;
      ++result_.stats.accepted[j];
      ++accepted;
      emit(x, penalised);
      if (stops_at(x)) {
        outcome.stopped = true;
        break;
      }
    }

    outcome.full_accept = accepted == drafts.size();
    const std::size_t keep = 1 + accepted;
    const std::span<const TokenId> kept(verify_in.data(), keep);
    if (keep == verify_in.size()) return absorb(model_, state_, kept, std::move(verify));
    ++result_.stats.rollbacks;
    if (rollback.in_place()) {
      ++result_.stats.rewinds;
      if (auto s = rollback.rewind(*state_.trunk, static_cast<std::int64_t>(keep)); !s.ok())
        return s;
      return absorb(model_, state_, kept,
                    first_rows(std::move(verify), static_cast<std::int64_t>(keep),
                               static_cast<std::int64_t>(vocab)));
    }
    if (auto s = rollback.restore(*state_.trunk); !s.ok()) return s;
    return extend(model_, state_, kept, 0, last_rows_);
  }

  // The one commit path: every exit comes here exactly once.
  void finish_turn(std::optional<TokenId> pending, FinishReason reason, const Status& failure) {
    ++result_.stats.final_commits;
    result_.finish_reason = reason;
    result_.error = failure;
    if (reason == FinishReason::kError || reason == FinishReason::kCancelled) {
      result_.state_complete = false;
      return;
    }
    if (pending) {
      const TokenId in[1] = {*pending};
      if (auto s = extend(model_, state_, in, 0, last_rows_); !s.ok()) {
        result_.error = s;
        result_.finish_reason = FinishReason::kError;
        result_.state_complete = false;
        return;
      }
    }
    // Inside the turn the logits stayed on the backend; the state handed back holds them on the
    // host, as every caller of generate reads them (one row copied per turn, not per token).
    state_.materialize_logits();
    const bool key_matches =
        state_.tokens.size() == prompt_length_ + result_.tokens.size() &&
        std::equal(result_.tokens.begin(), result_.tokens.end(),
                   state_.tokens.begin() + static_cast<std::ptrdiff_t>(prompt_length_));
    result_.state_complete = key_matches && state_.check_invariant().ok();
  }

  Model& model_;
  DecodeState& state_;
  const GenerateOptions& opt_;
  Rng rng_;
  std::size_t prompt_length_;
  bool on_backend_;       // picks on the backend (picks_on_backend)
  LogitsRows last_rows_;  // what a one-position forward returns: kLast or kLastArgmax
  TurnPenalties penalties_;
  // The entries of the rows a step samples, reused so that a long context's (hundreds of KB) is
  // not allocated again every step.
  std::vector<EntryPenalty> penalty_rows_;
  GenerateResult result_;
};

}  // namespace

bool picks_on_backend(Model& model, const GenerateOptions& options) {
  // Penalties are subtracted on the backend too, and logprobs scored there (decode/row_sampling.h).
  const bool eligible = options.sampler.greedy() || model.backend() != nullptr;
  switch (options.pick_on) {
    case PickOn::kHost:
      return false;
    case PickOn::kBackend:
      return eligible;
    case PickOn::kAuto:
      break;
  }
  if (!eligible || model.info().backend == "cpu") return false;
  const char* env = std::getenv("FLASHSERVE_DEVICE_SAMPLING");
  if (env != nullptr && std::string(env) == "0") return false;
  // Logprobs are scored on the device too (the host path's values to 1e-9 on an H100, session
  // 32); FLASHSERVE_DEVICE_LOGPROBS=0 keeps a turn with logprobs on the host.
  const char* logprobs = std::getenv("FLASHSERVE_DEVICE_LOGPROBS");
  return !options.on_logprobs || logprobs == nullptr || std::string(logprobs) != "0";
}

GenerateResult generate(Model& model, DecodeState& state, const GenerateOptions& options) {
  return Turn(model, state, options).run();
}

}  // namespace fs
