// Prefill's products on packed weights (FP4 E2M1 + E8M0, GGUF Q8_0 / Q2_K / Q4_K / Q5_K / Q6_K /
// IQ2_XXS) on the tensor cores: the routed experts grouped by expert and the dense products, as
// cuda_grouped_gemm.cu runs them for bf16 and FP8, with each tile's weights decoded from their
// blocks on the way into shared memory.
//
// A group of 16 weights of a packed row is a * v_i (- b) (the formats' `factors`,
// cuda_packed_formats.cuh): v_i small integers or E2M1 values, which bf16 holds exactly, and a, b
// f32 factors of the group. So the tensor cores multiply x (its two bf16 parts, as for FP8)
// by the v_i alone, a group at a time into a fresh accumulator t, and each group is then scaled
// into the sum on the FMA pipe: acc += a * t (- b * sum of the group's x). No dequantised weight is
// ever rounded to bf16, and the sum sits within ~1e-5 of the f32 product on the dequantised
// weights (the op tests' bound, as for FP8).
//
// K runs in steps of 128 columns: every format's chunk lies inside one aligned 128 (Q6_K's two
// runs of a chunk are 64 apart). One shared stage; while the tensor cores work on it, the next
// step's x arrives (f32, by cp.async, into a shared buffer of its own) and its packed bytes are
// loaded into registers; then x is split and the blocks decoded into the stage. (x held in
// registers as well made every tile of 64 rows spill.) Two blocks a multiprocessor overlap each
// other's barriers.
// nvcc reports discarded [[nodiscard]] class values in the headers (see cuda_backend.h).
#pragma nv_diag_suppress 2810

#include <algorithm>

#include "backend/cuda/cuda_grouped_common.cuh"
#include "backend/cuda/cuda_grouped_gemm.h"
#include "backend/cuda/cuda_moe_common.cuh"
#include "backend/cuda/cuda_packed.cuh"

