// The packed weight formats as the CUDA kernels decode them, in registers (backend/weight.h):
// FP4 E2M1 with per-32 E8M0 scales and the GGUF block types Q8_0, Q2_K, Q4_K, Q5_K, Q6_K and
// IQ2_XXS.
//
// A row of a packed matrix is cut into chunks, the unit one thread loads and decodes at a time:
// `load` reads a chunk's bytes (all its loads issued together, so several chunks can be in
// flight), `factors` unpacks them, and `column(c, run)` says where run `run` (32 consecutive
// weights) of chunk c sits in the row; weight run * 32 + i is column column(c, run) + i. Chunks
// follow the block layouts (tensor/quant/k_quants.cpp reads the same bytes) so that a chunk's bytes
// are contiguous and its x columns come in runs of 32.
//
// `factors` gives a group of 16 weights as a * v_i (- b): v_i the small exact values the block
// stores (integers, E2M1 values), a and b the group's f32 factors. The GEMVs take that form
// (session 22): a group's dot product is a * (sum v_i x_i) (- b * sum x_i), one FMA a weight once
// its integer is out, and every token of a 1-4-token GEMV sums alike; prefill's tensor-core tiles
// multiply the v_i (exact in bf16) and apply the factors to each group's sum
// (cuda_grouped_packed.cu). `decode` recombines the factors with one rounding a product and one a
// difference (__fmul_rn /
// __fsub_rn: no contraction into an FMA), the CPU dequantiser's order, so a decoded weight is the
// CPU's bit for bit (the f32 tiles of the sgemm fallback, the host tests). kHasMin: the format
// subtracts b (the K-quants' mins).
#pragma once

#include <cstdint>

namespace fs::cuda::packed {

// An f16's value, exactly (by its bits: once per block, so the integer form costs nothing, and
// the header needs no CUDA types, which lets tests/unit/test_packed_decoders.cpp run it on the
// host).
__device__ __forceinline__ float f16(unsigned short h) {
  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e != 0) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
  const float v = static_cast<float>(m) * 0x1p-24f;  // subnormal or zero: m * 2^-24, exact
  return sign != 0 ? -v : v;
}
__device__ __forceinline__ unsigned byte_of(const uint4& v, int i) {
  const unsigned w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return (w >> (8 * (i % 4))) & 0xffu;
}
// v < 2^23 as a float, exactly, on the FP32 pipe: the float 2^23 + v (v in its mantissa) less
// 2^23. The same value as static_cast<float>(v), which takes a conversion instruction at a quarter
// of the FP32 rate on Hopper; the decoders convert every weight (session 22: the packed GEMVs
// were bound by their instructions, bench/NOTES.md session 9). `bias` (< 2^23) comes off too:
// exact_float(v, b) is v - b, exact.
__device__ __forceinline__ float exact_float(unsigned v, unsigned bias = 0) {
  return __uint_as_float(0x4b000000u | v) - __uint_as_float(0x4b000000u | bias);
}
// Byte k of w as an exact float less `bias` (< 2^23): exact_float(byte, bias) with the byte moved
// into the mantissa of 2^23 by one byte permute. The factors below unpack a word's four bytes at
// once (a mask or shift a word) and convert each with this, where shifting and masking each weight
// out of its byte kept the integer pipe 60% busy in the one-token Q4_K GEMV (ncu, session 23).
__device__ __forceinline__ float byte_float(unsigned w, int k, unsigned bias = 0) {
  return __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7540u + static_cast<unsigned>(k))) -
         __uint_as_float(0x4b000000u | bias);
}
__device__ __forceinline__ unsigned word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint4 ldg16(const std::uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
// k < 8: the 6-bit scale and min of sub-block k from Q4_K/Q5_K's 12 packed bytes (bytes 4..15 of
// the block, `head` bytes 4..15), as tensor/quant/k_quants.cpp unpacks them.
__device__ __forceinline__ void scale_min_6bit(const uint4& head, int k, int& scale, int& min) {
  auto s = [&](int i) { return static_cast<int>(byte_of(head, 4 + i)); };
  if (k < 4) {
    scale = s(k) & 63;
    min = s(k + 4) & 63;
  } else {
    scale = (s(k + 4) & 0x0f) | ((s(k - 4) >> 6) << 4);
    min = (s(k + 4) >> 4) | ((s(k) >> 6) << 4);
  }
}

// FP4 E2M1, two a byte (the first in the low nibble), with an E8M0 scale per 32 inputs: a chunk
// is one scale block, 16 bytes and its scale byte (the row's scales are `scale_row`).
struct Fp4 {
  static constexpr int kChunk = 32;
  static constexpr int kUnroll = 8;  // 16-byte loads in flight per thread
  struct Raw {
    uint4 q;
    unsigned scale;
  };
  __host__ __device__ static std::int64_t chunks(std::int64_t in) { return in / 32; }
  __device__ __forceinline__ static Raw load(const std::uint8_t* row, const std::uint8_t* scales,
                                             std::int64_t c) {
    return {ldg16(row + 16 * c), __ldg(scales + c)};
  }
  __device__ __forceinline__ static float e8m0(unsigned e) {
    if (e == 0xffu) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(e == 0 ? 0x00400000u : e << 23);  // 2^-127 is a subnormal
  }
  __device__ __forceinline__ static float e2m1(unsigned code) {
    // 0, 0.5, 1, 1.5, 2, 3, 4, 6: exponent field e (bias 1) and mantissa bit m, moved into an
    // f32's fields (2^(e-1) * (1 + m/2); e = 0: m/2, which is 0.5 or 0), bits only.
    const unsigned e = (code >> 1) & 3u, m = code & 1u;
    const unsigned mag = e == 0 ? (m != 0 ? 0x3f000000u : 0u) : ((e + 126u) << 23) | (m << 22);
    return __uint_as_float(((code & 8u) << 28) | mag);
  }
  static constexpr bool kHasMin = false;
  __device__ __forceinline__ static void factors(const Raw& r, float (&v)[kChunk],
                                                 float (&a)[kChunk / 16], float (&)[kChunk / 16]) {
    a[0] = a[1] = e8m0(r.scale);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const unsigned b = byte_of(r.q, i);
      v[2 * i] = e2m1(b & 0x0fu);
      v[2 * i + 1] = e2m1(b >> 4);
    }
  }
  __device__ __forceinline__ static std::int64_t column(std::int64_t c, int) {
    return 32 * c;
  }
};

