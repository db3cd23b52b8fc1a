// The streaming dot-product core shared by the few-row GEMV (cuda_linear.cu) and the fused routed
// experts (cuda_moe.cu). Decode at batch 1-8 is bound by the bytes of W read, so the core is built
// around keeping many 16-byte loads of W in flight: a group of kG threads takes kR weight rows,
// each thread issues kU chunks of every row before it uses the first, and the x rows (fp32, hot in
// L1) are read once per chunk for all kR rows, so S tokens cost one pass over W.
#pragma once

#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_packed_formats.cuh"
#include "tensor/fp8_e4m3.h"

namespace fs::cuda {

// W is read exactly once per call: skip L1 allocation so x and the routing tables keep it.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// One chunk of a weight row: 16 bytes (8 bf16 or 4 f32) when the row is 16-byte aligned and its
// length a multiple of the chunk (kVec), else one element.
template <typename T, bool kVec>
struct WeightChunk;

template <>
struct WeightChunk<bf16_bits, true> {
  static constexpr int kN = 8;
  static constexpr bool kScaled = false;
  static constexpr bool kDeferredScale = false;
  using Raw = uint4;
  __device__ __forceinline__ static Raw load(const bf16_bits* p) { return load_streaming(p); }
  __device__ __forceinline__ static void widen(const Raw& v, float (&f)[kN]) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};

template <>
struct WeightChunk<float, true> {
  static constexpr int kN = 4;
  static constexpr bool kScaled = false;
  static constexpr bool kDeferredScale = false;
  using Raw = uint4;
  __device__ __forceinline__ static Raw load(const float* p) { return load_streaming(p); }
  __device__ __forceinline__ static void widen(const Raw& v, float (&f)[kN]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};

// FP8 E4M3 weights (the FP8 releases' layout, backend/weight.h) are handled as their bytes; each
// 128x128 block has an f32 scale, and w = e4m3 * scale as the CPU's dequantiser computes it.
using e4m3_bits = std::uint8_t;
// The weights of an FP8 block of 128 columns: chunks never straddle a block (16 | 128).
constexpr int kFp8Block = 128;

// e4m3 byte b as the f32 whose bits are its sign and its 7 magnitude bits moved to the f32's top
// exponent/mantissa positions: for every b, normal or subnormal, that is exactly e4m3(b) * 2^-120
// (exponent bias 7 against 127; an e4m3 subnormal lands on the f32 subnormal of the same ratio).
// Two integer operations instead of a conversion; the 2^120 goes into the scale.
__device__ __forceinline__ float e4m3_times_2m120(unsigned b) {
  return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20));
}
// w = e4m3 * scale rounded once, as the CPU dequantiser's one f32 product: the product by
// scale * 2^120 is that same real product (the 2^120 is exact) unless scale * 2^120 overflows
// (scale >= 2^8, a block max above 114,688, which no checkpoint has), which takes two products,
// the first exact.
struct Fp8Scale {
  float hi;  // scale * 2^120
  float lo;  // scale
  bool big;  // hi overflowed
  __device__ __forceinline__ explicit Fp8Scale(float s)
      : hi(s * 0x1p120f), lo(s), big(isinf(s * 0x1p120f)) {}
  __device__ __forceinline__ float apply(unsigned b) const {
    const float v = e4m3_times_2m120(b);
    return big ? (v * 0x1p120f) * lo : v * hi;
  }
};

// Two e4m3 bytes (the low one first) as their exact values, by the hardware's conversion (one
// instruction for two weights on sm_89 and later; sessions 9-14 built e4m3 * 2^-8 from a byte
// permute, two masks, a shift and an or). Before sm_89, from the bytes' fields (tensor/fp8_e4m3.h):
// the same values, bit for bit (e4m3_pair_from_fields; CudaFp8.ThePairConversionEqualsTheFields).
__device__ __forceinline__ float2 e4m3_pair_from_fields(unsigned short two) {
  return make_float2(e4m3_value(two & 0xffu), e4m3_value(two >> 8));
}
__device__ __forceinline__ float2 e4m3_pair(unsigned short two) {
#if __CUDA_ARCH__ >= 890
  unsigned h;
  asm("{\n\t.reg .b16 t;\n\tmov.b16 t, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, t;\n\t}"
      : "=r"(h)
      : "h"(two));
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
#else
  return e4m3_pair_from_fields(two);
#endif
}

