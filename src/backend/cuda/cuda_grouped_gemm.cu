// Prefill's products on the tensor cores (cuda_grouped_gemm.h says what and why).
//
// A block computes a tile of 64 (or 32) sorted pairs (M) by kTileN output columns (N) over the
// whole K (a dense product with split K: its range of K): 8 warps in 2 x 4 (1 x 8), a warp
// 32 x 32 (32 x 16) as mma.sync m16n8k16 (bf16 in, f32 accumulate).
// K runs in steps of kTileK through two shared-memory stages: the next step's x (f32, split into
// hi and lo bf16 parts) and weights (bf16, or e4m3 converted exactly) are loaded into registers
// while the tensor cores work on the current stage, then stored into the other one; one barrier a
// step. FP8's block scale multiplies each 128 columns' partial sums (kept apart in `part`) into
// the accumulator, as the decode kernels apply it per block (kDeferredScale, cuda_gemv.cuh).
// nvcc reports discarded [[nodiscard]] class values in the headers (see cuda_backend.h).
#pragma nv_diag_suppress 2810

#include "backend/cuda/cuda_grouped_gemm.h"

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_grouped_common.cuh"
#include "backend/cuda/cuda_moe_common.cuh"

namespace fs::cuda {
namespace {

using tiles::bf16x2;
using tiles::kMaxGridY;
using tiles::kThreads;
using tiles::kTileN;
using tiles::kTileWords;
using tiles::ldmatrix_x4;
using tiles::max_tiles;
using tiles::mma_bf16;

constexpr int kTileK = 64;
// Shared rows are kTileK + 8 bf16 (144 bytes) apart: the 8 rows an ldmatrix phase reads then
// start 4 banks apart and cover all 32 (no conflicts), and every row start stays 16-byte aligned.
constexpr int kLd = kTileK + 8;
template <int kTileM>
constexpr int kStageHalves = 2 * kTileM* kLd + kTileN* kLd;  // x hi, x lo, weights
template <int kTileM>
constexpr std::size_t kSmemBytes = 2 * kStageHalves<kTileM> * sizeof(bf16_bits);
constexpr int kSortThreads = 1024;

// One block: counts per expert, their scan (one warp, a span of experts a lane), the tile table,
// then each pair placed at its expert's cursor. The order of pairs inside an expert depends on the
// atomics, but no result does: every output row is its own pair's sum.
__global__ void __launch_bounds__(kSortThreads)
    sort_pairs_kernel(const std::int32_t* ids, int P, int E, int rows, int tiles_max,
                      std::int32_t* work) {
  extern __shared__ int sort_shared[];
  int* count = sort_shared;
  int* cursor = sort_shared + E;
  int* tile_base = sort_shared + 2 * E;
  wait_for_inputs();
  release_dependents();
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < E; e += kSortThreads) count[e] = 0;
  __syncthreads();
  for (int p = tid; p < P; p += kSortThreads) {
    const int e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (tid < kWarp) {
    const int lane = tid, per = (E + kWarp - 1) / kWarp;
    const int lo = min(E, lane * per), hi = min(E, lo + per);
    int pairs = 0, tiles = 0;
    for (int e = lo; e < hi; ++e) pairs += count[e], tiles += (count[e] + rows - 1) / rows;
    int p0 = warp_inclusive_scan(pairs) - pairs;
    int t0 = warp_inclusive_scan(tiles) - tiles;
    for (int e = lo; e < hi; ++e) {
      cursor[e] = p0;
      tile_base[e] = t0;
      p0 += count[e];
      t0 += (count[e] + rows - 1) / rows;
    }
    if (lane == kWarp - 1) work[0] = t0;
  }
  __syncthreads();
  std::int32_t* tiles = work + 1;
  std::int32_t* order = work + 1 + kTileWords * tiles_max;
  for (int e = tid; e < E; e += kSortThreads)
    for (int t = 0; t * rows < count[e]; ++t) {
      std::int32_t* tile = tiles + kTileWords * (tile_base[e] + t);
      tile[0] = e;
      tile[1] = cursor[e] + t * rows;
      tile[2] = min(rows, count[e] - t * rows);
    }
  __syncthreads();  // the table read cursor[] before the placements move it
  for (int p = tid; p < P; p += kSortThreads) {
    const int e = ids[p];
    if (e >= 0 && e < E) order[atomicAdd(&cursor[e], 1)] = p;
  }
}

// How a weight type reaches the shared stage as bf16: 16-byte loads, kLoads a thread a step.
template <GroupedWeights kW>
struct StageWeights;
template <>
struct StageWeights<GroupedWeights::kBf16> {
  using T = bf16_bits;
  static constexpr int kPerLoad = 8;  // weights in 16 bytes
  static constexpr bool kScaled = false;
  __device__ __forceinline__ static void store(const uint4& v, bf16_bits* dst) {
    *reinterpret_cast<uint4*>(dst) = v;
  }
};
template <>
struct StageWeights<GroupedWeights::kFp8Scaled> {
  using T = e4m3_bits;
  static constexpr int kPerLoad = 16;
  static constexpr bool kScaled = true;
  // Each e4m3 value is exact in bf16 (3 mantissa bits, exponents within bf16's).
  __device__ __forceinline__ static void store(const uint4& v, bf16_bits* dst) {
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
    unsigned out[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 lo = e4m3_pair(static_cast<unsigned short>(words[i] & 0xffffu));
      const float2 hi = e4m3_pair(static_cast<unsigned short>(words[i] >> 16));
      out[2 * i] = bf16x2(lo.x, lo.y);
      out[2 * i + 1] = bf16x2(hi.x, hi.y);
    }
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
};

// kSwiGlu: the gate/up product. Its tile's column 2j is gate row j0 + j and column 2j + 1 up row
// I + j0 + j, so each thread's accumulator pair (c0, c1) is one act value's gate and up.
// Otherwise output column n is weight row n0 + n.
// kTileM 64: warps 2 (M) x 4 (N), a warp 32 x 32; 32 (few pairs an expert): 1 x 8, 32 x 16.
template <GroupedWeights kW, bool kSwiGlu, int kTileM>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_gemm_kernel(const float* a, std::int64_t a_row_div, const void* weights,
                        const float* scales, std::int64_t w_rows, std::int64_t n_out,
                        std::int64_t K, const std::int32_t* work, int tiles_max, int dense_rows,
                        std::int64_t k_chunk, float limit, float* out) {
  using SW = StageWeights<kW>;
  using T = typename SW::T;
  constexpr int kALoads = kTileM * kTileK / 4 / kThreads;             // float4s: 4
  constexpr int kWLoads = kTileN * kTileK / SW::kPerLoad / kThreads;  // uint4s: 2 or 4
  constexpr int kWPerRow = kTileK / SW::kPerLoad;                     // loads a weight row
  constexpr int kWarpsM = kTileM / 32, kWarpsN = kThreads / kWarp / kWarpsM;
  constexpr int kWarpN = kTileN / kWarpsN, kNT = kWarpN / 8;  // a warp's columns, its n8 tiles
  extern __shared__ uint4 grouped_shared[];
  __shared__ int pair_of[kTileM];
  __shared__ int tile_info[kTileWords];
  auto* smem = reinterpret_cast<bf16_bits*>(grouped_shared);

  wait_for_inputs();
  release_dependents();
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  if (!tiles::read_tile<kTileM>(work, tiles_max, dense_rows, tile_info, pair_of)) return;
  const int expert = tile_info[0], rows = tile_info[2];

  // This thread's loads: x rows (a float4 of each of kALoads rows) and weight rows.
  const int a_col = (tid % (kTileK / 4)) * 4;
  // Rows as int32 (x's token or act's pair; the weight row in its expert), not pointers: the
  // registers are what keeps two blocks on a multiprocessor.
  int a_row[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int r = tid / (kTileK / 4) + i * (kThreads / (kTileK / 4));
    a_row[i] = pair_of[r] >= 0 ? static_cast<int>(pair_of[r] / a_row_div) : -1;
  }
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * (kSwiGlu ? kTileN / 2 : kTileN);
  const T* w_expert = static_cast<const T*>(weights) + expert * w_rows * K;
  // The weight row of tile column n, or -1 past the output.
  auto weight_row = [&](int n) { return tiles::weight_row<kSwiGlu>(n0, n, n_out); };
  const int w_col = (tid % kWPerRow) * SW::kPerLoad;
  int w_row[kWLoads];
#pragma unroll
  for (int i = 0; i < kWLoads; ++i)
    w_row[i] = static_cast<int>(weight_row(tid / kWPerRow + i * (kThreads / kWPerRow)));

  // Split K (dense products with few tiles): this block's columns [k_begin, k_end), a multiple
  // of 128 wide except the last, and its sums into slice blockIdx.z of `out` (dense_rows x n_out
  // each), which a second kernel adds in order.
  const std::int64_t k_begin = static_cast<std::int64_t>(blockIdx.z) * k_chunk,
                     k_end = min(K, k_begin + k_chunk);
  out += static_cast<std::int64_t>(blockIdx.z) * dense_rows * n_out;

  float4 a_next[kALoads];
  uint4 w_next[kWLoads];
  auto load = [&](std::int64_t k0) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i)
      a_next[i] = a_row[i] >= 0 && k0 + a_col < k_end
                      ? __ldg(reinterpret_cast<const float4*>(a + a_row[i] * K + k0 + a_col))
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < kWLoads; ++i)
      w_next[i] = w_row[i] >= 0 && k0 + w_col < k_end
                      ? __ldg(reinterpret_cast<const uint4*>(w_expert + w_row[i] * K + k0 + w_col))
                      : make_uint4(0, 0, 0, 0);
  };
  auto store = [&](int stage) {
    bf16_bits* x_hi = smem + stage * kStageHalves<kTileM>;
    bf16_bits* x_lo = x_hi + kTileM * kLd;
    bf16_bits* w_s = x_lo + kTileM * kLd;
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int r = tid / (kTileK / 4) + i * (kThreads / (kTileK / 4));
      tiles::store_split(a_next[i], x_hi + r * kLd + a_col, x_lo + r * kLd + a_col);
    }
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const int n = tid / kWPerRow + i * (kThreads / kWPerRow);
      SW::store(w_next[i], w_s + n * kLd + w_col);
    }
  };

  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  float acc[2][kNT][4] = {};
  float part[2][kNT][4] = {};  // FP8: the current 128-column block's sums, before its scale
  // FP8: each tile column's row of the scale grid (its weight row's 128-row block), in shared
  // memory (8 pointers a thread in registers made the kernel spill at two blocks a multiprocessor).
  __shared__ std::int64_t scale_row[SW::kScaled ? kTileN : 1];
  if constexpr (SW::kScaled) {
    const std::int64_t grid_rows = (w_rows + kFp8Block - 1) / kFp8Block,
                       grid_cols = (K + kFp8Block - 1) / kFp8Block;
    if (tid < kTileN) {
      const std::int64_t g = weight_row(tid);
      scale_row[tid] = g >= 0 ? (expert * grid_rows + g / kFp8Block) * grid_cols : -1;
    }
  }

  const int steps = static_cast<int>((k_end - k_begin + kTileK - 1) / kTileK);
  load(k_begin);
  store(0);
  __syncthreads();
  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) load(k_begin + static_cast<std::int64_t>(step + 1) * kTileK);
    const bf16_bits* x_hi = smem + (step % 2) * kStageHalves<kTileM>;
    const bf16_bits* x_lo = x_hi + kTileM * kLd;
    const bf16_bits* w_s = x_lo + kTileM * kLd;
    auto& sums = SW::kScaled ? part : acc;
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      unsigned b[kNT][2];
#pragma unroll
      for (int nj = 0; nj < kNT / 2; ++nj) {
        unsigned t[4];
        const int n = warp_n * kWarpN + nj * 16 + (lane % 8) + (lane / 16) * 8;
        ldmatrix_x4(t, w_s + n * kLd + kk + ((lane / 8) % 2) * 8);
        b[2 * nj][0] = t[0], b[2 * nj][1] = t[1], b[2 * nj + 1][0] = t[2], b[2 * nj + 1][1] = t[3];
      }
      // One m16 row of fragments at a time: fewer registers live than loading both first.
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        unsigned ah[4], al[4];
        const int r = warp_m * 32 + mi * 16 + lane % 16, c = kk + (lane / 16) * 8;
        ldmatrix_x4(ah, x_hi + r * kLd + c);
        ldmatrix_x4(al, x_lo + r * kLd + c);