namespace fs::cuda {
namespace {

using tiles::kThreads;
using tiles::kTileN;
using tiles::kTileWords;

constexpr int kStepK = 128;
constexpr int kGroupsK = kStepK / 16;  // scale groups a step
// Shared rows are kStepK + 8 bf16 (272 bytes) apart: the 8 rows an ldmatrix phase reads start 4
// banks apart and cover all 32, and every row start stays 16-byte aligned.
constexpr int kLd = kStepK + 8;

// Shared memory: x hi, x lo [kTileM][kLd] and the weights' v [kTileN][kLd] as bf16; the factors
// (a, b) [kGroupsK][kTileN] and the x group sums [kGroupsK][kTileM] as f32, group-major so that a
// warp's reads of one group fall in distinct banks; the next step's x [kTileM][kStepK] (f32).
// 110 KB at 64 rows: two blocks a multiprocessor.
template <int kTileM>
constexpr std::size_t kSharedBytes =
    (2 * kTileM + kTileN) * kLd * sizeof(bf16_bits) + kGroupsK* kTileN * sizeof(float2) +
    kGroupsK* kTileM * sizeof(float) + kTileM* kStepK * sizeof(float);

// kSwiGlu: the gate/up product, its tile column 2j gate row n0 + j and 2j + 1 up row n_out + n0 + j
// (each thread's accumulator pair is one act value's gate and up); otherwise column n is weight
// row n0 + n. kTileM 64: warps 2 (M) x 4 (N), a warp 32 x 32; 32: 1 x 8, a warp 32 x 16.
template <typename F, bool kSwiGlu, int kTileM>
__global__ void __launch_bounds__(kThreads, 2)
    packed_tiles_kernel(const float* a, std::int64_t a_row_div, packed::Rows w, std::int64_t n_out,
                        std::int64_t K, const std::int32_t* work, int tiles_max, int dense_rows,
                        std::int64_t k_chunk, float limit, float* out) {
  constexpr int kALoads = kTileM * kStepK / 4 / kThreads;   // float4s of x a thread: 8 or 4
  constexpr int kChunksStep = kStepK / F::kChunk;           // a row's chunks a step: 4 or 2
  constexpr int kWItems = kTileN * kChunksStep / kThreads;  // chunks a thread: 2 or 1
  constexpr int kWarpsM = kTileM / 32, kWarpsN = kThreads / kWarp / kWarpsM;
  constexpr int kWarpN = kTileN / kWarpsN, kNT = kWarpN / 8;
  static_assert(kTileN * kChunksStep % kThreads == 0, "whole chunks a thread");
  extern __shared__ uint4 packed_shared[];
  __shared__ int pair_of[kTileM];
  __shared__ int tile_info[kTileWords];
  auto* x_hi = reinterpret_cast<bf16_bits*>(packed_shared);
  bf16_bits* x_lo = x_hi + kTileM * kLd;
  bf16_bits* w_s = x_lo + kTileM * kLd;
  auto* factors = reinterpret_cast<float2*>(w_s + kTileN * kLd);
  auto* x_sums = reinterpret_cast<float*>(factors + kGroupsK * kTileN);
  float* x_next = x_sums + kGroupsK * kTileM;

  wait_for_inputs();
  release_dependents();
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  if (!tiles::read_tile<kTileM>(work, tiles_max, dense_rows, tile_info, pair_of)) return;
  const int expert = tile_info[0], rows = tile_info[2];

  // This thread's x loads: a float4 of each of kALoads rows (32 threads a row).
  const int a_col = (tid % (kStepK / 4)) * 4;
  int a_row[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int r = tid / (kStepK / 4) + i * (kThreads / (kStepK / 4));
    a_row[i] = pair_of[r] >= 0 ? static_cast<int>(pair_of[r] / a_row_div) : -1;
  }
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * (kSwiGlu ? kTileN / 2 : kTileN);
  auto weight_row = [&](int n) { return tiles::weight_row<kSwiGlu>(n0, n, n_out); };
  // This thread's chunks: item i is tile column w_n[i], the step's chunk w_j[i].
  int w_n[kWItems], w_j[kWItems], w_row[kWItems];
#pragma unroll
  for (int i = 0; i < kWItems; ++i) {
    const int item = tid + i * kThreads;
    w_n[i] = item / kChunksStep;
    w_j[i] = item % kChunksStep;
    w_row[i] = static_cast<int>(weight_row(w_n[i]));
  }

  // Split K (dense products with few tiles): columns [k_begin, k_end), a multiple of 128 wide
  // except the last, summed into slice blockIdx.z of `out`.
  const std::int64_t k_begin = static_cast<std::int64_t>(blockIdx.z) * k_chunk,
                     k_end = min(K, k_begin + k_chunk);
  const std::int64_t chunks_end = F::chunks(k_end);
  out += static_cast<std::int64_t>(blockIdx.z) * dense_rows * n_out;

  typename F::Raw w_next[kWItems];
  bool w_live[kWItems];
  auto load = [&](std::int64_t k0) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int r = tid / (kStepK / 4) + i * (kThreads / (kStepK / 4));
      const bool live = a_row[i] >= 0 && k0 + a_col < k_end;
      cp_async16(x_next + r * kStepK + a_col, live ? a + a_row[i] * K + k0 + a_col : a, live);
    }
    cp_async_commit();
#pragma unroll
    for (int i = 0; i < kWItems; ++i) {
      const std::int64_t c = k0 / F::kChunk + w_j[i];
      w_live[i] = w_row[i] >= 0 && c < chunks_end;
      if (w_live[i]) w_next[i] = F::load(w.row(expert, w_row[i]), w.side_row(expert, w_row[i]), c);
    }
  };
  // After every thread's copies of x have landed (cp_async_wait, then a barrier).
  auto store = [&](std::int64_t k0) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int r = tid / (kStepK / 4) + i * (kThreads / (kStepK / 4));
      const float4 x4 = *reinterpret_cast<const float4*>(x_next + r * kStepK + a_col);
      tiles::store_split(x4, x_hi + r * kLd + a_col, x_lo + r * kLd + a_col);
      if constexpr (F::kHasMin) {
        // The group's 16 columns are 4 neighbouring threads' float4s.
        float s = (x4.x + x4.y) + (x4.z + x4.w);
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (tid % 4 == 0) x_sums[(a_col / 16) * kTileM + r] = s;
      }
    }
