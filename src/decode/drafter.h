// Where speculative drafts come from: the model's MTP head, or (tests) a script.
#pragma once

#include <functional>
#include <vector>

#include "decode/decode_state.h"
#include "decode/sampler.h"

namespace fs {

struct DraftToken {
  TokenId token = 0;
  // The distribution the draft was drawn from (q in the acceptance test). A point mass when the
  // draft was chosen greedily or by a script.
  TokenDistribution q;
  // A draft drawn on the backend from its whole row (a sampled config with no prefix rule): q
  // stays there. q_row is the draft's logits [1, vocab] on the backend, which a rejection's
  // residual reads (decode/row_sampling.h residual_draws_on_backend), q_of_token is q(token),
  // and q is empty.
  Tensor q_row{};
  double q_of_token = 0;

  bool q_on_backend() const { return q_row.numel() > 0; }
  // q(token), wherever q is.
  double q_prob() const { return q_on_backend() ? q_of_token : q.prob(token); }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Proposes up to `depth` tokens to follow `primary`, the emitted token the trunk has not yet
  // absorbed (state covers everything before it). May append speculative rows to
  // state.mtp_history; the decoder truncates them away afterwards. Draws from `rng` only for
  // sampled drafts, one draw per draft.
  virtual Status propose(DecodeState& state, TokenId primary, int depth,
                         const SamplerConfig& sampler, Rng& rng, std::vector<DraftToken>& out) = 0;
};

// Drafts with the model's MTP head, applied recursively on its own hidden output: depth 1 reads
// (h of the position before primary, primary), depth d+1 reads (head hidden at depth d, draft d).
// Drafts are sampled with the target's sampler (no penalties: they only change q, and a q that
// differs from p lowers acceptance but never exactness).
class MtpDrafter : public Drafter {
 public:
  // `pick_on_backend`: the head's logits stay on the backend (generator.h PickOn): greedy drafts
  // take its argmax (only the id comes back), sampled drafts draw from the distribution of the
  // row's top (decode/row_sampling.h), or with no prefix rule from the whole row there (the id
  // and q(id) come back, the row is kept for a residual); the same tokens the host copy gives.
  explicit MtpDrafter(Model& model, bool pick_on_backend = false)
      : model_(model), pick_on_backend_(pick_on_backend) {}
  Status propose(DecodeState& state, TokenId primary, int depth, const SamplerConfig& sampler,
                 Rng& rng, std::vector<DraftToken>& out) override;

 private:
  Model& model_;
  bool pick_on_backend_;
};

// Test drafter: the script sees the committed tokens and the primary and names the drafts.
class ScriptedDrafter : public Drafter {
 public:
  using Script = std::function<std::vector<TokenId>(const std::vector<TokenId>& committed,
                                                    TokenId primary, int depth)>;
  explicit ScriptedDrafter(Script script) : script_(std::move(script)) {}
  Status propose(DecodeState& state, TokenId primary, int depth, const SamplerConfig& sampler,
                 Rng& rng, std::vector<DraftToken>& out) override;

 private:
  Script script_;
};

}  // namespace fs