#pragma unroll
        for (int ni = 0; ni < kNT; ++ni) {
          mma_bf16(sums[mi][ni], al, b[ni][0], b[ni][1]);
          mma_bf16(sums[mi][ni], ah, b[ni][0], b[ni][1]);
        }
      }
    }
    if constexpr (SW::kScaled) {
      const std::int64_t end = k_begin + static_cast<std::int64_t>(step + 1) * kTileK;
      if (end % kFp8Block == 0 || step + 1 == steps) {
        const std::int64_t block = (end - 1) / kFp8Block;
#pragma unroll
        for (int ni = 0; ni < kNT; ++ni)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const std::int64_t at = scale_row[warp_n * kWarpN + ni * 8 + 2 * (lane % 4) + q];
            const float s = at >= 0 ? __ldg(scales + at + block) : 0.0f;
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                acc[mi][ni][2 * h + q] = fmaf(part[mi][ni][2 * h + q], s, acc[mi][ni][2 * h + q]);
                part[mi][ni][2 * h + q] = 0.0f;
              }
          }
      }
    }
    if (step + 1 < steps) store((step + 1) % 2);
    __syncthreads();
  }

  tiles::store_tile<kSwiGlu, kNT>(acc, warp_m * 32, warp_n * kWarpN, rows, pair_of, n0, n_out,
                                  limit, out);
}

