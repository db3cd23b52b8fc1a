// One entry of Backend::penalise_entries, in a header of its own: the host sampler
// (decode/sampler.h) and the backends apply the same rule, and the sampler needs nothing else of
// the backend interface.
#pragma once

#include <cstdint>

namespace fs {

// The sampler's penalties of one token in one logits row (decode/sampler.h token_penalty). The
// repetition penalty (HF's RepetitionPenaltyLogitsProcessor, vLLM's) divides a positive logit and
// multiplies a negative one; then the presence and frequency penalties subtract their amount.
struct EntryPenalty {
  std::int32_t row = 0;
  std::int32_t col = 0;
  float repetition = 1.0f;  // 1: none
  float amount = 0;

  // The rule, in these float operations on every backend (the CUDA kernel spells them out).
  float apply(float x) const {
    if (repetition != 1.0f) x = x > 0.0f ? x / repetition : x * repetition;
    return x - amount;
  }
};

}  // namespace fs
