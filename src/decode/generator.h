// One turn of generation: autoregressive (depth 0) or MTP speculative (depth 1-3), exact at any
// temperature, with one commit path for every exit.
//
// A round (mtplx.md 1.4-1.14, simplified):
//   1. Round head. The primary is the pending token if there is one (a sampled correction or a
//      token emitted at the previous exit check), else a fresh sample from next_logits (after a
//      full acceptance this row is the bonus distribution, so the bonus is simply the next
//      round's fresh primary). A fresh primary is emitted at once.
//   2. Exit check: a stop token or max_tokens makes the primary pending and ends the loop; the
//      final commit forwards it (the DS4Server fix, by construction).
//   3. Drafting: min(depth, room) drafts; their MTP-history rows are speculative and dropped.
//   4. Verify: one trunk forward over [primary, drafts...] from a rollback point.
//   5. Acceptance per draft j against verify row j (penalties counted over the completion plus
//      drafts[:j]): greedy accepts iff argmax == draft; sampled accepts iff u <= p(x)/q(x), and
//      on reject draws the correction from normalise(max(p - q, 0)). An accepted stop ends it.
//   6. Commit of primary + accepted drafts: when all verified tokens are kept the verify output is
//      absorbed as is; otherwise the trunk is rolled back and the kept tokens re-forwarded (exact
//      by construction; per-position captures are an optimisation for later). A sampled
//      correction becomes pending; a greedy correction is the next round's fresh argmax.
// After the loop, finish_turn() runs exactly once on every exit: it forwards the pending token
// (unless the turn was cancelled or failed) and reports whether the state covers the prompt and
// every emitted token.
//
// Order of random draws (sampled mode; greedy draws nothing), per round: one for a fresh primary;
// one per sampled draft, depth 1 first; one uniform per verified draft until the first reject;
// one for the residual on a reject.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "decode/decode_state.h"
#include "decode/drafter.h"
#include "decode/sampler.h"