// y[i] = the sum of part[z][i] over the splits in order (deterministic, no atomics).
__global__ void add_splits_kernel(const float* part, int splits, std::int64_t n, float* y) {
  wait_for_inputs();
  release_dependents();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float v = part[i];
    for (int z = 1; z < splits; ++z) v += part[z * n + i];
    y[i] = v;
  }
}

// work null: a dense product of P rows of a (E = 1), its K cut into `splits` ranges of k_chunk
// columns (out then holds splits slices of P x n_out).
template <GroupedWeights kW, bool kSwiGlu, int kTileM>
cudaError_t launch_tiles(const float* a, std::int64_t a_row_div, const void* w, const float* scales,
                         std::int64_t w_rows, std::int64_t n_out, std::int64_t K,
                         const std::int32_t* work, std::int64_t P, std::int64_t E, float limit,
                         float* out, cudaStream_t stream, int splits = 1,
                         std::int64_t k_chunk = 0) {
  constexpr auto kernel = grouped_gemm_kernel<kW, kSwiGlu, kTileM>;
  constexpr auto bytes = kSmemBytes<kTileM>;
  if (!allow_dynamic_shared<kernel, bytes>()) return cudaErrorInvalidConfiguration;
  const std::int64_t per_tile = kSwiGlu ? kTileN / 2 : kTileN;
  const auto tiles = work ? max_tiles(P, E, kTileM) : (P + kTileM - 1) / kTileM;
  if (tiles > kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((n_out + per_tile - 1) / per_tile),
                  static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  return launch_overlapped(kernel, grid, kThreads, bytes, stream, a, a_row_div, w, scales, w_rows,
                           n_out, K, work, static_cast<int>(tiles), static_cast<int>(P),
                           k_chunk > 0 ? k_chunk : K, limit, out);
}

template <GroupedWeights kW, bool kSwiGlu>
cudaError_t launch_grouped(const float* a, std::int64_t a_row_div, const void* w,
                           const float* scales, std::int64_t w_rows, std::int64_t n_out,
                           std::int64_t K, const std::int32_t* work, std::int64_t P, std::int64_t E,
                           int tile_rows, float limit, float* out, cudaStream_t stream) {
  return tile_rows == kGroupedRowsSmall
             ? launch_tiles<kW, kSwiGlu, kGroupedRowsSmall>(a, a_row_div, w, scales, w_rows, n_out,
                                                            K, work, P, E, limit, out, stream)
             : launch_tiles<kW, kSwiGlu, kGroupedRows>(a, a_row_div, w, scales, w_rows, n_out, K,
                                                       work, P, E, limit, out, stream);
}

}  // namespace