// A 16-byte chunk's 16 weights lie in one 128x128 block, so its dot product with x is summed from
// the exact e4m3 values and multiplied by the block's scale once (kDeferredScale): per weight half
// a conversion instruction and a half-to-float move, no product by the scale. Rounded differently
// from the CPU's w = e4m3 * scale product (within the op tests' tolerance); every CUDA kernel on
// FP8 weights goes through this chunk, so they agree bit for bit. (Until session 14 the pair was
// e4m3 * 2^-8 from integer operations, with the 2^8 in the scale: a power of two apart, so the
// sums round the same outside f32 subnormals.)
template <>
struct WeightChunk<e4m3_bits, true> {
  static constexpr int kN = 16;
  static constexpr bool kScaled = true;
  static constexpr bool kDeferredScale = true;
  static constexpr float kScaleFactor = 1.0f;  // the pairs are the weights themselves
  using Raw = uint4;
  __device__ __forceinline__ static Raw load(const e4m3_bits* p) { return load_streaming(p); }
  // Weights 4i..4i+3 of the chunk (word i): widened a word at a time, so only four are live.
  __device__ __forceinline__ static void widen_word(const Raw& v, int i, float (&f)[4]) {
    const unsigned u = i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
    const float2 lo = e4m3_pair(static_cast<unsigned short>(u & 0xffffu));
    const float2 hi = e4m3_pair(static_cast<unsigned short>(u >> 16));
    f[0] = lo.x;
    f[1] = lo.y;
    f[2] = hi.x;
    f[3] = hi.y;
  }
};

template <>
struct WeightChunk<e4m3_bits, false> {
  static constexpr int kN = 1;
  static constexpr bool kScaled = true;
  static constexpr bool kDeferredScale = false;
  using Raw = e4m3_bits;
  __device__ __forceinline__ static Raw load(const e4m3_bits* p) { return __ldg(p); }
  __device__ __forceinline__ static void widen(const Raw& v, float scale, float (&f)[kN]) {
    f[0] = Fp8Scale(scale).apply(v);
  }
};

template <typename T>
struct WeightChunk<T, false> {
  static constexpr int kN = 1;
  static constexpr bool kScaled = false;
  static constexpr bool kDeferredScale = false;
  using Raw = T;
  __device__ __forceinline__ static Raw load(const T* p) { return __ldg(p); }
  __device__ __forceinline__ static void widen(const Raw& v, float (&f)[kN]) {
    f[0] = fs::cuda::widen(v);
  }
};

// kN consecutive floats of x (16-byte aligned when kN > 1).
template <int kN>
__device__ __forceinline__ void load_x(const float* p, float (&f)[kN]) {
  if constexpr (kN == 1) {
    f[0] = *p;
  } else {
#pragma unroll
    for (int q = 0; q < kN; q += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + q);
      f[q] = v.x;
      f[q + 1] = v.y;
      f[q + 2] = v.z;
      f[q + 3] = v.w;
    }
  }
}

// x staged in shared memory. In rows_dot a lane's chunk c covers x[c * kN, (c + 1) * kN), so the
// lanes of a warp read x kN floats apart: for FP8 (kN = 16) one float4 request of the warp touches
// 16 cache lines and uses a quarter of each, and the L1, not DRAM, bounds the kernel (ncu on the
// H200: the out-projection at 72% of L1 against 16% of DRAM, bench/NOTES.md session 10). Staged,
// float4 i of chunk c sits at (c / kG * kN/4 + i) * kG + c % kG: for a given (round, i) the kG
// lanes of a group read kG consecutive float4s, which the shared memory serves at its full width.
// Staging reads x in order (float4 j by thread j), so the writes of a warp land as 4 runs of 8
// consecutive float4s, also full width. The sums are the same: only where x is read changes.
template <int kN, int kG>
struct StagedX {
  static_assert(kN % 4 == 0, "staging needs 16-byte chunks");
  static constexpr int kWords = kN / 4;  // float4s a chunk
  // The float4s one token takes: whole rounds of kG chunks.
  __host__ __device__ static constexpr std::int64_t token_words(std::int64_t chunks) {
    return (chunks + kG - 1) / kG * kG * kWords;
  }
  __device__ __forceinline__ static std::int64_t at(std::int64_t c, int i) {
    return (c / kG * kWords + i) * kG + c % kG;
  }
};