// Q8_0, 34-byte blocks of 32: an f16 scale d, 32 signed bytes; w = q * d. A chunk is a block
// (2-byte aligned only: read as 17 halfwords).
struct Q8_0 {
  static constexpr int kChunk = 32;
  static constexpr int kUnroll = 2;
  struct Raw {
    unsigned short h[17];
  };
  __host__ __device__ static std::int64_t chunks(std::int64_t in) { return in / 32; }
  __device__ __forceinline__ static Raw load(const std::uint8_t* row, const std::uint8_t*,
                                             std::int64_t c) {
    const auto* p = reinterpret_cast<const unsigned short*>(row + 34 * c);
    Raw r;
#pragma unroll
    for (int i = 0; i < 17; ++i) r.h[i] = __ldg(p + i);
    return r;
  }
  static constexpr bool kHasMin = false;
  __device__ __forceinline__ static void factors(const Raw& r, float (&v)[kChunk],
                                                 float (&a)[kChunk / 16], float (&)[kChunk / 16]) {
    a[0] = a[1] = f16(r.h[0]);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      // A signed byte b is (b ^ 0x80) - 128. (Kept byte by byte: the word-at-a-time form of
      // the other formats measured level at one token and 20% slower at four, session 23.)
      const unsigned q = r.h[1 + i];
      v[2 * i] = exact_float((q & 0xffu) ^ 0x80u, 128u);
      v[2 * i + 1] = exact_float(((q >> 8) & 0xffu) ^ 0x80u, 128u);
    }
  }
  __device__ __forceinline__ static std::int64_t column(std::int64_t c, int) {
    return 32 * c;
  }
};

