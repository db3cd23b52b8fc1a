// target_distribution as it was first written: the whole vocabulary sorted by probability. The
// sampler now selects only the top ranks; test_sampler checks it gives the same ids and
// probabilities bit for bit, and bench/sampler_bench times both.
#pragma once

#include <span>

#include "decode/sampler.h"

namespace fs::test {

TokenDistribution full_sort_distribution(std::span<const float> logits, const SamplerConfig& c);

}  // namespace fs::test
