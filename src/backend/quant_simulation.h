// The official DeepSeek V4 graph's activation quantisation, simulated in f32 (arch-dsv4.md 7, ds4's
// "official numerics"; HF computes without it). A block of values is divided by a power of two
// chosen so that its largest magnitude fits the format, each value is rounded to the nearest
// value of the format (ties to even, saturating), and the block is multiplied back.
//
// One definition for the CPU loops and the CUDA kernels, so that both backends give the same
// bits: every step is exact except the rounding itself. Scaling by a power of two is an exponent
// change (ldexpf), and the power is found by exact comparisons, not from a rounded quotient and
// logarithm (ds4 takes ceil(log2f(amax / max)), which can land one power low when amax lies
// within an ulp above max * 2^k, and then relies on the clamp; here the exponent is exactly
// ceil(log2(amax / max)) of the real numbers, on both backends).
//
// Formats (OCP OFP8 and MX v1.0, as tensor/quant/minifloat.h): E4M3 ("fn"): 3 mantissa bits,
// smallest normal 2^-6 (subnormals k * 2^-9), largest 448. E2M1: 1 mantissa bit, smallest normal
// 1 (subnormal 0.5), largest 6: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
#pragma once

#include <math.h>  // the C float functions, which host and device code both have

#include "util/host_device.h"

namespace fs::quant_sim {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;
// The FP8 block's amax floor (ds4, the official graph): a block of near-zeros gets the scale of
// amax 1e-4, so its values fall among E4M3's subnormals (or flush to zero) rather than being
// stretched over the whole range.
inline constexpr float kFp8AmaxFloor = 1e-4f;
// The FP4 block's amax floor: 6 * 2^-126 (ds4's 7.052966e-38), only there to keep the scale a
// normal float (>= 2^-126) for an all-zero block.
inline constexpr float kFp4AmaxFloor = 7.052966104933725e-38f;

// |v| clamped to `max`, rounded to the nearest value of a minifloat with `MantissaBits` mantissa
// bits whose smallest normal is 2^MinNormalExponent, ties to even; the sign of v kept. The values
// of a binade [2^e, 2^(e+1)) are spaced 2^(e - MantissaBits) apart, the subnormals as the
// smallest normal binade, so rint at that spacing is the format's round-to-nearest-even (the
// last mantissa bit is the lowest bit of the scaled integer).
template <int MantissaBits, int MinNormalExponent>
FS_HOST_DEVICE inline float round_minifloat(float v, float max) {
  const float a = fminf(fabsf(v), max);
  int e = ilogbf(a);  // a very negative number for a == 0: any spacing rounds 0 to 0
  if (e < MinNormalExponent) e = MinNormalExponent;
  const int shift = MantissaBits - e;
  return copysignf(ldexpf(rintf(ldexpf(a, shift)), -shift), v);
}

FS_HOST_DEVICE inline float round_e4m3(float v) {
  return round_minifloat<3, -6>(v, kE4M3Max);
}
FS_HOST_DEVICE inline float round_e2m1(float v) {
  return round_minifloat<1, 0>(v, kE2M1Max);
}

// k = ceil(log2(amax / max)) exactly (amax > 0, max > 0): the smallest k with amax <= max * 2^k.
// With amax = ma * 2^ea and max = mm * 2^em (ma, mm in [1, 2)) the answer is ea - em or one more.
FS_HOST_DEVICE inline int scale_exponent(float amax, float max) {
  const int k = ilogbf(amax) - ilogbf(max);
  return amax > ldexpf(max, k) ? k + 1 : k;
}

// The official graph's FP8 KV block: scale 2^k, k = scale_exponent(max(amax, 1e-4), 448), and
// x <- E4M3(x / 2^k) * 2^k (E4M3 clamps at +-448, never reached with this k).
FS_HOST_DEVICE inline int fp8_block_exponent(float amax) {
  return scale_exponent(fmaxf(amax, kFp8AmaxFloor), kE4M3Max);
}
FS_HOST_DEVICE inline float fp8_simulate(float x, int k) {
  return ldexpf(round_e4m3(ldexpf(x, -k)), k);
}

// The official graph's FP4 indexer block: scale 2^k, k = scale_exponent(amax, 6), and
// x <- E2M1(x / 2^k) * 2^k.
FS_HOST_DEVICE inline int fp4_block_exponent(float amax) {
  return scale_exponent(fmaxf(amax, kFp4AmaxFloor), kE2M1Max);
}
FS_HOST_DEVICE inline float fp4_simulate(float x, int k) {
  return ldexpf(round_e2m1(ldexpf(x, -k)), k);
}

}  // namespace fs::quant_sim