int grouped_tile_rows(std::int64_t P, std::int64_t E) {
  if (const char* v = std::getenv("FLASHSERVE_CUDA_GROUPED_ROWS"))
    return std::atoi(v) == kGroupedRowsSmall ? kGroupedRowsSmall : kGroupedRows;
  const std::int64_t used = std::max<std::int64_t>(std::min(P, E), 1);
  return P / used <= kSmallTileMaxPairs ? kGroupedRowsSmall : kGroupedRows;
}

bool grouped_tiles_fit(std::int64_t P, std::int64_t E, int tile_rows) {
  return max_tiles(P, E, tile_rows) <= kMaxGridY;
}

std::int64_t grouped_work_words(std::int64_t P, std::int64_t E, int tile_rows) {
  return 1 + kTileWords * max_tiles(P, E, tile_rows) + P;
}

bool grouped_products_take(GroupedWeights w, std::int64_t H, std::int64_t I, std::int64_t E,
                           const void* x, const void* gate_up, const void* down) {
  const std::int64_t per_load = w == GroupedWeights::kBf16 ? 8 : 16;
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return E > 0 && E <= kMaxGroupedExperts && H > 0 && I > 0 && H % per_load == 0 &&
         I % per_load == 0 && aligned(x) && aligned(gate_up) && aligned(down);
}