// The largest staged x: the default dynamic shared memory limit (no opt-in), which still lets 3
// blocks share a multiprocessor at the out-projections' 24 KB.
constexpr std::size_t kMaxStagedXBytes = 48 * 1024;
// The largest staged x of a launch that opts in to more
// (cudaFuncAttributeMaxDynamicSharedMemorySize, set once per kernel): the FP8 out-projections' 6144
// columns at the verify's 2-4 tokens, 96 KB at four, two blocks a multiprocessor (228 KB).
constexpr std::size_t kMaxStagedXOptInBytes = 96 * 1024;
// Token counts staged (batch 1 and the depth 1-3 verify); more tokens would mostly not fit.
constexpr int kMaxStagedTokens = 4;
template <int kS>
inline constexpr bool kMayStageX = kS <= kMaxStagedTokens;

extern __shared__ float4 staged_x[];

// Copies the kS token rows x + s * x_stride (chunks * kN floats each) into staged_x, the whole
// block, then a barrier: every thread of the block must call it.
template <int kN, int kG, int kS>
__device__ __forceinline__ void stage_x(const float* x, std::int64_t x_stride,
                                        std::int64_t chunks) {
  using L = StagedX<kN, kG>;
  const std::int64_t words = chunks * L::kWords, tw = L::token_words(chunks);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const auto* src = reinterpret_cast<const float4*>(x + s * x_stride);
    for (std::int64_t j = threadIdx.x; j < words; j += blockDim.x)
      staged_x[s * tw + L::at(j / L::kWords, static_cast<int>(j % L::kWords))] = src[j];
  }
  __syncthreads();
}

// The dynamic shared memory a kernel staging x for rows of `chunks` chunks takes, or 0 where it
// should not stage: not a 16-byte chunk path, more tokens than kMaxStagedTokens, rows shorter than
// a group (a lane with no chunk would miss the barrier), too large, or FLASHSERVE_CUDA_STAGE_X=0.
// Groups wider than a warp (a block a row) read each x float once a block anyway: nothing to gain.
// bf16 and f32 rows in warp-wide groups stage at one token only: their lanes read x 8 (4) floats
// apart, half the FP8 waste, and at 2-4 tokens the staging cost more than it saved (2-22% slower
// in cuda_kernel_bench --fp8 on the H200; FP8 gained 5-33% there, bench/NOTES.md session 11).
template <typename T, bool kVec, int kG, int kS>
inline constexpr bool kStagesX = kVec&& kMayStageX<kS>&& kG <= kWarp &&
                                 (WeightChunk<T, kVec>::kDeferredScale || kG < kWarp || kS == 1);

bool staged_x_enabled();
template <typename T, bool kVec, int kG, int kS>
std::size_t staged_x_launch_bytes(std::int64_t chunks, std::size_t cap = kMaxStagedXBytes) {
  static_assert(kStagesX<T, kVec, kG, kS>, "ask only where kStagesX allows staging");
  if (!staged_x_enabled() || chunks < kG) return 0;
  const auto bytes =
      static_cast<std::size_t>(kS) *
      static_cast<std::size_t>(StagedX<WeightChunk<T, kVec>::kN, kG>::token_words(chunks)) *
      sizeof(float4);
  return bytes <= cap ? bytes : 0;
}

