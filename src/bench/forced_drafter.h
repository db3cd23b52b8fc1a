// A drafter that runs the model's real MTP head (so every draft costs what it costs in
// production) and then replaces each draft by a scripted one: the reference continuation's
// true next token with probability `accept`, a wrong one otherwise. With greedy decoding the
// trunk's verify then accepts each draft at that rate, whatever the synthetic head predicts.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "decode/drafter.h"

namespace fs::bench {

class ForcedAcceptanceDrafter final : public Drafter {
 public:
  // `reference` is the greedy continuation of the state's tokens at construction
  // (`prompt_length` of them); `vocab` bounds the wrong tokens. `pick_on_backend`: the head's
  // picks stay on the backend, as generate's own drafter takes them (picks_on_backend), so a
  // draft costs here what it costs there.
  ForcedAcceptanceDrafter(Model& model, std::vector<TokenId> reference, std::size_t prompt_length,
                          double accept, std::int64_t vocab, std::uint32_t seed,
                          bool pick_on_backend)
      : head_(model, pick_on_backend),
        reference_(std::move(reference)),
        prompt_length_(prompt_length),
        accept_(accept),
        vocab_(vocab),
        rng_(seed) {}

  Status propose(DecodeState& state, TokenId primary, int depth, const SamplerConfig& sampler,
                 Rng& rng, std::vector<DraftToken>& out) override;

 private:
  MtpDrafter head_;
  std::vector<TokenId> reference_;
  std::size_t prompt_length_;
  double accept_;
  std::int64_t vocab_;
  std::mt19937 rng_;
};

}  // namespace fs::bench
