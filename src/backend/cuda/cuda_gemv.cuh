// The streaming dot-product core shared by the few-row GEMV (cuda_linear.cu) and the fused routed
// experts (cuda_moe.cu). Decode at batch 1-8 is bound by the bytes of W read, so the core is built
// around keeping many 16-byte loads of W in flight: a group of kG threads takes kR weight rows,
// each thread issues kU chunks of every row before it uses the first, and the x rows (fp32, hot in
// L1) are read once per chunk for all kR rows, so S tokens cost one pass over W.
#pragma once

#include "backend/cuda/cuda_common.h"

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
  using Raw = uint4;
  __device__ __forceinline__ static Raw load(const float* p) { return load_streaming(p); }
  __device__ __forceinline__ static void widen(const Raw& v, float (&f)[kN]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};

template <typename T>
struct WeightChunk<T, false> {
  static constexpr int kN = 1;
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

// acc[r][s] += this thread's share of rows[r] · x_{r,s}, over the chunks lane, lane + kG, ...
// below `chunks`; x_{r,s} = xs[r] + s * x_stride (kSameX: xs[0] for every r, read once per chunk
// for all rows). A null rows[r] loads nothing and adds zeros; its xs[r] must still be readable.
// Not yet summed over the group (group_sum).
template <typename T, bool kVec, int kS, int kR, int kG, int kU, bool kSameX>
__device__ __forceinline__ void rows_dot(const T* const (&rows)[kR], const float* const (&xs)[kR],
                                         std::int64_t x_stride, std::int64_t chunks, int lane,
                                         float (&acc)[kR][kS]) {
  using C = WeightChunk<T, kVec>;
  constexpr int kN = C::kN;
  for (std::int64_t c0 = lane; c0 < chunks; c0 += static_cast<std::int64_t>(kG) * kU) {
    typename C::Raw raw[kU][kR];
    // All loads first: kU * kR independent 16-byte requests per thread.
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kG;
#pragma unroll
      for (int r = 0; r < kR; ++r)
        raw[u][r] =
            (c < chunks && rows[r] != nullptr) ? C::load(rows[r] + c * kN) : typename C::Raw{};
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kG;
      if (c >= chunks) break;
      float w[kR][kN];
#pragma unroll
      for (int r = 0; r < kR; ++r) C::widen(raw[u][r], w[r]);
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        if constexpr (kSameX) {
          float xv[kN];
          load_x<kN>(xs[0] + s * x_stride + c * kN, xv);
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