// How rows_dot's kStagedX fills staged_x: by default stage_x copies x (xs[0]); a kernel that
// computes its x instead (the hyper-connection stream mix after hc_parts_kernel, cuda_fused.cu)
// passes a callable that writes staged_x in StagedX's layout, run by every thread of the block
// at the point stage_x would be and ending in a barrier.
struct StageXFromMemory {};

// acc[r][s] += this thread's share of rows[r] · x_{r,s}, over the chunks lane, lane + kG, ...
// below `chunks`; x_{r,s} = xs[r] + s * x_stride (kSameX: xs[0] for every r, read once per chunk
// for all rows). A null rows[r] loads nothing and adds zeros; its xs[r] must still be readable.
// Block-scaled weights (WeightChunk::kScaled) also take scale_rows[r], the scale-grid row of
// weight row r (a chunk's scale is its block column's); others ignore it (null).
// Not yet summed over the group (group_sum).
// kWaitFirst: a kernel launched overlapped (cuda_common.h) whose weights no kernel writes issues
// its first round of weight loads before wait_for_inputs, so that round trip overlaps the tail of
// the kernel before it; x and everything after are read once the wait has returned, which it has
// on every path out of here.
// kStagedX: x (xs[0], kSameX) is copied into shared memory (stage_x, in the dynamic shared memory
// staged_x_launch_bytes gave the launch) after the first round of weight loads, and read from
// there (or `stage` writes it, StageXFromMemory). Every thread of the block must call this, with
// lane < kG <= chunks.
template <typename T, bool kVec, int kS, int kR, int kG, int kU, bool kSameX,
          bool kWaitFirst = false, bool kStagedX = false, typename Stage = StageXFromMemory>
