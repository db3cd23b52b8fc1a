#include "tensor/quant/minifloat.h"

#include <cmath>
#include <cstring>

namespace fs::quant {
namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

float float_of(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// |f| < 480 rounded to the nearest E4M3 code (0x00..0x7f), ties to even.
std::uint8_t e4m3_magnitude(std::uint32_t abs_bits) {
  constexpr std::uint32_t kMinNormal = 121u << 23;  // 2^-6
  if (abs_bits < kMinNormal) {
    // Subnormal range: multiples of 2^-9. Scaling by 2^9 is exact, so rounding the scaled value
    // to an integer is the one rounding (8 becomes 0x08, the smallest normal).
    const float scaled = float_of(abs_bits) * 512.0f;
    return static_cast<std::uint8_t>(std::nearbyint(scaled));
  }
  // Normal: keep 3 of f32's 23 mantissa bits, rounding the 20 dropped ones to nearest even,
  // then rebias the exponent from 127 to 7. A mantissa that rounds up carries into the exponent.
  const std::uint32_t odd = (abs_bits >> 20) & 1u;
  const std::uint32_t rounded = abs_bits + 0x7ffffu + odd;
  return static_cast<std::uint8_t>((rounded >> 20) - ((127u - 7u) << 3));
}

}  // namespace

std::uint8_t f32_to_e4m3(float f) {
  const std::uint32_t b = bits_of(f);
  const auto sign = static_cast<std::uint8_t>((b >> 24) & 0x80u);
  const std::uint32_t abs_bits = b & 0x7fffffffu;
  constexpr std::uint32_t k480 = 0x43f00000u;  // also above every infinity and NaN pattern's
  if (abs_bits >= k480) return sign | 0x7f;
  return sign | e4m3_magnitude(abs_bits);
}

std::uint8_t f32_to_e4m3_saturate(float f) {
  const std::uint32_t b = bits_of(f);
  const auto sign = static_cast<std::uint8_t>((b >> 24) & 0x80u);
  const std::uint32_t abs_bits = b & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7f;  // NaN
  constexpr std::uint32_t k448 = 0x43e00000u;
  if (abs_bits >= k448) return sign | 0x7e;
  return sign | e4m3_magnitude(abs_bits);
}

float e8m0_to_f32(std::uint8_t e) {
  if (e == 0xff) return float_of(0x7fc00000u);
  // 2^-127 is below f32's smallest normal: it is the subnormal with mantissa bit 22 set.
  if (e == 0) return float_of(0x00400000u);
  return float_of(static_cast<std::uint32_t>(e) << 23);
}

float e2m1_to_f32(std::uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7];
  return (code & 8) ? -m : m;
}

std::uint8_t f32_to_e2m1(float f) {
  if (std::isnan(f)) return 0;
  const std::uint8_t sign = std::signbit(f) ? 8 : 0;
  const float a = std::fabs(f);
  // The midpoints between neighbouring magnitudes; at a midpoint the even code (the one whose
  // mantissa bit is 0) wins, so "<=" where the lower code is even and "<" where it is odd.
  std::uint8_t code;
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.0f) {
    code = 6;
  } else {
    code = 7;
  }
  return sign | code;
}

}  // namespace fs::quant
