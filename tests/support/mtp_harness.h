// The MTP invariants, written once for every family with an MTP head (the embedded Qwen model,
// DeepSeek V4 and GLM 5.3 on their tiny fixtures, on the backend each test binary targets):
//   - greedy MTP decoding emits the autoregressive tokens at every depth;
//   - a partial acceptance rolls the state back in place to the cold prefill of the kept tokens;
//   - every way a turn can end leaves the state equal to the cold prefill of its key.
// The sampled-distribution invariant is in mtp_distribution.h.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decode/drafter.h"
#include "decode/generator.h"
#include "model/model.h"
#include "test_support.h"

namespace fs::test {

// A model with an MTP head that a tools/ script writes from a fixture (HF has no MTP module for
// DeepSeek V4 or GLM 5.3): the script runs once per test suite, in a scratch folder, and the model
// loads on the backend under test. A suite holds one as a static member, calls make() from
// SetUpTestSuite and reset() from TearDownTestSuite (before the CUDA runtime shuts down).
class ToolMadeModel {
 public:
  // Runs `command --out <scratch>/<name>` and loads the result; the error says which step failed.
  Status make(const std::string& command, const std::string& name);
  Model* get() const { return model_.get(); }
  const std::string& folder() const { return folder_; }  // the script's output, to load again
  void reset() {
    model_.reset();
    dir_.reset();
  }

 private:
  std::unique_ptr<ScratchDir> dir_;
  std::string folder_;
  std::unique_ptr<Model> model_;
};

// A fresh decode state with `tokens` prefilled (one call).
DecodeState prefill(Model& model, std::span<const TokenId> tokens);

// Drafts with the trunk itself: a clone of the committed trunk state forwarded one token per
// draft, each draft drawn from the trunk's distribution at `temperature_factor` times the
// sampler's temperature (greedy samplers draft the argmax). Greedy, its drafts are the model's own
// continuation and are all accepted; sampled at factor 1, q is p and (nearly) every draft is
// accepted; at a larger factor, verification accepts often and rejects often, so both branches
// of the acceptance rule run (the tiny fixtures' random MTP heads draft far from p and are nearly
// always rejected).
//   wrong_at (0-based depth; -1: none): that draft is replaced by the next id, as a point mass,
//     so the verify rejects it there (greedy: always) and keeps the drafts before it.
//   misreport_q: the drafter draws from q but tells the verifier the distribution at the
//     sampler's own temperature, so the acceptance ratio p(x)/q'(x) and the residual
//     max(p - q', 0) use the wrong q: a biased acceptance rule (the bug of scoring a draft on
//     logits other than the ones it was drawn from). With q' = p every draft is accepted and the
//     turn emits the draft distribution. The distribution test must catch it.
class TrunkDrafter : public Drafter {
 public:
  struct Options {
    double temperature_factor = 1.0;
    int wrong_at = -1;
    bool misreport_q = false;
  };
  TrunkDrafter(Model& model, Options options) : model_(model), options_(options) {}
  Status propose(DecodeState& state, TokenId primary, int depth, const SamplerConfig& sampler,
                 Rng& rng, std::vector<DraftToken>& out) override;

 private:
  Model& model_;
  Options options_;
};

// How far a warm state is from the cold, teacher-forced prefill of its key: every trunk and MTP
// history tensor, the next logits, and the next logits after `more` through both.
struct ColdDistance {
  double state = 0;
  double logits = 0;
};
ColdDistance distance_from_cold(Model& model, const DecodeState& warm,
                                std::span<const TokenId> more = {});

// For each prompt length of `all` and each max_tokens: greedy MTP at depths 1-3 emits the
// autoregressive tokens, runs the final commit once, and leaves a complete state within
// `state_tolerance` of the cold prefill (a negative tolerance skips that comparison).
void expect_greedy_mtp_is_autoregressive(Model& model, std::span<const TokenId> all,
                                         const std::vector<std::size_t>& prompt_lengths,
                                         const std::vector<std::int64_t>& max_tokens,
                                         double state_tolerance);

// Drafts wrong at each depth (TrunkDrafter::Options::wrong_at): every verify keeps part of its
// window and rolls the rest back in place (no second forward); the tokens are the autoregressive
// ones and the state is within `tolerance` of the cold prefill of the committed tokens.
void expect_partial_acceptance_rewinds_to_cold(Model& model, std::span<const TokenId> prompt,
                                               std::int64_t max_tokens, double tolerance);

// The sweep over exit paths: greedy and sampled, depths 1-3, max_tokens {1, 3, 6}, drafts from
// the MTP head and from TrunkDrafter (accepted, or wrong at each depth, the first included);
// ended by no stop, by a stop token that the same seeded turn without stops emits first at index
// 0 and 3 (or 1 or 2, when the token at 3 occurred before it), and by a stop string
// (GenerateOptions::stop_requested, as the server's stop sequences end a turn) matched in the
// first and the fourth emitted token. Every turn's state is compared with the cold prefill of its
// key, and again after two more tokens through both.
struct ExitSweepOptions {
  double temperature = 0.6;  // the sampled half
  // The first prompt length tried (stepping by 3): the first whose greedy continuation has
  // tokens first seen at indices 1 and 3 is used, so that greedy stops there are reached there.
  std::size_t prompt_length = 30;
};
struct ExitReached {
  ExitPath path;
  bool after_full_accept;
  bool by_stop_string;
  bool sampled;
  auto operator<=>(const ExitReached&) const = default;
};
struct ExitSweepResult {
  std::size_t prompt_length = 0;
  int turns = 0;
  int turns_with_rollback = 0;  // partial acceptances (a rejection at some depth)
  int stops_skipped = 0;        // stop-token runs whose token occurred earlier in the turn
  double worst_state = 0;
  double worst_logits = 0;
  std::set<ExitReached> reached;
};
ExitSweepResult sweep_exit_paths(Model& model, std::span<const TokenId> all,
                                 const ExitSweepOptions& options = {});
// Every path the sweep must reach, greedy and sampled: head stop, head cap (after a rejection and
// after a full acceptance), a stop inside the accepted drafts, the cap reached by a commit inside
// a round, and a stop string at the round's head and inside its drafts. Prints the sweep.
void expect_every_exit_reached(const ExitSweepResult& sweep, const std::string& what);

}  // namespace fs::test