__device__ __forceinline__ void rows_dot(const T* const (&rows)[kR], const float* const (&xs)[kR],
                                         const float* const* scale_rows, std::int64_t x_stride,
                                         std::int64_t chunks, int lane, float (&acc)[kR][kS],
                                         const Stage& stage = {}) {
  using C = WeightChunk<T, kVec>;
  constexpr int kN = C::kN;
  static_assert(!kStagedX || (kSameX && kVec && kMayStageX<kS>),
                "staging takes one x, 16-byte chunks");
  // The 4 floats of x at chunk c, word i (floats 4i..4i+3) of token s for row r.
  using Staged = StagedX<kStagedX ? kN : 4, kG>;  // (unstaged one-element chunks: unused)
  [[maybe_unused]] const std::int64_t staged_tw = kStagedX ? Staged::token_words(chunks) : 0;
  const auto load_x4 = [&](int r, int s, std::int64_t c, int i, float(&xv)[4]) {
    if constexpr (kStagedX) {
      const float4 v = staged_x[s * staged_tw + Staged::at(c, i)];
      xv[0] = v.x;
      xv[1] = v.y;
      xv[2] = v.z;
      xv[3] = v.w;
    } else {
      load_x<4>(xs[r] + s * x_stride + c * kN + 4 * i, xv);
    }
  };
  for (std::int64_t c0 = lane; c0 < chunks; c0 += static_cast<std::int64_t>(kG) * kU) {
    typename C::Raw raw[kU][kR];
    [[maybe_unused]] float scale[kU][kR];
    // All loads first: kU * kR independent 16-byte requests per thread (and the scales).
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kG;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const bool live = c < chunks && rows[r] != nullptr;
        raw[u][r] = live ? C::load(rows[r] + c * kN) : typename C::Raw{};
        if constexpr (C::kDeferredScale)
          scale[u][r] = live ? __ldg(scale_rows[r] + c * kN / kFp8Block) * C::kScaleFactor : 0.0f;
        else if constexpr (C::kScaled)
          scale[u][r] = live ? __ldg(scale_rows[r] + c * kN / kFp8Block) : 0.0f;
      }
    }
    if constexpr (kWaitFirst || kStagedX) {
      if (c0 == lane) {
        if constexpr (kWaitFirst) {
          wait_for_inputs();
          release_dependents();
        }
        if constexpr (kStagedX) {
          if constexpr (std::is_same_v<Stage, StageXFromMemory>)
            stage_x<kN, kG, kS>(xs[0], x_stride, chunks);
          else
            stage();
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kG;
      if (c >= chunks) break;
      if constexpr (C::kDeferredScale) {
        // The chunk's dot products from zero, a word (4 weights) at a time, then one product by
        // the block scale each.
        float d[kR][kS] = {};
#pragma unroll
        for (int i = 0; i < kN / 4; ++i) {
          float w4[kR][4];
#pragma unroll
          for (int r = 0; r < kR; ++r) C::widen_word(raw[u][r], i, w4[r]);
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            float xv[4];
            if constexpr (kSameX) load_x4(0, s, c, i, xv);
#pragma unroll
            for (int r = 0; r < kR; ++r) {
              if constexpr (!kSameX) load_x4(r, s, c, i, xv);
#pragma unroll
              for (int q = 0; q < 4; ++q) d[r][s] = fmaf(w4[r][q], xv[q], d[r][s]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < kR; ++r)
#pragma unroll
          for (int s = 0; s < kS; ++s) acc[r][s] = fmaf(d[r][s], scale[u][r], acc[r][s]);
      } else {
        float w[kR][kN];
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          if constexpr (C::kScaled)
            C::widen(raw[u][r], scale[u][r], w[r]);
          else
            C::widen(raw[u][r], w[r]);
        }
#pragma unroll
        for (int s = 0; s < kS; ++s) {
          if constexpr (kSameX) {
            float xv[kN];
            if constexpr (kStagedX) {
#pragma unroll
              for (int i = 0; i < kN / 4; ++i) {
                float x4[4];
                load_x4(0, s, c, i, x4);
#pragma unroll
                for (int q = 0; q < 4; ++q) xv[4 * i + q] = x4[q];
              }
            } else {
              load_x<kN>(xs[0] + s * x_stride + c * kN, xv);
            }
#pragma unroll
            for (int r = 0; r < kR; ++r)
#pragma unroll
              for (int q = 0; q < kN; ++q) acc[r][s] = fmaf(w[r][q], xv[q], acc[r][s]);
          } else {
#pragma unroll
            for (int r = 0; r < kR; ++r) {
              float xv[kN];
              load_x<kN>(xs[r] + s * x_stride + c * kN, xv);
#pragma unroll
              for (int q = 0; q < kN; ++q) acc[r][s] = fmaf(w[r][q], xv[q], acc[r][s]);
            }
          }
        }
      }
    }
  }
  // A lane with no chunk waits here; the others waited in their first round (a second wait would
  // return at once, but the chain trace would count it as a block's wait).
  if constexpr (kWaitFirst) {
    if (lane >= chunks) {
      wait_for_inputs();
      release_dependents();
    }
  }
}

// The unscaled types' form (f32, bf16).
template <typename T, bool kVec, int kS, int kR, int kG, int kU, bool kSameX,
          bool kWaitFirst = false, bool kStagedX = false, typename Stage = StageXFromMemory>
__device__ __forceinline__ void rows_dot(const T* const (&rows)[kR], const float* const (&xs)[kR],
                                         std::int64_t x_stride, std::int64_t chunks, int lane,
                                         float (&acc)[kR][kS], const Stage& stage = {}) {
  static_assert(!WeightChunk<T, kVec>::kScaled, "block-scaled weights need their scale rows");
  rows_dot<T, kVec, kS, kR, kG, kU, kSameX, kWaitFirst, kStagedX>(rows, xs, nullptr, x_stride,
                                                                  chunks, lane, acc, stage);
}

// x staged for packed_rows_dot: in the loop a lane's chunk c reads x's float4s at F::column(c,
// run) + 4q, so the lanes of a group read float4s a chunk (128 or 256 bytes) apart, and each of a
// warp's 16-byte reads touches 32 cache lines: the L1 served ~16 bytes a clock and bounded the
// packed GEMV at ~10% of copy (session 22). Staged, float4 j of chunk c (j = 8 run + q) sits at
// (c / kG * kK4 + j) * kG + c % kG, so for a given (round, j) the kG lanes read kG consecutive
// float4s. The sums are the same: only where x is read changes.
template <typename F, int kG>
struct PackedStagedX {
  static constexpr int kK4 = F::kChunk / 4;  // float4s of x a chunk
  __host__ __device__ static constexpr std::int64_t token_words(std::int64_t chunks) {
    return (chunks + kG - 1) / kG * kG * kK4;
  }
  __device__ __forceinline__ static std::int64_t at(std::int64_t c, int j) {
    return (c / kG * kK4 + j) * kG + c % kG;
  }
};

// The formats whose groups subtract a minimum (F::kHasMin: a group of 16 is a * sum v x - b * sum
// x) also stage each group's sum of x at one token, after x: a float a group, token s's
// `staged_tw / 4` floats on (a chunk's kChunk / 16 groups at c * kChunk / 16, the lanes of a warp
// reading consecutive chunks'). A row's every chunk needs the same sums, which the loop computed
// again for each row: one add a weight, a fifth of the Q4_K decoding's instructions (session 34).
// Summed as the loop summed them (16 adds in column order from 0, no contraction), so the bits
// are the same. One token only: the 2-4-token kernels (a verify's) give every block a few rows,
// so each block's sums cost about what its rows saved, and their larger x would no longer fit
// the opt-in cap at 6,144 columns (session 34: the Q4_K mix's depth-3 verify 10.2 -> 11.8 ms).
template <typename F, int kS>
inline constexpr bool kStagesGroupSums = kS == 1 && F::kHasMin;
template <typename F>
inline constexpr int kGroupsPerChunk = F::kChunk / 16;
// base: where in staged_x the staged x starts (a kernel that stages one token's x, with its sums,
// for each of several tokens: packed_token_slab_words apart).
template <typename F, int kS>
__device__ __forceinline__ float* staged_group_sums(std::int64_t staged_tw, std::int64_t base = 0) {
  return reinterpret_cast<float*>(staged_x + base + kS * staged_tw);
}
// The float4s one token's staged x and (where F subtracts minimums) its group sums take: the
// stride between tokens of a kernel that stages each token's x as its own one-token x.
template <typename F, int kG>
__host__ __device__ constexpr std::int64_t packed_token_slab_words(std::int64_t chunks) {
  const std::int64_t tw = PackedStagedX<F, kG>::token_words(chunks);
  return tw + (kStagesGroupSums<F, 1> ? (tw / 4 + 3) / 4 : 0);
}

// The kS rows x + s * x_stride into staged_x from `base` on in PackedStagedX's order (and their
// group sums where F subtracts minimums), the whole block, then a barrier: every thread of the
// block must call it.
template <typename F, int kG, int kS>
__device__ __forceinline__ void stage_packed_x(const float* x, std::int64_t x_stride,
                                               std::int64_t chunks, std::int64_t base = 0) {
  using L = PackedStagedX<F, kG>;
  const std::int64_t words = chunks * L::kK4, tw = L::token_words(chunks);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    for (std::int64_t i = threadIdx.x; i < words; i += blockDim.x) {
      const std::int64_t c = i / L::kK4;
      const int j = static_cast<int>(i % L::kK4);
      staged_x[base + s * tw + L::at(c, j)] =
          *reinterpret_cast<const float4*>(x + s * x_stride + F::column(c, j / 8) + 4 * (j % 8));
    }
  }
  if constexpr (kStagesGroupSums<F, kS>) {
    constexpr int kGroups = kGroupsPerChunk<F>;
    float* sums = staged_group_sums<F, kS>(tw, base);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      for (std::int64_t i = threadIdx.x; i < chunks * kGroups; i += blockDim.x) {
        const std::int64_t c = i / kGroups;
        const int k = static_cast<int>(i % kGroups);
        const float* col = x + s * x_stride + F::column(c, k / 2) + 16 * (k % 2);
        float sum = 0.0f;
#pragma unroll
        for (int q4 = 0; q4 < 4; ++q4) {
          const float4 f = *reinterpret_cast<const float4*>(col + 4 * q4);
          sum = __fadd_rn(sum, f.x);
          sum = __fadd_rn(sum, f.y);
          sum = __fadd_rn(sum, f.z);
          sum = __fadd_rn(sum, f.w);
        }
        sums[s * (tw / 4) + i] = sum;
      }
    }
  }
  __syncthreads();
}

