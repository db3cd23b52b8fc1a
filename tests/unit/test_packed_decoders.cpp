// The CUDA kernels' packed-format decoders (src/backend/cuda/cuda_packed_formats.cuh) run on the
// host, against the quant module's dequantisers, bit for bit: every chunk of random rows of each
// format, through the decoders' own load/factors/column and `decode` (the factors recombined), so
// the device's block indexing and the factored form every kernel multiplies by are checked on
// every machine (the GPU suite, Cuda/QuantOps, then checks the kernels around them).
//
// The header is written for nvcc; here the CUDA qualifiers mean nothing and the few intrinsics it
// calls get their host meanings (a load is a load; __fmul_rn/__fsub_rn are one rounded product or
// difference, which this file, compiled without contraction, also computes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/quant/block_scaled.h"
#include "tensor/quant/dequantize.h"
#include "tensor/quant/iq2_xxs_grid.h"
#include "tensor/quant/quant_type.h"

// The CUDA spellings the header uses, as host code (qualifiers empty, intrinsics plain).
#define __device__
#define __host__
#define __forceinline__ inline
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 __ldg(const uint4* p) {
  return *p;
}
inline unsigned short __ldg(const unsigned short* p) {
  return *p;
}
inline unsigned __ldg(const unsigned* p) {
  return *p;
}
inline unsigned char __ldg(const unsigned char* p) {
  return *p;
}
inline std::uint64_t __ldg(const std::uint64_t* p) {
  return *p;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// PRMT: result byte i is byte (nibble i of s, 0-7) of y:x (the sign-replicating mode, bit 3 of a
// nibble, is not used by the header).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const std::uint64_t v = (static_cast<std::uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline unsigned __popc(unsigned v) {
  return static_cast<unsigned>(__builtin_popcount(v));
}

#include "backend/cuda/cuda_packed_formats.cuh"

namespace fs::cuda::packed {
namespace {

using Q = quant::QuantType;

bool same(float a, float b) {
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

TEST(PackedDecoders, F16EqualsTheHostConversionForEveryBitPattern) {
  for (unsigned h = 0; h < 65536; ++h)
    ASSERT_TRUE(
        same(f16(static_cast<unsigned short>(h)), f16_to_f32(static_cast<std::uint16_t>(h))))
        << std::hex << h;
}

// Where the f16 factors sit in a block (set to finite values: random bits would make some
// infinite, which the comparison would pass but prove less).
std::vector<int> factor_offsets(Q t) {
  switch (t) {
    case Q::kQ8_0:
    case Q::kIQ2_XXS:
      return {0};
    case Q::kQ4_K:
    case Q::kQ5_K:
      return {0, 2};
    case Q::kQ6_K:
      return {208};
    case Q::kQ2_K:
      return {80, 82};
    default:
      return {};
  }
}

template <typename F>
void check_format(Q t, std::int64_t in, int rows, std::mt19937& g) {
  SCOPED_TRACE(std::string(quant::quant_name(t)));
  const bool fp4 = t == Q::kF4E2M1x2;
  const auto& info = quant::quant_info(t);
  const auto row_bytes = static_cast<std::size_t>(in / info.block_elements * info.block_bytes);
  std::vector<std::uint8_t> bytes(row_bytes * static_cast<std::size_t>(rows));
  std::vector<std::uint8_t> scales(static_cast<std::size_t>(rows * in / 32));
  for (auto& b : bytes) b = static_cast<std::uint8_t>(g());
  for (auto& s : scales) s = static_cast<std::uint8_t>(100 + g() % 50);
  for (std::size_t b = 0; b + static_cast<std::size_t>(info.block_bytes) <= bytes.size();
       b += static_cast<std::size_t>(info.block_bytes))
    for (const int off : factor_offsets(t)) {
      const auto v = static_cast<std::uint16_t>(((g() % 20 + 1) << 10) | (g() & 1023));
      std::memcpy(&bytes[b + static_cast<std::size_t>(off)], &v, 2);
    }
  quant::ScaledMatrix m;
  m.element = Q::kF4E2M1x2;
  m.rows = rows;
  m.cols = in;
  m.weights = bytes;
  m.scales = {quant::ScaleFormat::kE8M0, 1, 32, scales};
  for (int r = 0; r < rows; ++r) {
    std::vector<float> want(static_cast<std::size_t>(in)), got(want.size(), NAN);
    const auto st =
        fp4 ? quant::dequantize_row(m, r, want) : quant::dequantize_row(t, bytes, in, r, want);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const std::uint8_t* side =
        fp4                ? scales.data() + r * (in / 32)
        : t == Q::kIQ2_XXS ? reinterpret_cast<const std::uint8_t*>(quant::kIq2XxsGrid.data())
                           : nullptr;
    for (std::int64_t c = 0; c < F::chunks(in); ++c) {
      float w[F::kChunk];
      const auto raw = F::load(bytes.data() + static_cast<std::size_t>(r) * row_bytes, side, c);
      // decode is the factored form (a * v - b, each group's factors) recombined as the
      // dequantiser rounds: equal to it bit for bit, it shows the factors of every weight right.
      decode<F>(raw, w);
      for (int run = 0; run < F::kChunk / 32; ++run)
        for (int q = 0; q < 32; ++q)
          got[static_cast<std::size_t>(F::column(c, run) + q)] = w[32 * run + q];
    }
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_TRUE(same(got[i], want[i]))
          << "row " << r << " col " << i << ": " << got[i] << " vs " << want[i];
  }
  // A row that is not there (the kernels' zero Raw) decodes to zeros.
  float w[F::kChunk];
  decode<F>(typename F::Raw{}, w);
  for (const float x : w) EXPECT_EQ(x, 0.0f);
}

TEST(PackedDecoders, EqualTheQuantModuleBitForBit) {
  std::mt19937 g(5);
  check_format<Q8_0>(Q::kQ8_0, 512, 4, g);
  check_format<Q2_K>(Q::kQ2_K, 512, 4, g);
  check_format<Q4_K>(Q::kQ4_K, 512, 4, g);
  check_format<Q5_K>(Q::kQ5_K, 512, 4, g);
  check_format<Q6_K>(Q::kQ6_K, 512, 4, g);
  check_format<IQ2_XXS>(Q::kIQ2_XXS, 512, 4, g);
  check_format<Fp4>(Q::kF4E2M1x2, 512, 4, g);
}

}  // namespace
}  // namespace fs::cuda::packed