namespace fs {

inline constexpr int kMaxMtpDepth = 3;
// What `run` and `serve` use when the checkpoint has an MTP head and no depth is given.
inline constexpr int kDefaultMtpDepth = 3;

enum class FinishReason { kStop, kLength, kCancelled, kError };
std::string finish_reason_name(FinishReason r);

// Where the loop ended (telemetry, and how tests prove they reached every path).
enum class ExitPath {
  kHeadStop,        // the round's primary was a stop token (fresh, bonus or pending correction)
  kHeadCap,         // the round's primary filled max_tokens
  kDraftStop,       // an accepted draft was a stop token
  kCorrectionStop,  // a sampled correction was a stop token
  kLoopCap,         // max_tokens reached by a commit (full acceptance, or a pending correction)
  kCancelled,
  kError,
};
std::string exit_path_name(ExitPath p);

// An emitted token's log-probability and the most likely alternatives, from the distribution the
// token was drawn from: the logits after penalties, divided by the temperature (1 when greedy),
// before top-k/top-p/min-p. With MTP, accepted drafts and corrections are scored on their verify
// row, the row their acceptance was decided on.
struct TokenLogprobs {
  TokenId token = 0;
  double logprob = 0;
  std::vector<std::pair<TokenId, double>> top;  // most likely first, ties by lower id
};

// Where decoding picks its tokens. On the backend, the logits stay on the device (DESIGN "On the
// GPU", rule 3): a forward returns only the argmax ids, which greedy decoding picks; sampled
// decoding reads back each row's top and softmax denominator and draws from the distribution they
// give (decode/row_sampling.h; a row whose top-k/top-p/min-p reach past its top comes back
// whole). On the host, every logits row comes back and the sampler sees it all. Both give the
// same tokens (the same ties; for sampled rows the same distribution, bit for bit on the CPU
// backend). Repetition, presence and frequency penalties are applied on the backend, to a copy of
// the rows (Backend::penalise_entries, the host's entries), and logprobs are scored there: the
// row's top, its softmax denominator and the token's logit come back (row_scores_on_backend),
// the host path's values (bit for bit on the CPU backend, to 1e-9 on a GPU). Under kAuto
// FLASHSERVE_DEVICE_LOGPROBS=0 keeps a turn with logprobs on the host.
enum class PickOn {
  kAuto,     // on the backend for device backends, unless FLASHSERVE_DEVICE_SAMPLING=0
  kBackend,  // on the backend whenever eligible (also the CPU backend: how tests reach it)
  kHost,     // always on the host (the original path)
};

struct GenerateOptions {
  std::int64_t max_tokens = 16;
  int mtp_depth = 0;  // 0: autoregressive
  SamplerConfig sampler;
  std::uint64_t seed = 0;
  std::vector<TokenId> stop_tokens;
  std::function<bool()> cancelled;  // polled at every round head
  // Polled after every emitted token: true ends the turn AT that token, as a stop token does (it
  // is committed, nothing after it is emitted, finish reason stop, the state complete). Stop
  // sequences matched on the text use it, so their turns are banked like any finished turn.
  std::function<bool()> stop_requested;
  std::function<void(TokenId)> on_token;  // every emitted token, in order
  // When set, called for every emitted token just before on_token, with top_logprobs
  // alternatives (costs a pass over the vocabulary per token).
  std::function<void(const TokenLogprobs&)> on_logprobs;
  int top_logprobs = 0;
  // After every round's commit, with the committed state (complete for its own key; a pending
  // token is not part of it). Sessions persist long generations from here.
  std::function<void(const DecodeState&)> on_commit;
  Drafter* drafter = nullptr;  // depth > 0 without one: the model's MTP head
  PickOn pick_on = PickOn::kAuto;
};

// Whether a turn with these options picks its tokens on the backend (PickOn).
bool picks_on_backend(Model& model, const GenerateOptions& options);

struct GenerateStats {
  std::int64_t rounds = 0;
  std::array<std::int64_t, kMaxMtpDepth> drafted{};   // drafts proposed at depth d+1
  std::array<std::int64_t, kMaxMtpDepth> accepted{};  // of those, accepted
  std::int64_t final_commits = 0;                     // exactly 1 per turn
  std::int64_t rollbacks = 0;                         // verifies that kept fewer tokens than fed
  // Of those, rolled back in place (the verify kept every position: no second forward).
  std::int64_t rewinds = 0;
  // Sampled picks on the backend: rows drawn from their top, rows read back whole.
  std::int64_t rows_from_top = 0;
  std::int64_t rows_read_back = 0;
  // Rows drawn on the backend (no prefix rule: only the id came back): primaries, MTP drafts,
  // and the corrections of rejected drafts (from the residual of their two rows there).
  std::int64_t rows_drawn = 0;
  // Wall time of the speculative rounds' two halves: the drafter's proposals (its forwards and
  // the draft ids reaching the host) and the verify forward (until its picks and hidden rows
  // reach the host). Both end in a device-to-host read, so the times are the device's work.
  std::int64_t draft_ns = 0;
  std::int64_t verify_ns = 0;
};

struct GenerateResult {
  std::vector<TokenId> tokens;
  FinishReason finish_reason = FinishReason::kLength;
  ExitPath exit_path = ExitPath::kLoopCap;
  bool exit_after_full_accept = false;  // the last verify kept every draft
  bool exit_with_pending = false;       // finish_turn had a token to forward
  GenerateStats stats;
  // The state covers the prompt and every emitted token, and its invariant holds: only then may
  // it be published to a session bank or a checkpoint.
  bool state_complete = false;
  Status error;
};

// Generates from `state` (a prefilled prompt: next_logits present). Leaves in `state` the turn's
// committed state, its next_logits on the host; see GenerateResult::state_complete.
GenerateResult generate(Model& model, DecodeState& state, const GenerateOptions& options);

}  // namespace fs