// Q4_K (144 bytes / 256: d, dmin, 12 scale bytes, qs[128]) and Q5_K (176: the same with qh[32]
// before qs). A chunk is sub-blocks 2p and 2p+1 (64 consecutive weights), which share qs bytes
// 32p..32p+31 (low nibbles, high nibbles); w = (d * scale) * q - (dmin * min). Blocks are
// 16-byte multiples, so every load is 16 bytes.
template <bool kFifthBit>
struct Q4Q5K {
  static constexpr int kChunk = 64;
  static constexpr int kUnroll = 2;
  static constexpr int kBytes = kFifthBit ? 176 : 144;
  struct Raw {
    uint4 head;   // d, dmin, scales
    uint4 q[2];   // qs bytes 32p..32p+31
    uint4 qh[2];  // Q5_K: qh[32]
    int p;
  };
  __host__ __device__ static std::int64_t chunks(std::int64_t in) { return in / 64; }
  __device__ __forceinline__ static Raw load(const std::uint8_t* row, const std::uint8_t*,
                                             std::int64_t c) {
    const std::uint8_t* blk = row + (c / 4) * kBytes;
    Raw r;
    r.p = static_cast<int>(c % 4);
    r.head = ldg16(blk);
    const std::uint8_t* qs = blk + (kFifthBit ? 48 : 16) + 32 * r.p;
    r.q[0] = ldg16(qs);
    r.q[1] = ldg16(qs + 16);
    if constexpr (kFifthBit) {
      r.qh[0] = ldg16(blk + 16);
      r.qh[1] = ldg16(blk + 32);
    } else {
      r.qh[0] = r.qh[1] = uint4{};
    }
    return r;
  }
  static constexpr bool kHasMin = true;
  __device__ __forceinline__ static void factors(const Raw& r, float (&v)[kChunk],
                                                 float (&a)[kChunk / 16], float (&b)[kChunk / 16]) {
    const float d = f16(static_cast<unsigned short>(r.head.x & 0xffffu));
    const float dmin = f16(static_cast<unsigned short>(r.head.x >> 16));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int k = 2 * r.p + half;
      int scale = 0, min = 0;
      scale_min_6bit(r.head, k, scale, min);
      a[2 * half] = a[2 * half + 1] = __fmul_rn(d, static_cast<float>(scale));
      b[2 * half] = b[2 * half + 1] = __fmul_rn(dmin, static_cast<float>(min));
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        // qs bytes 4i..4i+3: their nibbles of this sub-block (and Q5_K's bit k of qh).
        unsigned q = (word_of(r.q[i / 4], i % 4) >> (4 * half)) & 0x0f0f0f0fu;
        if constexpr (kFifthBit) q |= ((word_of(r.qh[i / 4], i % 4) >> k) & 0x01010101u) << 4;
#pragma unroll
        for (int j = 0; j < 4; ++j) v[32 * half + 4 * i + j] = byte_float(q, j);
      }
    }
  }
  __device__ __forceinline__ static std::int64_t column(std::int64_t c, int run) {
    return 64 * c + 32 * run;
  }
};
using Q4_K = Q4Q5K<false>;
using Q5_K = Q4Q5K<true>;

