#include "model/deepseek_v4/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace fs {
namespace {

// The rotary dimension at which a wavelength fits `rotations` times into the original context.
double correction_dim(double rotations, double dim, double base, double context) {
  return dim * std::log(context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

std::vector<float> rope_inv_freq(const DsRope& rope, std::int64_t rope_dim) {
  const auto half = rope_dim / 2;
  const auto dim = static_cast<double>(rope_dim);
  std::vector<float> out(static_cast<std::size_t>(half));
  double low = 0, high = 0;
  if (rope.yarn) {
    low = correction_dim(rope.beta_fast, dim, rope.theta, rope.original_max_position_embeddings);
    high = correction_dim(rope.beta_slow, dim, rope.theta, rope.original_max_position_embeddings);
    if (rope.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // as the reference: no division by zero
  }
  for (std::int64_t j = 0; j < half; ++j) {
    const auto base_freq =
        static_cast<float>(1.0 / std::pow(rope.theta, static_cast<double>(2 * j) / dim));
    if (!rope.yarn) {
      out[static_cast<std::size_t>(j)] = base_freq;
      continue;
    }
    // ramp 0: extrapolate (keep the frequency), ramp 1: interpolate (divide by the factor).
    const auto ramp =
        static_cast<float>(std::clamp((static_cast<double>(j) - low) / (high - low), 0.0, 1.0));
    const float interpolated = base_freq / static_cast<float>(rope.factor);
    out[static_cast<std::size_t>(j)] = interpolated * ramp + base_freq * (1.0f - ramp);
  }
  return out;
}

}  // namespace fs
