#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "tensor/dtype.h"

namespace fs {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI64, DType::kI32,
                  DType::kU8, DType::kI8, DType::kF8E8M0}) {
    const auto back = dtype_from_name(dtype_name(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
  }
  EXPECT_FALSE(dtype_from_name("F64").has_value());
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  // DeepSeek V4's official storage types: one byte each, neither widened as a float.
  EXPECT_EQ(dtype_from_name("F8_E8M0"), DType::kF8E8M0);
  EXPECT_EQ(dtype_from_name("I8"), DType::kI8);
  EXPECT_EQ(dtype_size(DType::kF8E8M0), 1u);
  EXPECT_FALSE(dtype_is_float(DType::kF8E8M0));
  EXPECT_FALSE(dtype_is_float(DType::kI8));
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is a tie between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16AndF8Decode) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);    // exponent 7 = bias
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(f8e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
}

// The e4m3 decode (tensor/fp8_e4m3.h, which the CPU and, before sm_89, the FP8 kernels use) is
// the format's definition on every byte: (1 + m/8) * 2^(e-7), subnormals m/8 * 2^-6, 0x7f/0xff
// NaN, both signs of zero.
TEST(DType, E4m3DecodeIsTheFormatsDefinitionOnEveryByte) {
  for (unsigned b = 0; b < 256; ++b) {
    const int e = static_cast<int>((b >> 3) & 0xf), m = static_cast<int>(b & 7);
    const float magnitude = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
    const float want = (b & 0x80) != 0 ? -magnitude : magnitude;
    const float got = f8e4m3_to_f32(static_cast<std::uint8_t>(b));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << b;
  }
  EXPECT_EQ(std::bit_cast<std::uint32_t>(f8e4m3_to_f32(0x80)), 0x80000000u);  // -0
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));  // the largest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));         // the smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0xfe), -448.0f);
}

TEST(DType, ConvertToF32) {
  const std::uint16_t bf[3] = {0x3f80, 0x4000, 0xbf80};
  float out[3];
  convert_to_f32(DType::kBF16, bf, out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], -1.0f);
}

}  // namespace
}  // namespace fs