// The dynamic shared memory packed_rows_dot's staged x takes for kS rows of `chunks` chunks, or 0
// where it should not stage (too large, or FLASHSERVE_CUDA_STAGE_X=0).
template <typename F, int kG, int kS>
std::size_t packed_staged_x_bytes(std::int64_t chunks, std::size_t cap = kMaxStagedXBytes) {
  if (!staged_x_enabled()) return 0;
  // x, and where kStagesGroupSums each group's sum of it (a float for 16 weights: a sixteenth
  // of x's bytes).
  const auto tw = static_cast<std::size_t>(PackedStagedX<F, kG>::token_words(chunks));
  const auto bytes =
      static_cast<std::size_t>(kS) * tw * (sizeof(float4) + (kStagesGroupSums<F, kS> ? 1 : 0));
  return bytes <= cap ? bytes : 0;
}

// One decoded chunk c of a packed row times x, added into acc (kS tokens): the arithmetic every
// packed GEMV shares, so a row's sum has the same bits in each of them. The factored form
// (cuda_packed_formats.cuh): a group of 16 weights is a * v (- b). x is staged_x (token stride
// staged_tw) when kStagedX, else x + s * x_stride. staged_base: where in staged_x this x starts
// (a kernel that stages several vectors, each row reading one of them; at one token the group sums
// of a format that subtracts minimums follow that x, packed_token_slab_words).
template <typename F, int kS, int kG, bool kStagedX>
__device__ __forceinline__ void packed_chunk_dot(const typename F::Raw& raw, std::int64_t c,
                                                 const float* x, std::int64_t x_stride,
                                                 std::int64_t staged_tw, float (&acc)[kS],
                                                 std::int64_t staged_base = 0) {
  using L = PackedStagedX<F, kG>;
  // Staged x comes with its group sums where F subtracts minimums (stage_packed_x).
  constexpr bool kStagedSums = kStagedX && kStagesGroupSums<F, kS>;
  float v[F::kChunk], a[F::kChunk / 16], b[F::kChunk / 16];
  F::factors(raw, v, a, b);
#pragma unroll
  for (int run = 0; run < F::kChunk / 32; ++run) {
    const std::int64_t col = F::column(c, run);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      [[maybe_unused]] float2 sums{};
      if constexpr (kStagedSums)
        sums = *reinterpret_cast<const float2*>(staged_group_sums<F, kS>(staged_tw, staged_base) +
                                                s * (staged_tw / 4) + c * kGroupsPerChunk<F> +
                                                2 * run);
      float xv[32];
      if constexpr (kStagedX) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const float4 f = staged_x[staged_base + s * staged_tw + L::at(c, 8 * run + q)];
          xv[4 * q] = f.x;
          xv[4 * q + 1] = f.y;
          xv[4 * q + 2] = f.z;
          xv[4 * q + 3] = f.w;
        }
      } else {
        load_x<32>(x + s * x_stride + col, xv);
      }
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        float dot = 0.0f, sum = 0.0f;
#pragma unroll
        for (int q = 16 * g; q < 16 * g + 16; ++q) {
          dot = fmaf(v[32 * run + q], xv[q], dot);
          if constexpr (F::kHasMin && !kStagedSums) sum = __fadd_rn(sum, xv[q]);
        }
        if constexpr (kStagedSums) sum = g == 0 ? sums.x : sums.y;
        acc[s] = fmaf(a[2 * run + g], dot, acc[s]);
        if constexpr (F::kHasMin) acc[s] = fmaf(-b[2 * run + g], sum, acc[s]);
      }
    }
  }
}