// Q6_K, 210 bytes / 256: ql[128], qh[64], 16 signed scales, d; w = (d * scale) * (q - 32). A
// chunk is groups g and g+2 (g < 2) of half h: the 32 ql bytes 64h + 32g.. (low nibbles for group
// g, high for g+2) and the 32 qh bytes 32h.. (bits 2g and 2g+4); its weights are the runs at
// 128h + 32g and 128h + 32g + 64. Blocks are 2-byte aligned: halfword loads.
struct Q6_K {
  static constexpr int kChunk = 64;
  static constexpr int kUnroll = 2;
  struct Raw {
    unsigned short ql[16], qh[16];
    unsigned short sc[2];  // scales 8h + 2g, +1 and 8h + 2g + 4, +5
    unsigned short d;
    int g;
  };
  __host__ __device__ static std::int64_t chunks(std::int64_t in) { return in / 64; }
  __device__ __forceinline__ static Raw load(const std::uint8_t* row, const std::uint8_t*,
                                             std::int64_t c) {
    const std::uint8_t* blk = row + (c / 4) * 210;
    const int h = static_cast<int>(c % 4) / 2;
    Raw r;
    r.g = static_cast<int>(c % 2);
    const auto* ql = reinterpret_cast<const unsigned short*>(blk + 64 * h + 32 * r.g);
    const auto* qh = reinterpret_cast<const unsigned short*>(blk + 128 + 32 * h);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      r.ql[i] = __ldg(ql + i);
      r.qh[i] = __ldg(qh + i);
    }
    const auto* sc = reinterpret_cast<const unsigned short*>(blk + 192 + 8 * h + 2 * r.g);
    r.sc[0] = __ldg(sc);
    r.sc[1] = __ldg(sc + 2);
    r.d = __ldg(reinterpret_cast<const unsigned short*>(blk + 208));
    return r;
  }
  static constexpr bool kHasMin = false;
  __device__ __forceinline__ static void factors(const Raw& r, float (&v)[kChunk],
                                                 float (&a)[kChunk / 16], float (&)[kChunk / 16]) {
    const float d = f16(r.d);
#pragma unroll
    for (int run = 0; run < 2; ++run) {
      const int g = r.g + 2 * run;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const auto sc = static_cast<signed char>((r.sc[run] >> (8 * half)) & 0xffu);
        a[2 * run + half] = __fmul_rn(d, static_cast<float>(sc));
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        // ql and qh bytes 4i..4i+3: the low nibbles (run 0) or high (run 1), and bits 2g, 2g+1.
        const unsigned lw = r.ql[2 * i] | (static_cast<unsigned>(r.ql[2 * i + 1]) << 16);
        const unsigned hw = r.qh[2 * i] | (static_cast<unsigned>(r.qh[2 * i + 1]) << 16);
        const unsigned low = (run == 0 ? lw : lw >> 4) & 0x0f0f0f0fu;
        const unsigned q = low | (((hw >> (2 * g)) & 0x03030303u) << 4);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[32 * run + 4 * i + j] = byte_float(q, j, 32u);
      }
    }
  }
  __device__ __forceinline__ static std::int64_t column(std::int64_t c, int run) {
    return 256 * (c / 4) + 128 * ((c % 4) / 2) + 32 * (c % 2) + 64 * run;
  }
};

// Q2_K, 84 bytes / 256: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin;
// w = (d * scale) * q - (dmin * min). A chunk is the 32 weights 128h + 32j..: qs bytes 32h..
// at bit 2j, scales 8h + 2j and +1. Blocks are 4-byte aligned: word loads.
struct Q2_K {
  static constexpr int kChunk = 32;
  static constexpr int kUnroll = 4;
  struct Raw {
    unsigned q[8];
    unsigned d_dmin;
    unsigned short sc;
    int j;
  };
  __host__ __device__ static std::int64_t chunks(std::int64_t in) { return in / 32; }
  __device__ __forceinline__ static Raw load(const std::uint8_t* row, const std::uint8_t*,
                                             std::int64_t c) {
    const std::uint8_t* blk = row + (c / 8) * 84;
    const int h = static_cast<int>(c % 8) / 4;
    Raw r;
    r.j = static_cast<int>(c % 4);
    const auto* q = reinterpret_cast<const unsigned*>(blk + 16 + 32 * h);
#pragma unroll
    for (int i = 0; i < 8; ++i) r.q[i] = __ldg(q + i);
    r.d_dmin = __ldg(reinterpret_cast<const unsigned*>(blk + 80));
    r.sc = __ldg(reinterpret_cast<const unsigned short*>(blk + 8 * h + 2 * r.j));
    return r;
  }
  static constexpr bool kHasMin = true;
  __device__ __forceinline__ static void factors(const Raw& r, float (&v)[kChunk],
                                                 float (&a)[kChunk / 16], float (&b)[kChunk / 16]) {
    const float d = f16(static_cast<unsigned short>(r.d_dmin & 0xffffu));
    const float dmin = f16(static_cast<unsigned short>(r.d_dmin >> 16));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const unsigned sc = (r.sc >> (8 * half)) & 0xffu;
      a[half] = __fmul_rn(d, static_cast<float>(sc & 0x0fu));
      b[half] = __fmul_rn(dmin, static_cast<float>(sc >> 4));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // qs bytes 16 half + 4i..: their 2 bits at 2j.
        const unsigned q = (r.q[4 * half + i] >> (2 * r.j)) & 0x03030303u;
#pragma unroll
        for (int j = 0; j < 4; ++j) v[16 * half + 4 * i + j] = byte_float(q, j);
      }
    }
  }
  __device__ __forceinline__ static std::int64_t column(std::int64_t c, int) {
    return 32 * c;
  }
};