cudaError_t sort_pairs_by_expert(const std::int32_t* ids, std::int64_t P, std::int64_t E,
                                 int tile_rows, std::int32_t* work, cudaStream_t stream) {
  if (P <= 0 || P > (std::int64_t{1} << 30) || E <= 0 || E > kMaxGroupedExperts ||
      max_tiles(P, E, tile_rows) > kMaxGridY ||
      (tile_rows != kGroupedRows && tile_rows != kGroupedRowsSmall))
    return cudaErrorInvalidValue;
  return launch_overlapped(sort_pairs_kernel, dim3(1), dim3(kSortThreads),
                           static_cast<std::size_t>(3 * E) * sizeof(int), stream, ids,
                           static_cast<int>(P), static_cast<int>(E), tile_rows,
                           static_cast<int>(max_tiles(P, E, tile_rows)), work);
}

cudaError_t grouped_gate_up(const float* x, std::int64_t k, const void* gate_up,
                            const float* scales, GroupedWeights wt, std::int64_t E, std::int64_t H,
                            std::int64_t I, float limit, const std::int32_t* work, std::int64_t P,
                            int tile_rows, float* act, cudaStream_t stream) {
  return wt == GroupedWeights::kBf16
             ? launch_grouped<GroupedWeights::kBf16, true>(x, k, gate_up, scales, 2 * I, I, H, work,
                                                           P, E, tile_rows, limit, act, stream)
             : launch_grouped<GroupedWeights::kFp8Scaled, true>(
                   x, k, gate_up, scales, 2 * I, I, H, work, P, E, tile_rows, limit, act, stream);
}