// rows_dot for a packed format F (cuda_packed_formats.cuh): the same shape of loop, over F's
// chunks. Each thread first issues the loads of kU chunks of each of its kR rows, then decodes
// them in registers one chunk at a time and multiplies with x's columns (F::column runs of 32,
// float4 reads). rows[r] null: nothing loaded, zeros added (a zero Raw decodes to zeros).
// scale_rows[r]: the row's separate scales (FP4), ignored by the GGUF formats.
// kWaitFirst: as rows_dot's, for a kernel launched overlapped whose weights no kernel writes: its
// first round of weight loads goes out before wait_for_inputs, x is read after it.
// kStagedX: x (xs[0], kSameX) is copied into shared memory (stage_packed_x, in the dynamic shared
// memory packed_staged_x_bytes gave the launch) after the first round of loads, and read from
// there. Every thread of the block must call this.
template <typename F, int kS, int kR, int kG, int kU, bool kSameX, bool kWaitFirst = false,
          bool kStagedX = false>
__device__ __forceinline__ void packed_rows_dot(const std::uint8_t* const (&rows)[kR],
                                                const std::uint8_t* const (&scale_rows)[kR],
                                                const float* const (&xs)[kR], std::int64_t x_stride,
                                                std::int64_t chunks, int lane,
                                                float (&acc)[kR][kS]) {
  static_assert(!kStagedX || kSameX, "staging takes one x");
  using L = PackedStagedX<F, kG>;
  [[maybe_unused]] const std::int64_t staged_tw = kStagedX ? L::token_words(chunks) : 0;
  typename F::Raw raw[kU][kR];
  const auto load_round = [&](std::int64_t c0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kG;
#pragma unroll
      for (int r = 0; r < kR; ++r)
        raw[u][r] = c < chunks && rows[r] != nullptr ? F::load(rows[r], scale_rows[r], c)
                                                     : typename F::Raw{};
    }
  };
  // The first round before the wait and the staging (every thread, chunks or not).
  load_round(lane);
  if constexpr (kWaitFirst) {
    wait_for_inputs();
    release_dependents();
  }
  if constexpr (kStagedX) stage_packed_x<F, kG, kS>(xs[0], x_stride, chunks);
  for (std::int64_t c0 = lane; c0 < chunks; c0 += static_cast<std::int64_t>(kG) * kU) {
    if (c0 != lane) load_round(c0);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kG;
      if (c >= chunks) break;
#pragma unroll
      for (int r = 0; r < kR; ++r)
        packed_chunk_dot<F, kS, kG, kStagedX>(raw[u][r], c, kSameX ? xs[0] : xs[r], x_stride,
                                              staged_tw, acc[r]);
    }
  }
}

