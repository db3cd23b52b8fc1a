// The quantised-type table, the minifloats, and the block-scaled (FP8/FP4) layouts: properties
// that follow from the formats' definitions. Known answers from ggml and PyTorch are in
// test_quant_known_answers.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "tensor/quant/block_scaled.h"
#include "tensor/quant/dequantize.h"
#include "tensor/quant/iq2_xxs_grid.h"
#include "tensor/quant/minifloat.h"
#include "tensor/quant/quant_type.h"

namespace fs::quant {
namespace {

TEST(QuantType, TableLookups) {
  for (const auto* row = quant_table_begin(); row != quant_table_end(); ++row) {
    EXPECT_EQ(quant_info(row->type).name, row->name);
    EXPECT_EQ(quant_type_from_name(row->name), row->type);
    if (row->ggml_id >= 0) {
      EXPECT_EQ(quant_type_from_ggml(static_cast<std::uint32_t>(row->ggml_id)), row->type);
    }
    EXPECT_GT(row->block_elements, 0);
    EXPECT_GT(row->block_bytes, 0);
  }
  EXPECT_EQ(quant_type_from_name("q4_k"), QuantType::kQ4_K);
  EXPECT_FALSE(quant_type_from_ggml(4).has_value());         // Q4_2, removed from ggml
  EXPECT_FALSE(quant_type_from_name("Q4_K_M").has_value());  // a file mix, not a type
}

TEST(QuantType, RowBytesNeedWholeBlocks) {
  EXPECT_EQ(*row_bytes(QuantType::kQ4_K, 4096), 4096u / 256 * 144);
  EXPECT_EQ(*row_bytes(QuantType::kF4E2M1x2, 64), 32u);
  EXPECT_EQ(*row_bytes(QuantType::kBF16, 3), 6u);
  auto bad = row_bytes(QuantType::kQ8_0, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("Q8_0"), std::string::npos);
  EXPECT_NE(bad.status().message().find("32-weight blocks"), std::string::npos);
}

TEST(Minifloat, E4M3RoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = e4m3_to_f32(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v));
      EXPECT_EQ(f32_to_e4m3(v) & 0x7f, 0x7f);
      continue;
    }
    EXPECT_EQ(f32_to_e4m3(v), code) << c;
    EXPECT_EQ(f32_to_e4m3_saturate(v), code) << c;
  }
}

TEST(Minifloat, E4M3RoundingEdges) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // the tie between 448 and 480 goes to even (448)
  EXPECT_EQ(f32_to_e4m3(std::nextafter(464.0f, 500.0f)), 0x7f);  // rounds to 480: overflow, NaN
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xff);
  EXPECT_EQ(f32_to_e4m3_saturate(1e6f), 0x7e);
  EXPECT_EQ(f32_to_e4m3_saturate(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal: even
  EXPECT_EQ(f32_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // 1.5 ulp: to 2 (even)
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(1.0f + 1.0f / 16), 0x38);  // tie 1 / 1.125: to 1
  EXPECT_EQ(f32_to_e4m3(1.0f + 3.0f / 16), 0x3a);  // tie 1.125 / 1.25: to 1.25
}

TEST(Minifloat, E8M0AndE2M1) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  const float want[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_f32(static_cast<std::uint8_t>(c));
    EXPECT_EQ(v, c & 8 ? -want[c & 7] : want[c & 7]);
    EXPECT_EQ(f32_to_e2m1(v), c == 8 ? 8 : c);  // -0 keeps its sign
  }
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
}

TEST(Iq2XxsGrid, PointsAreDistinctLatticePoints) {
  std::set<std::uint64_t> seen;
  for (const auto p : kIq2XxsGrid) {
    EXPECT_TRUE(seen.insert(p).second);
    for (int j = 0; j < 8; ++j) {
      const auto b = (p >> (8 * j)) & 0xff;
      EXPECT_TRUE(b == 0x08 || b == 0x19 || b == 0x2b) << std::hex << p;
    }
  }
}

