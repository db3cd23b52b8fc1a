// The rotary frequencies of DeepSeek V4's two ropes (arch-dsv4.md 2.5): plain theta^(-2j/r), or
// YaRN-blended between those and theta^(-2j/r)/factor over the correction range that
// beta_fast/beta_slow give (HF _compute_yarn_parameters; V4 applies no magnitude scaling).
#pragma once

#include <cstdint>
#include <vector>

#include "model/deepseek_v4/config.h"

namespace fs {

// inv_freq[j] for j < rope_dim / 2, in fp32 as the reference builds them.
std::vector<float> rope_inv_freq(const DsRope& rope, std::int64_t rope_dim);

}  // namespace fs