// The sum of v over the kG consecutive lanes of this thread's group (kG a power of two <= 32),
// returned to every lane of the group. The whole warp must call it.
template <int kG>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kG / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kGemvThreads = 256;  // 8 warps a block
// Output widths from which a thread takes several rows: at 4 rows a thread, 4096 rows still make
// 1024 groups with 8 chunks of each of 4 rows in flight per thread (about 30 KB a multiprocessor).
constexpr std::int64_t kManyRows = 4096;

// Lanes per weight row for rows of `chunks` chunks: rows of at least 4 chunks per lane take a
// warp each; shorter rows (the shared expert's down, 640 wide) take 8 lanes, so every thread still
// has several loads to issue. A row's sum depends on this choice only (not on how many rows a
// group takes), so kernels that follow it compute the bits `linear` computes.
inline bool gemv_short_rows(std::int64_t chunks) {
  return chunks < 4 * kWarp;
}

// Whether x and w (rows of `in` elements) take the 16-byte chunk path.
template <typename T>
bool vec_ok(const void* x, const void* w, std::int64_t in) {
  return in % WeightChunk<T, true>::kN == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(w) % 16 == 0;
}

// Calls f(std::integral_constant<int, n>{}) for the run-time n in [1, kMax] (kernel dispatch on
// the token count).
template <int kMax, typename F>
void with_count(std::int64_t n, F&& f) {
  if constexpr (kMax >= 1) {
    if (n == kMax) {
      f(std::integral_constant<int, kMax>{});
      return;
    }
    with_count<kMax - 1>(n, f);
  }
}

}  // namespace fs::cuda
