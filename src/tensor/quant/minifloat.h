// The OCP 8-bit and 4-bit float formats of the FP8/FP4 releases, one value at a time, written
// from the OCP "8-bit Floating Point Specification (OFP8)" and "Microscaling Formats (MX) v1.0".
//
// E4M3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is
//   NaN; largest 448, smallest normal 2^-6, subnormals m/8 * 2^-6.
// E8M0: an unsigned exponent byte, 2^(e-127); 0xff is NaN. The MX block scale.
// E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6; no NaN.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace fs::quant {

inline float e4m3_to_f32(std::uint8_t v) {
  return f8e4m3_to_f32(v);
}

// Round to nearest, ties to even, as torch's `.to(torch.float8_e4m3fn)` does: magnitudes from
// 464 (exclusive) up, infinities and NaN become NaN (0x7f, with the input's sign); 464 itself
// rounds to 448.
std::uint8_t f32_to_e4m3(float f);
// The same rounding, but finite values beyond 448 clamp to ±448 (what a quantiser that scaled
// its block to fit wants); NaN stays NaN.
std::uint8_t f32_to_e4m3_saturate(float f);

float e8m0_to_f32(std::uint8_t e);

float e2m1_to_f32(std::uint8_t code);  // the low 4 bits
// Round to nearest, ties to even, saturating at ±6 (E2M1 has no overflow value); NaN gives +0
// (nothing in E2M1 represents it; quantisers never produce one).
std::uint8_t f32_to_e2m1(float f);

}  // namespace fs::quant
