#include "bench/forced_drafter.h"

namespace fs::bench {

Status ForcedAcceptanceDrafter::propose(DecodeState& state, TokenId primary, int depth,
                                        const SamplerConfig& sampler, Rng& rng,
                                        std::vector<DraftToken>& out) {
  if (auto s = head_.propose(state, primary, depth, sampler, rng, out); !s.ok()) return s;
  // The primary is the continuation's token at `at`; draft j would be the one at at + 1 + j.
  const auto at = state.tokens.size() - prompt_length_;
  std::bernoulli_distribution keep(accept_);
  for (std::size_t j = 0; j < out.size(); ++j) {
    const auto i = at + 1 + j;
    const TokenId truth =
        i < reference_.size() ? reference_[i] : static_cast<TokenId>((primary + 1) % vocab_);
    const TokenId t = keep(rng_) ? truth : static_cast<TokenId>((truth + 1) % vocab_);
    out[j] = {t, TokenDistribution::point(t)};
  }
  return {};
}

}  // namespace fs::bench