#pragma unroll
    for (int i = 0; i < kWItems; ++i) {
      float v[F::kChunk], fa[F::kChunk / 16], fb[F::kChunk / 16];
      if (w_live[i]) {
        F::factors(w_next[i], v, fa, fb);
      } else {
#pragma unroll
        for (int q = 0; q < F::kChunk; ++q) v[q] = 0.0f;
#pragma unroll
        for (int q = 0; q < F::kChunk / 16; ++q) fa[q] = fb[q] = 0.0f;
      }
      const std::int64_t c = k0 / F::kChunk + w_j[i];
      bf16_bits* row = w_s + w_n[i] * kLd;
#pragma unroll
      for (int run = 0; run < F::kChunk / 32; ++run) {
        const int col = static_cast<int>(F::column(c, run) - k0);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float* e = v + 32 * run + 8 * q;
          reinterpret_cast<uint4*>(row + col)[q] =
              make_uint4(tiles::bf16x2(e[0], e[1]), tiles::bf16x2(e[2], e[3]),
                         tiles::bf16x2(e[4], e[5]), tiles::bf16x2(e[6], e[7]));
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int g = 2 * run + half;
          factors[((col + 16 * half) / 16) * kTileN + w_n[i]] =
              make_float2(fa[g], F::kHasMin ? fb[g] : 0.0f);
        }
      }
    }
  };

  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  float acc[2][kNT][4] = {};
  const int steps = static_cast<int>((k_end - k_begin + kStepK - 1) / kStepK);
  load(k_begin);
  cp_async_wait<0>();
  __syncthreads();
  store(k_begin);
  __syncthreads();
  for (int step = 0; step < steps; ++step) {
    const std::int64_t k_next = k_begin + static_cast<std::int64_t>(step + 1) * kStepK;
    if (step + 1 < steps) load(k_next);
#pragma unroll 1
    for (int g = 0; g < kGroupsK; ++g) {
      const int kk = 16 * g;
      unsigned b[kNT][2];
#pragma unroll
      for (int nj = 0; nj < kNT / 2; ++nj) {
        unsigned t[4];
        const int n = warp_n * kWarpN + nj * 16 + (lane % 8) + (lane / 16) * 8;
        tiles::ldmatrix_x4(t, w_s + n * kLd + kk + ((lane / 8) % 2) * 8);
        b[2 * nj][0] = t[0], b[2 * nj][1] = t[1], b[2 * nj + 1][0] = t[2], b[2 * nj + 1][1] = t[3];
      }
      float2 f[kNT][2];
#pragma unroll
      for (int ni = 0; ni < kNT; ++ni)
#pragma unroll
        for (int q = 0; q < 2; ++q)
          f[ni][q] = factors[g * kTileN + warp_n * kWarpN + ni * 8 + 2 * (lane % 4) + q];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        unsigned ah[4], al[4];
        const int r = warp_m * 32 + mi * 16 + lane % 16, c = kk + (lane / 16) * 8;
        tiles::ldmatrix_x4(ah, x_hi + r * kLd + c);
        tiles::ldmatrix_x4(al, x_lo + r * kLd + c);
        float xs[2] = {0.0f, 0.0f};
        if constexpr (F::kHasMin) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            xs[h] = x_sums[g * kTileM + warp_m * 32 + mi * 16 + lane / 4 + 8 * h];
        }
#pragma unroll
        for (int ni = 0; ni < kNT; ++ni) {
          float t[4] = {};
          tiles::mma_bf16(t, al, b[ni][0], b[ni][1]);
          tiles::mma_bf16(t, ah, b[ni][0], b[ni][1]);
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              float& s = acc[mi][ni][2 * h + q];
              s = fmaf(t[2 * h + q], f[ni][q].x, s);
              if constexpr (F::kHasMin) s = fmaf(-f[ni][q].y, xs[h], s);
            }
        }
      }
    }
    if (step + 1 < steps) {
      cp_async_wait<0>();
      __syncthreads();  // every warp is done with this step's tiles, and x_next has landed
      store(k_next);
    }
    __syncthreads();
  }

  tiles::store_tile<kSwiGlu, kNT>(acc, warp_m * 32, warp_n * kWarpN, rows, pair_of, n0, n_out,
                                  limit, out);
}

