// The official graph's numerics (backend/quant_simulation.h, Backend::fp8_e4m3_simulate and
// hadamard_fp4_simulate) against hand-worked values: E4M3 and E2M1 rounding (ties to even, the
// saturating clamp, subnormals), the power-of-two block scale (exactly ceil(log2(amax / max))),
// the FP8 1e-4 amax floor, the RoPE dims left alone, short blocks, and the Walsh-Hadamard
// rotation (Sylvester order, orthonormal: norms, dots and an involution). The rounding is also
// checked against the independent codecs of tensor/quant/minifloat.h. The CUDA kernels answer to
// the same values through the op-parity suite (test_backend_ops.cpp, exact tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/quant_simulation.h"
#include "tensor/quant/minifloat.h"

namespace fs {
namespace {

using quant_sim::round_e2m1;
using quant_sim::round_e4m3;
using quant_sim::scale_exponent;

Tensor row_of(const std::vector<float>& v) {
  return Tensor({1, static_cast<std::int64_t>(v.size())}, v);
}

TEST(QuantSimulation, E4M3RoundsToNearestTiesToEven) {
  EXPECT_EQ(round_e4m3(1.0f), 1.0f);
  EXPECT_EQ(round_e4m3(1.05f), 1.0f);
  EXPECT_EQ(round_e4m3(1.07f), 1.125f);
  // Midpoints go to the even mantissa: 1.0625 between 1 (m 0) and 1.125 (m 1), 1.1875 between
  // 1.125 (m 1) and 1.25 (m 2); 17 between 16 and 18, 19 between 18 and 20 (spacing 2).
  EXPECT_EQ(round_e4m3(1.0625f), 1.0f);
  EXPECT_EQ(round_e4m3(1.1875f), 1.25f);
  EXPECT_EQ(round_e4m3(17.0f), 16.0f);
  EXPECT_EQ(round_e4m3(19.0f), 20.0f);
  EXPECT_EQ(round_e4m3(-19.0f), -20.0f);
  // A carry into the next binade: 15.5 is between 15 and 16 (spacing 1): to 16 (even).
  EXPECT_EQ(round_e4m3(15.5f), 16.0f);
  // Subnormals k * 2^-9 (below the smallest normal 2^-6): 1.5 * 2^-9 ties to 2 * 2^-9, 2^-10
  // (half the smallest) to 0.
  EXPECT_EQ(round_e4m3(std::ldexp(1.5f, -9)), std::ldexp(1.0f, -8));
  EXPECT_EQ(round_e4m3(std::ldexp(1.0f, -10)), 0.0f);
  EXPECT_EQ(round_e4m3(std::ldexp(1.01f, -10)), std::ldexp(1.0f, -9));
  EXPECT_EQ(round_e4m3(std::ldexp(7.0f, -9)), std::ldexp(7.0f, -9));
  EXPECT_EQ(round_e4m3(0.0f), 0.0f);
}

TEST(QuantSimulation, E4M3ClampsAt448) {
  EXPECT_EQ(round_e4m3(448.0f), 448.0f);
  EXPECT_EQ(round_e4m3(440.0f), 448.0f);  // spacing 32 above 256: 440 is nearer 448
  // Midpoints at the top: 432 between 416 (m 5) and 448 (m 6), 400 between 384 (m 4) and 416.
  EXPECT_EQ(round_e4m3(432.0f), 448.0f);
  EXPECT_EQ(round_e4m3(400.0f), 384.0f);
  // Beyond the largest value: the clamp, never NaN (torch's cast would give NaN past 464).
  EXPECT_EQ(round_e4m3(464.0f), 448.0f);
  EXPECT_EQ(round_e4m3(500.0f), 448.0f);
  EXPECT_EQ(round_e4m3(-1e30f), -448.0f);
  EXPECT_EQ(round_e4m3(std::numeric_limits<float>::infinity()), 448.0f);
}

TEST(QuantSimulation, E2M1RoundsToNearestTiesToEven) {
  // The values 0, .5, 1, 1.5, 2, 3, 4, 6; every midpoint goes to the even code.
  const std::vector<std::pair<float, float>> expect = {
      {0.25f, 0.0f}, {0.26f, 0.5f}, {0.75f, 1.0f}, {1.25f, 1.0f},  {1.75f, 2.0f},
      {2.5f, 2.0f},  {2.6f, 3.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},   {5.5f, 6.0f},
      {6.0f, 6.0f},  {7.0f, 6.0f},  {1e9f, 6.0f},  {-2.6f, -3.0f}, {-0.25f, -0.0f}};
  for (const auto& [in, out] : expect) EXPECT_EQ(round_e2m1(in), out) << in;
}

// The rounding equals the codecs tensor/quant/minifloat.h writes from the OCP specification:
// every code's value and the midpoints on either side, and random magnitudes.
TEST(QuantSimulation, RoundingEqualsTheMinifloatCodecs) {
  std::vector<float> probes;
  for (int code = 0; code <= 0x7e; ++code) {  // 0x7f is NaN
    const float v = quant::e4m3_to_f32(static_cast<std::uint8_t>(code));
    probes.insert(probes.end(), {v, std::nextafter(v, 0.0f), std::nextafter(v, 1000.0f)});
    if (code < 0x7e)
      probes.push_back((v + quant::e4m3_to_f32(static_cast<std::uint8_t>(code + 1))) / 2);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-12, 9);
  for (int i = 0; i < 20000; ++i) probes.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  for (const float p : probes) {
    for (const float v : {p, -p}) {
      EXPECT_EQ(round_e4m3(v), quant::e4m3_to_f32(quant::f32_to_e4m3_saturate(v))) << v;
      EXPECT_EQ(round_e2m1(v), quant::e2m1_to_f32(quant::f32_to_e2m1(v))) << v;
    }
  }
}

TEST(QuantSimulation, ScaleIsTheSmallestPowerOfTwoThatFits) {
  EXPECT_EQ(scale_exponent(448.0f, 448.0f), 0);
  EXPECT_EQ(scale_exponent(449.0f, 448.0f), 1);
  EXPECT_EQ(scale_exponent(7.0f, 448.0f), -6);  // 7 = 448 * 2^-6 exactly: fits at 2^-6
  EXPECT_EQ(scale_exponent(std::nextafter(7.0f, 8.0f), 448.0f), -5);
  EXPECT_EQ(scale_exponent(1.0f, 448.0f), -8);  // ceil(log2(1/448)) = ceil(-8.81)
  EXPECT_EQ(scale_exponent(6.0f, 6.0f), 0);
  EXPECT_EQ(scale_exponent(3.0f, 6.0f), -1);
  EXPECT_EQ(scale_exponent(3.1f, 6.0f), 0);
  EXPECT_EQ(scale_exponent(1e-4f, 448.0f), -22);  // the FP8 floor's scale
  // Everywhere: amax <= max * 2^k and amax > max * 2^(k-1) (exact in double).
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-60, 60);
  for (int i = 0; i < 20000; ++i) {
    const float a = std::ldexp(mantissa(rng), exponent(rng));
    for (const float max : {448.0f, 6.0f}) {
      const int k = scale_exponent(a, max);
      EXPECT_LE(a, std::ldexp(static_cast<double>(max), k)) << a;
      EXPECT_GT(a, std::ldexp(static_cast<double>(max), k - 1)) << a;
    }
  }
}

TEST(QuantSimulation, Fp8BlocksScaleByAPowerOfTwo) {
  auto be = make_cpu_backend();
  // amax 1: scale 2^-8, so 0.3 -> 76.8 -> 80 (spacing 8 in [64, 128)) -> 0.3125; 1 stays.
  // amax 7 = 448 * 2^-6: 0.1 -> 6.4 -> 6.5 (spacing 0.5) -> 0.1015625.
  Tensor x = row_of({1.0f, 0.3f, -0.3f, 0.0f, 7.0f, 0.1f, -7.0f, 0.0f});
  be->fp8_e4m3_simulate(x, 8, 4);
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  EXPECT_EQ(x.to_host_vector(),
            (std::vector<float>{1.0f, 0.3125f, -0.3125f, 0.0f, 7.0f, 0.1015625f, -7.0f, 0.0f}));
  // At amax 448 the scale is 1: the midpoints 17 and 19 go to the even 16 and 20.
  Tensor t = row_of({448.0f, 17.0f, 19.0f, -1.0625f});
  be->fp8_e4m3_simulate(t, 4, 64);
  EXPECT_EQ(t.to_host_vector(), (std::vector<float>{448.0f, 16.0f, 20.0f, -1.0f}));
}

// A block whose amax is below 1e-4 takes the scale of 1e-4 (2^-22): its values land among
// E4M3's subnormals (spacing 2^-9 * 2^-22 = 2^-31). Without the floor the block's own scale
// (2^-28) would keep 2^-32 exactly.
TEST(QuantSimulation, Fp8FloorsTheAmaxAt1e4) {
  auto be = make_cpu_backend();
  const float big = std::ldexp(1.0f, -20);
  Tensor x = row_of({big, std::ldexp(1.0f, -31), std::ldexp(1.0f, -32), std::ldexp(3.0f, -33), 0.0f,
                     0.0f, 0.0f, 0.0f});
  be->fp8_e4m3_simulate(x, 8, 4);
  EXPECT_EQ(x.to_host_vector(),
            (std::vector<float>{big, std::ldexp(1.0f, -31), 0.0f, std::ldexp(1.0f, -31), 0.0f, 0.0f,
                                0.0f, 0.0f}));
}

// Columns from `cols` on (the RoPE dims) are untouched; the last block of the span is short and
// has its own scale; a span narrower than the block is one block.
TEST(QuantSimulation, Fp8LeavesTheRopeDimsAndCutsTheLastBlock) {
  auto be = make_cpu_backend();
  std::vector<float> v(12);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.3f + 0.01f * static_cast<float>(i);
  v[0] = 400.0f;  // block [0, 8): scale 1; 400 ties to 384, 0.31 -> 0.3125 (spacing 2^-5)
  v[8] = 0.003f;
  v[9] = 0.0035f;
  Tensor x = row_of(v);
  be->fp8_e4m3_simulate(x, 10, 8);  // blocks [0, 8), [8, 10); columns 10, 11 untouched
  const auto got = x.to_host_vector();
  EXPECT_EQ(got[0], 384.0f);
  EXPECT_EQ(got[1], 0.3125f);
  // Block [8, 10) has its own scale: amax 0.0035, 2^ceil(log2(0.0035 / 448)) = 2^-16, so
  // 0.003 -> 196.6 -> 192 and 0.0035 -> 229.4 -> 224 (spacing 16). At block 0's scale 1 both
  // would be the subnormal 2 * 2^-9.
  EXPECT_EQ(got[8], 192.0f / 65536);
  EXPECT_EQ(got[9], 224.0f / 65536);
  EXPECT_EQ(got[10], v[10]);
  EXPECT_EQ(got[11], v[11]);
  // The fixture's KV row: 24 non-RoPE dims of 32, one block of 24 (min(64, 24)).
  std::vector<float> kv(32, 0.3f);
  kv[0] = 1.0f;
  Tensor k = row_of(kv);
  be->fp8_e4m3_simulate(k, 24, 64);
  const auto kq = k.to_host_vector();
  for (std::size_t i = 1; i < 24; ++i) EXPECT_EQ(kq[i], 0.3125f) << i;  // amax 1: scale 2^-8
  for (std::size_t i = 24; i < 32; ++i) EXPECT_EQ(kq[i], 0.3f) << i;
}

TEST(QuantSimulation, HadamardIsSylvesterOrderedAndOrthonormal) {
  auto be = make_cpu_backend();
  // H4 [1, 2, 3, 4] = [10, -2, -4, 0], / sqrt(4).
  Tensor x = row_of({1.0f, 2.0f, 3.0f, 4.0f});
  be->hadamard_fp4_simulate(x, 4, 0);
  EXPECT_EQ(x.to_host_vector(), (std::vector<float>{5.0f, -1.0f, -2.0f, 0.0f}));
  // Orthonormal: every unit vector maps to +-1/sqrt(n), norms and dots are kept, and the
  // normalised transform is its own inverse.
  constexpr std::int64_t n = 128;
  std::mt19937 rng(11);
  std::normal_distribution<float> d;
  Tensor a({3, n});
  for (auto& v : a.span()) v = d(rng);
  const auto before = a.to_host_vector();
  Tensor h = a;
  be->hadamard_fp4_simulate(h, n, 0);
  const auto after = h.to_host_vector();
  auto dot = [n](const std::vector<float>& u, std::int64_t i, const std::vector<float>& v,
                 std::int64_t j) {
    double s = 0;
    for (std::int64_t c = 0; c < n; ++c)
      s += static_cast<double>(u[static_cast<std::size_t>(i * n + c)]) *
           v[static_cast<std::size_t>(j * n + c)];
    return s;
  };
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      EXPECT_NEAR(dot(after, i, after, j), dot(before, i, before, j), 1e-4) << i << "," << j;
  be->hadamard_fp4_simulate(h, n, 0);
  const auto back = h.to_host_vector();
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], before[i], 1e-5) << i;
  Tensor e({1, n});
  e.data()[5] = 1.0f;
  be->hadamard_fp4_simulate(e, n, 0);
  for (const float v : e.to_host_vector())
    EXPECT_FLOAT_EQ(std::fabs(v), 1.0f / std::sqrt(static_cast<float>(n)));
  // Groups: a 128-wide block rotates each half of a 256-wide row on its own.
  Tensor two({1, 2 * n});
  two.data()[0] = 1.0f;
  be->hadamard_fp4_simulate(two, n, 0);
  EXPECT_EQ(two.to_host_vector()[n], 0.0f);
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
}