TEST(Dequantize, RowIsTheSliceOfTheTensor) {
  // Three rows of 512 Q4_K weights with arbitrary bytes and finite scales.
  const std::int64_t cols = 512;
  const auto per_row = *row_bytes(QuantType::kQ4_K, cols);
  std::vector<std::uint8_t> m(per_row * 3);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<std::uint8_t>(i * 37 + 11);
  for (std::size_t b = 0; b < m.size(); b += 144) {
    m[b + 1] = 0x30;  // d, dmin: modest f16 values
    m[b + 3] = 0x2c;
  }
  auto whole = dequantize_tensor(QuantType::kQ4_K, {3, cols}, m);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  std::vector<float> row(cols);
  for (std::int64_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(dequantize_row(QuantType::kQ4_K, m, cols, r, row).ok());
    EXPECT_EQ(0, std::memcmp(row.data(), whole->data() + r * cols, cols * sizeof(float)));
  }
  EXPECT_FALSE(dequantize_row(QuantType::kQ4_K, m, cols, 3, row).ok());
  EXPECT_FALSE(dequantize_tensor(QuantType::kQ4_K, {3, 500}, m).ok());
  EXPECT_FALSE(dequantize_tensor(QuantType::kQ4_K, {2, cols}, m).ok());
  auto unsupported_type =
      dequantize_tensor(QuantType::kQ3_K, {1, 256}, std::vector<std::uint8_t>(110));
  ASSERT_FALSE(unsupported_type.ok());
  EXPECT_NE(unsupported_type.status().message().find("Q3_K"), std::string::npos);
}

TEST(BlockScaled, Fp8ScaleInvBlocksWithPartialEdges) {
  // [130, 200] E4M3 weights, all 1.0 (0x38): the output is each weight's block scale.
  const std::int64_t rows = 130, cols = 200;
  std::vector<std::uint8_t> w(rows * cols, 0x38);
  const std::vector<float> scale = {1, 2, 3, 4};  // [2, 2]
  ScaledMatrix m{QuantType::kF8E4M3,
                 rows,
                 cols,
                 w,
                 {ScaleFormat::kF32,
                  128,
                  128,
                  {reinterpret_cast<const std::uint8_t*>(scale.data()), scale.size() * 4}}};
  auto out = dequantize(m);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0], 1.0f);
  EXPECT_EQ((*out)[127], 1.0f);
  EXPECT_EQ((*out)[128], 2.0f);
  EXPECT_EQ((*out)[199], 2.0f);
  EXPECT_EQ((*out)[128 * cols], 3.0f);
  EXPECT_EQ((*out)[129 * cols + 199], 4.0f);

  m.scales.bytes = m.scales.bytes.first(12);
  auto bad = dequantize(m);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[2, 2] grid"), std::string::npos)
      << bad.status().message();
}

TEST(BlockScaled, Fp4PairsLowNibbleFirstWithE8M0Per32) {
  // One row of 64: bytes 0x21 hold (1: 0.5, 2: 1.0); scales 2^1 then 2^-1.
  std::vector<std::uint8_t> w(32, 0x21);
  const std::vector<std::uint8_t> s = {128, 126};
  ScaledMatrix m{QuantType::kF4E2M1x2, 1, 64, w, {ScaleFormat::kE8M0, 1, 32, s}};
  auto out = dequantize(m);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0], 1.0f);
  EXPECT_EQ((*out)[1], 2.0f);
  EXPECT_EQ((*out)[32], 0.25f);
  EXPECT_EQ((*out)[33], 0.5f);
  m.cols = 63;  // an odd row cannot be packed two per byte
  EXPECT_FALSE(dequantize(m).ok());
  m.cols = 64;
  m.element = QuantType::kQ4_K;
  EXPECT_FALSE(dequantize(m).ok());
}

}  // namespace
}  // namespace fs::quant