// work null: a dense product of P rows of a (E 1), K cut into `splits` ranges of k_chunk.
template <typename F, bool kSwiGlu, int kTileM>
cudaError_t launch_tiles(const float* a, std::int64_t a_row_div, const packed::Rows& w,
                         std::int64_t n_out, std::int64_t K, const std::int32_t* work,
                         std::int64_t P, std::int64_t E, float limit, float* out,
                         cudaStream_t stream, int splits = 1, std::int64_t k_chunk = 0) {
  constexpr auto kernel = packed_tiles_kernel<F, kSwiGlu, kTileM>;
  constexpr auto bytes = kSharedBytes<kTileM>;
  if (!allow_dynamic_shared<kernel, bytes>()) return cudaErrorInvalidConfiguration;
  const std::int64_t per_tile = kSwiGlu ? kTileN / 2 : kTileN;
  const auto count = work ? tiles::max_tiles(P, E, kTileM) : (P + kTileM - 1) / kTileM;
  if (count > tiles::kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((n_out + per_tile - 1) / per_tile),
                  static_cast<unsigned>(count), static_cast<unsigned>(splits));
  return launch_overlapped(kernel, grid, kThreads, bytes, stream, a, a_row_div, w, n_out, K, work,
                           static_cast<int>(count), static_cast<int>(P), k_chunk > 0 ? k_chunk : K,
                           limit, out);
}

// kernel<F> for w's format at the tile rows asked for.
template <bool kSwiGlu>
cudaError_t launch_format(const Weight& w, const std::uint8_t* codebook, int tile_rows,
                          const float* a, std::int64_t a_row_div, std::int64_t n_out,
                          std::int64_t K, const std::int32_t* work, std::int64_t P, std::int64_t E,
                          float limit, float* out, cudaStream_t stream, int splits = 1,
                          std::int64_t k_chunk = 0) {
  cudaError_t e = cudaErrorInvalidValue;
  const packed::Rows m = packed::rows_of(w, codebook);
  packed::with_format(w, [&](auto f) {
    using F = decltype(f);
    e = tile_rows == kGroupedRowsSmall
            ? launch_tiles<F, kSwiGlu, kGroupedRowsSmall>(a, a_row_div, m, n_out, K, work, P, E,
                                                          limit, out, stream, splits, k_chunk)
            : launch_tiles<F, kSwiGlu, kGroupedRows>(a, a_row_div, m, n_out, K, work, P, E, limit,
                                                     out, stream, splits, k_chunk);
  });
  return e;
}

}  // namespace

int packed_tile_rows(int wanted) {
  return wanted == kGroupedRows && kSharedBytes<kGroupedRows> > shared_memory_limit()
             ? kGroupedRowsSmall
             : wanted;
}

bool packed_products_take(const Weight& w, const void* x) {
  return packed::decodable(w) && w.cols() > 0 && w.cols() % 4 == 0 &&
         reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
}

cudaError_t grouped_gate_up_packed(const float* x, std::int64_t k, const Weight& gate_up,
                                   const std::uint8_t* codebook, std::int64_t E, std::int64_t H,
                                   std::int64_t I, float limit, const std::int32_t* work,
                                   std::int64_t P, int tile_rows, float* act, cudaStream_t stream) {
  return launch_format<true>(gate_up, codebook, tile_rows, x, k, I, H, work, P, E, limit, act,
                             stream);
}

cudaError_t grouped_down_packed(const float* act, const Weight& down, const std::uint8_t* codebook,
                                std::int64_t E, std::int64_t H, std::int64_t I,
                                const std::int32_t* work, std::int64_t P, int tile_rows,
                                float* part, cudaStream_t stream) {
  return launch_format<false>(down, codebook, tile_rows, act, 1, H, I, work, P, E, 0.0f, part,
                              stream);
}

cudaError_t dense_product_packed(const float* x, std::int64_t S, const Weight& w,
                                 const std::uint8_t* codebook, float* y, cudaStream_t stream,
                                 DenseSplit split, float* partials) {
  const bool cut = split.splits > 1 && partials != nullptr;
  const std::int64_t in = w.cols(), out = w.rows();
  const cudaError_t e = launch_format<false>(w, codebook, packed_tile_rows(kGroupedRows), x, 1, out,
                                             in, nullptr, S, 1, 0.0f, cut ? partials : y, stream,
                                             cut ? split.splits : 1, cut ? split.k_chunk : 0);
  if (e != cudaSuccess || !cut) return e;
  return add_splits(partials, split.splits, S * out, y, stream);
}

}  // namespace fs::cuda