// Hadamard then FP4 (the inputs are H4 y / 2 for the y named, H4 / 2 being its own inverse).
TEST(QuantSimulation, HadamardThenFp4Blocks) {
  auto be = make_cpu_backend();
  // [1, 2, 3, 4] -> [5, -1, -2, 0]: amax 5, scale 2^ceil(log2(5/6)) = 1; 5 ties to 4.
  Tensor x = row_of({1.0f, 2.0f, 3.0f, 4.0f});
  be->hadamard_fp4_simulate(x, 4, 4);
  EXPECT_EQ(x.to_host_vector(), (std::vector<float>{4.0f, -1.0f, -2.0f, 0.0f}));
  // y = [3, 1.3, 0.2, 0.05] in FP4 blocks of 2: [3, 1.3] at scale 1/2 -> [6, 2.6] -> [6, 3];
  // [0.2, 0.05] at scale 2^-4 (amax 0.2) -> [3.2, 0.8] -> [3, 1].
  Tensor y = row_of({2.275f, 0.925f, 2.025f, 0.775f});
  be->hadamard_fp4_simulate(y, 4, 2);
  EXPECT_EQ(y.to_host_vector(), (std::vector<float>{3.0f, 1.5f, 0.1875f, 0.0625f}));
  // y = [3, 1.3, 2.9, 0.05] in FP4 blocks of 3: [3, 1.3, 2.9] -> [3, 1.5, 3], and the short
  // last block [0.05] alone at scale 2^-6 -> 3.2 -> 3.
  Tensor w = row_of({3.625f, 2.275f, 0.675f, -0.575f});
  be->hadamard_fp4_simulate(w, 4, 3);
  EXPECT_EQ(w.to_host_vector(), (std::vector<float>{3.0f, 1.5f, 3.0f, 0.046875f}));
  // An FP4 block stops at its Hadamard group: in groups of 1 (the identity) each value is its
  // own block, so 0.3 gets scale 2^-4 (4.8 -> 4: 0.25), not the 6's scale 1 (0.3 -> 0.5).
  Tensor z = row_of({6.0f, 0.3f, 0.3f, 0.0f});
  be->hadamard_fp4_simulate(z, 1, 32);
  EXPECT_EQ(z.to_host_vector(), (std::vector<float>{6.0f, 0.25f, 0.25f, 0.0f}));
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
}

TEST(QuantSimulation, BadShapesAreRecordedFailures) {
  auto be = make_cpu_backend();
  Tensor x({2, 12});
  be->hadamard_fp4_simulate(x, 12, 32);  // not a power of two
  EXPECT_FALSE(be->status().ok());
  be->clear_status();
  be->hadamard_fp4_simulate(x, 8, 32);  // does not divide the row
  EXPECT_FALSE(be->status().ok());
  be->clear_status();
  be->fp8_e4m3_simulate(x, 13, 64);  // past the row
  EXPECT_FALSE(be->status().ok());
}

}  // namespace
}  // namespace fs