// IQ2_XXS, 66 bytes / 256: d, then 8 groups of 8 bytes, one per 32 weights (tensor/quant/
// iq2_xxs.cpp): four codebook indices, then a u32 of four 7-bit sign fields and a 4-bit scale s;
// w = ±((d * (0.5 + s) * 0.25) * m). A chunk is a group (2-byte aligned: halfword loads); the
// codebook points are read from `grid` (the 2 KB table, cached).
struct IQ2_XXS {
  static constexpr int kChunk = 32;
  static constexpr int kUnroll = 4;
  struct Raw {
    unsigned short q[4];
    unsigned short d;
    const std::uint64_t* grid;
  };
  __host__ __device__ static std::int64_t chunks(std::int64_t in) { return in / 32; }
  __device__ __forceinline__ static Raw load(const std::uint8_t* row, const std::uint8_t* grid,
                                             std::int64_t c) {
    const std::uint8_t* blk = row + (c / 8) * 66;
    const auto* g = reinterpret_cast<const unsigned short*>(blk + 2 + 8 * (c % 8));
    Raw r;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = __ldg(g + i);
    r.d = __ldg(reinterpret_cast<const unsigned short*>(blk));
    r.grid = reinterpret_cast<const std::uint64_t*>(grid);
    return r;
  }
  static constexpr bool kHasMin = false;
  __device__ __forceinline__ static void factors(const Raw& r, float (&v)[kChunk],
                                                 float (&a)[kChunk / 16], float (&)[kChunk / 16]) {
    if (r.grid == nullptr) {  // a row that is not there
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = 0.0f;
      a[0] = a[1] = 0.0f;
      return;
    }
    const unsigned meta = r.q[2] | (static_cast<unsigned>(r.q[3]) << 16);
    a[0] = a[1] = __fmul_rn(__fmul_rn(f16(r.d), 0.5f + static_cast<float>(meta >> 28)), 0.25f);
#pragma unroll
    for (int point = 0; point < 4; ++point) {
      const unsigned index = (r.q[point / 2] >> (8 * (point % 2))) & 0xffu;
      const std::uint64_t magnitudes = __ldg(r.grid + index);
      const unsigned field = (meta >> (7 * point)) & 127u;
      const unsigned signs = field | ((__popc(field) & 1u) << 7);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float m = byte_float(static_cast<unsigned>(magnitudes >> (32 * (j / 4))), j % 4);
        v[8 * point + j] = ((signs >> j) & 1u) ? -m : m;
      }
    }
  }
  __device__ __forceinline__ static std::int64_t column(std::int64_t c, int) {
    return 32 * c;
  }
};

// A chunk's weights dequantised, the CPU's bit for bit (prefill's f32 tiles, the host tests): each
// group's factors recombined with one rounding a product and one a difference, a * v (- b), the
// order tensor/quant's dequantisers round in (test_packed_decoders checks every format).
template <typename F>
__device__ __forceinline__ void decode(const typename F::Raw& r, float (&w)[F::kChunk]) {
  float a[F::kChunk / 16], b[F::kChunk / 16];
  F::factors(r, w, a, b);
#pragma unroll
  for (int i = 0; i < F::kChunk; ++i) {
    const float product = __fmul_rn(a[i / 16], w[i]);
    w[i] = F::kHasMin ? __fsub_rn(product, b[i / 16]) : product;
  }
}

}  // namespace fs::cuda::packed
