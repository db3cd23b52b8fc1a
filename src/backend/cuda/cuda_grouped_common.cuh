// What prefill's tensor-core products share (cuda_grouped_gemm.cu for bf16 and FP8 weights,
// cuda_grouped_packed.cu for the packed formats): the block shape, the tile table a block reads
// its rows from, and the mma.sync / ldmatrix wrappers.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_moe_common.cuh"

namespace fs::cuda::tiles {

constexpr int kTileN = 128;  // output columns (weight rows) a block
constexpr int kThreads = 256;
constexpr std::int64_t kMaxGridY = 65535;

// The work buffer (cuda_grouped_gemm.h): [0] the tile count, then kTileWords a tile, then the
// sorted pairs.
constexpr int kTileWords = 3;  // expert, first sorted pair, pairs
__host__ __device__ constexpr std::int64_t max_tiles(std::int64_t P, std::int64_t E, int rows) {
  return (P + rows - 1) / rows + E;
}

// The rows block blockIdx.y multiplies: a tile of sorted pairs from the work buffer, or (work
// null: a dense product) rows [kTileM * tile, kTileM * tile + kTileM) of x. Fills info (expert,
// first, rows) and pair_of (-1 past the tile's rows); false when the tile is past the table (the
// block has nothing to do). Every thread of the block calls it (two barriers).
template <int kTileM>
__device__ __forceinline__ bool read_tile(const std::int32_t* work, int tiles_max, int dense_rows,
                                          int (&info)[kTileWords], int (&pair_of)[kTileM]) {
  const int tid = static_cast<int>(threadIdx.x), tile = static_cast<int>(blockIdx.y);
  if (work) {
    if (tile >= work[0]) return false;
    if (tid < kTileWords) info[tid] = work[1 + kTileWords * tile + tid];
  } else if (tid == 0) {
    info[0] = 0;
    info[1] = tile * kTileM;
    info[2] = min(kTileM, dense_rows - tile * kTileM);
  }
  __syncthreads();
  const int first = info[1], rows = info[2];
  if (tid < kTileM)
    pair_of[tid] =
        tid < rows ? (work ? work[1 + kTileWords * tiles_max + first + tid] : first + tid) : -1;
  __syncthreads();
  return true;
}

__device__ __forceinline__ unsigned bf16x2(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ float bf16_round(float v) {
  return __uint_as_float(bf16x2(v, 0.0f) << 16);
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16_bits* p) {
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four f32 values of x as their bf16 high parts and the bf16 of what is left (x kept to ~2^-17
// of itself), written to the two shared tiles.
__device__ __forceinline__ void store_split(const float4& x, bf16_bits* hi, bf16_bits* lo) {
  const float v[4] = {x.x, x.y, x.z, x.w};
  float h[4], l[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) h[q] = bf16_round(v[q]), l[q] = v[q] - h[q];
  *reinterpret_cast<uint2*>(hi) = make_uint2(bf16x2(h[0], h[1]), bf16x2(h[2], h[3]));
  *reinterpret_cast<uint2*>(lo) = make_uint2(bf16x2(l[0], l[1]), bf16x2(l[2], l[3]));
}

// The tile column's weight row: kSwiGlu (a gate/up product) interleaves gate row n0 + n / 2
// (even n) and up row n_out + n0 + n / 2 (odd n), so each thread's accumulator pair is one act
// value's gate and up; otherwise column n is row n0 + n. -1 past the output.
template <bool kSwiGlu>
__device__ __forceinline__ std::int64_t weight_row(std::int64_t n0, int n, std::int64_t n_out) {
  if constexpr (kSwiGlu) {
    const std::int64_t j = n0 + n / 2;
    return j < n_out ? (n % 2 ? n_out + j : j) : -1;
  } else {
    return n0 + n < n_out ? n0 + n : -1;
  }
}

// A warp's accumulators (2 m16 rows of kNT n8 tiles, mma.sync's layout) written to out: row r of
// the tile to out row pair_of[r] (rows past `rows` skipped), column n to n0 + n, or for kSwiGlu
// the clamped SwiGLU of each (gate, up) pair to n0 + n / 2. warp_col: the warp's first column.
template <bool kSwiGlu, int kNT>
__device__ __forceinline__ void store_tile(const float (&acc)[2][kNT][4], int warp_row,
                                           int warp_col, int rows, const int* pair_of,
                                           std::int64_t n0, std::int64_t n_out, float limit,
                                           float* out) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_row + mi * 16 + lane / 4 + 8 * h;
      if (r >= rows) continue;
      float* o = out + static_cast<std::int64_t>(pair_of[r]) * n_out;
#pragma unroll
      for (int ni = 0; ni < kNT; ++ni) {
        const int n = warp_col + ni * 8 + 2 * (lane % 4);
        const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if constexpr (kSwiGlu) {
          const std::int64_t j = n0 + n / 2;
          if (j < n_out) o[j] = clamped_swiglu(v0, v1, limit);
        } else {
          const std::int64_t c = n0 + n;
          if (c < n_out) o[c] = v0;
          if (c + 1 < n_out) o[c + 1] = v1;
        }
      }
    }
}

}  // namespace fs::cuda::tiles