cudaError_t grouped_down(const float* act, const void* down, const float* scales, GroupedWeights wt,
                         std::int64_t E, std::int64_t H, std::int64_t I, const std::int32_t* work,
                         std::int64_t P, int tile_rows, float* part, cudaStream_t stream) {
  return wt == GroupedWeights::kBf16
             ? launch_grouped<GroupedWeights::kBf16, false>(act, 1, down, scales, H, H, I, work, P,
                                                            E, tile_rows, 0.0f, part, stream)
             : launch_grouped<GroupedWeights::kFp8Scaled, false>(
                   act, 1, down, scales, H, H, I, work, P, E, tile_rows, 0.0f, part, stream);
}

bool dense_product_takes(GroupedWeights w, std::int64_t S, std::int64_t in, const void* x,
                         const void* weights) {
  const std::int64_t per_load = w == GroupedWeights::kBf16 ? 8 : 16;
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return dense_rows_fit(S) && in > 0 && in % per_load == 0 && aligned(x) && aligned(weights);
}

bool dense_rows_fit(std::int64_t S) {
  return S > 0 && (S + kGroupedRows - 1) / kGroupedRows <= kMaxGridY;
}

DenseSplit dense_product_split(std::int64_t S, std::int64_t in, std::int64_t out) {
  if (const char* v = std::getenv("FLASHSERVE_CUDA_PREFILL_SPLIT_K"); v && std::atoi(v) == 0)
    return {};
  const std::int64_t tiles =
      ((out + kTileN - 1) / kTileN) * ((S + kGroupedRows - 1) / kGroupedRows);
  const std::int64_t blocks = (in + kFp8Block - 1) / kFp8Block;  // of 128 columns
  const std::int64_t target = 2 * multiprocessors();  // two blocks an SM (264 on an H200)
  if (tiles >= target || blocks < 2) return {};
  const std::int64_t want = std::min<std::int64_t>(
      std::min<std::int64_t>((target + tiles - 1) / tiles, blocks), kMaxKSplits);
  const std::int64_t per = (blocks + want - 1) / want;  // 128-column blocks a split
  // Every split non-empty: the count that `per` blocks each actually need.
  return {static_cast<int>((blocks + per - 1) / per), per * kFp8Block};
}

cudaError_t dense_product(const float* x, std::int64_t S, const void* w, const float* scales,
                          GroupedWeights wt, std::int64_t in, std::int64_t out, float* y,
                          cudaStream_t stream, DenseSplit split, float* partials) {
  const bool cut = split.splits > 1 && partials != nullptr;
  float* dst = cut ? partials : y;
  const int splits = cut ? split.splits : 1;
  const std::int64_t chunk = cut ? split.k_chunk : 0;
  const cudaError_t e =
      wt == GroupedWeights::kBf16
          ? launch_tiles<GroupedWeights::kBf16, false, kGroupedRows>(
                x, 1, w, scales, out, out, in, nullptr, S, 1, 0.0f, dst, stream, splits, chunk)
          : launch_tiles<GroupedWeights::kFp8Scaled, false, kGroupedRows>(
                x, 1, w, scales, out, out, in, nullptr, S, 1, 0.0f, dst, stream, splits, chunk);
  if (e != cudaSuccess || !cut) return e;
  return add_splits(partials, splits, S * out, y, stream);
}

cudaError_t add_splits(const float* partials, int splits, std::int64_t n, float* y,
                       cudaStream_t stream) {
  return launch_overlapped(
      add_splits_kernel, dim3(static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 4096))),
      dim3(256), 0, stream, partials, splits, n, y);
}

}  // namespace fs::cuda
