// The packed GEMV of 1-4 tokens (FP4 E2M1 + E8M0, GGUF blocks): every weight byte read once and
// decoded in registers (cuda_packed_formats.cuh), in the forms a decode step and an MTP verify
// take (docs/GPU.md steps 18, 21, 22). One body for every caller: `linear` over one matrix
// (cuda_linear_packed.cu) and the fused decode ops over several matrices with their epilogues
// (cuda_fused.cu: the GatedDeltaNet in-projections with the conv, QSA's projections), so a row's
// sum is the same wherever it is taken.
//
// A kernel reads row r's bytes through its source (`src.row(r)`, `src.side_row(r)`: the format's
// side data, FP4's scale row or IQ2_XXS's codebook) and hands the row's sum for token s to its
// sink (`sink(r, s, v)`, lane 0 of the row's lanes), after its wait: a sink may read what the
// kernel before wrote.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_packed.cuh"

namespace fs::cuda::packed_gemv {

// One matrix [out, in]: row r at w + r * row_bytes, its side data at side + r * side_row_bytes.
struct MatrixRows {
  const std::uint8_t* w;
  std::int64_t row_bytes;
  const std::uint8_t* side;
  std::int64_t side_row_bytes;
  __device__ __forceinline__ const std::uint8_t* row(std::int64_t r) const {
    return w + r * row_bytes;
  }
  __device__ __forceinline__ const std::uint8_t* side_row(std::int64_t r) const {
    return side != nullptr ? side + r * side_row_bytes : nullptr;
  }
};

// y[s, r] = v: linear's output [S, out].
struct StoreRows {
  float* y;
  std::int64_t out;
  __device__ __forceinline__ void operator()(std::int64_t r, int s, float v) const {
    y[s * out + r] = v;
  }
};

// y[s, r] = W[r] · x[s], s < kS: kG lanes per weight row; kStaged: x in shared memory.
template <typename F, int kS, int kG, bool kStaged, typename Src, typename Sink>
__global__ void __launch_bounds__(kGemvThreads)
    packed_gemv_kernel(const float* x, const Src src, const Sink sink, std::int64_t in,
                       std::int64_t out) {
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const std::uint8_t* rows[1] = {r < out ? src.row(r) : nullptr};
  const std::uint8_t* scale_rows[1] = {r < out ? src.side_row(r) : nullptr};
  const float* xs[1] = {x};
  float acc[1][kS] = {};
  // The weights' first round before the wait (launched overlapped), x after it.
  packed_rows_dot<F, kS, 1, kG, F::kUnroll, true, true, kStaged>(rows, scale_rows, xs, in,
                                                                 F::chunks(in), lane, acc);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float v = group_sum<kG>(acc[0][s]);
    if (lane == 0 && r < out) sink(r, s, v);
  }
}

// The one-token GEMV of rows that a warp covers in one round (chunks <= 32 * kU), as rows
// streamed through resident warps: each warp takes rows warp, warp + warps, ... of the grid and
// issues the next row's loads before it decodes the current one, so a warp's memory round trip
// overlaps its decoding. packed_gemv_kernel gives every warp one row: its blocks load, wait, then
// decode in step, wave after wave (ncu, session 23: no warp eligible half the cycles), and each
// of its 1,280 blocks at 2560 -> 10240 stages all of x. A lane's chunks are lane, lane + 32, ...
// in that order through packed_chunk_dot, so each row has packed_gemv_kernel's bits
// (QuantOps.StreamedPackedRowsGiveTheOneRowAWarpBits). FLASHSERVE_CUDA_PACKED_STREAM=0: that
// kernel.
template <typename F, int kU, typename Src, typename Sink>
__global__ void __launch_bounds__(kGemvThreads)
    packed_gemv_stream_kernel(const float* x, const Src src, const Sink sink, std::int64_t in,
                              std::int64_t out) {
  using L = PackedStagedX<F, kWarp>;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kGemvThreads / kWarp);
  std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kGemvThreads / kWarp) +
                   static_cast<std::int64_t>(threadIdx.x / kWarp);
  const std::int64_t chunks = F::chunks(in);
  typename F::Raw raw[2][kU];
  const auto load_row = [&](std::int64_t row, typename F::Raw(&dst)[kU]) {
    const std::uint8_t* wr = row < out ? src.row(row) : nullptr;
    const std::uint8_t* sr = row < out ? src.side_row(row) : nullptr;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = lane + static_cast<std::int64_t>(u) * kWarp;
      dst[u] = row < out && c < chunks ? F::load(wr, sr, c) : typename F::Raw{};
    }
  };
  // The first row's weights before the wait (no kernel writes them), x after it.
  load_row(r, raw[0]);
  wait_for_inputs();
  release_dependents();
  stage_packed_x<F, kWarp, 1>(x, 0, chunks);
  const std::int64_t staged_tw = L::token_words(chunks);
  // Two buffers, unrolled by two so that each is a fixed register set.
  for (; r < out; r += 2 * warps) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const std::int64_t row = r + b * warps;
      if (row >= out) break;
      load_row(row + warps, raw[1 - b]);
      float acc[1] = {0.0f};
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const std::int64_t c = lane + static_cast<std::int64_t>(u) * kWarp;
        if (c < chunks) packed_chunk_dot<F, 1, kWarp, true>(raw[b][u], c, x, 0, staged_tw, acc);
      }
      const float v = group_sum<kWarp>(acc[0]);
      if (lane == 0) sink(row, 0, v);
    }
  }
}

// The one-token GEMV of rows of 32 * kFull + kTail chunks (Q4_K at 2,560 columns: 40 chunks,
// kFull 1, kTail 8), streamed like packed_gemv_stream_kernel but kP rows a warp at a time, their
// last chunks sharing one round (packed::SharedTail: at 2,560, 3 rounds for 2 rows instead of 4,
// or 4 for 3 instead of 6), with one row a warp's bits (packed::shared_tail_sums;
// QuantOps.StreamedPackedRowsGiveTheOneRowAWarpBits). Each round's buffer is refilled with the
// next group's same round as soon as it is decoded, so a group's loads are in flight while the
// one before it decodes. kP is held where the registers allow two blocks a multiprocessor (ptxas,
// session 33: Q4_K at kP 2 takes 127 registers, at kP 3 it spills 160 bytes at the bound of two
// blocks a multiprocessor; packed::shared_tail_rows picks).
template <typename F, int kFull, int kTail, int kP, typename Src, typename Sink>
__global__ void __launch_bounds__(kGemvThreads, packed::kStreamMinBlocks)
    packed_gemv_tail_kernel(const float* x, const Src src, const Sink sink, std::int64_t in,
                            std::int64_t out) {
  using T = packed::SharedTail<kFull, kTail, kP>;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kGemvThreads / kWarp);
  std::int64_t group = blockIdx.x * static_cast<std::int64_t>(kGemvThreads / kWarp) +
                       static_cast<std::int64_t>(threadIdx.x / kWarp);
  const std::int64_t groups = (out + kP - 1) / kP, chunks = F::chunks(in);
  typename F::Raw raw[T::kRounds];
  const auto load = [&](std::int64_t g, int q) {
    const std::int64_t row = g * kP + T::row(q, lane);
    raw[q] = g < groups && row < out && T::live(q, lane)
                 ? F::load(src.row(row), src.side_row(row), T::chunk(q, lane))
                 : typename F::Raw{};
  };
  // The first group's weights before the wait (no kernel writes them), x after it.
#pragma unroll
  for (int q = 0; q < T::kRounds; ++q) load(group, q);
  wait_for_inputs();
  release_dependents();
  stage_packed_x<F, kWarp, 1>(x, 0, chunks);
  const std::int64_t staged_tw = PackedStagedX<F, kWarp>::token_words(chunks);
  for (; group < groups; group += warps) {
    float sums[kP];
    packed::shared_tail_sums<F, kFull, kTail, kP>(
        raw, lane, x, staged_tw, [&](int q) { load(group + warps, q); }, sums);
#pragma unroll
    for (int j = 0; j < kP; ++j) {
      const std::int64_t row = group * kP + j;
      if (lane == 0 && row < out) sink(row, 0, sums[j]);
    }
  }
}

// Queues y = W x for kS tokens of x [kS, in] (16-byte aligned) over `out` rows of F read through
// src, each row's sums handed to sink: streamed rows for one token where a multiprocessor holds
// two blocks of the kernel, else one row a warp (8 lanes for rows shorter than a warp's chunks).
// Every form gives a row the same bits.
template <typename F, int kS, typename Src, typename Sink>
void launch_rows(const float* x, const Src& src, const Sink& sink, std::int64_t in,
                 std::int64_t out, cudaStream_t stream) {
  const auto launch = [&](auto lanes) {
    constexpr int kG = decltype(lanes)::value;
    // x staged past 48 KB where the device allows it: 2-4 tokens of a 64-weight-chunk format's
    // padded rows (64 KB at four tokens of 2,560) read x unstaged otherwise, at a third of the
    // speed (session 23: Q4_K 2560 -> 10240 at four tokens 121 us).
    constexpr auto staged = packed_gemv_kernel<F, kS, kG, true, Src, Sink>;
    auto smem = packed_staged_x_bytes<F, kG, kS>(F::chunks(in), kMaxStagedXOptInBytes);
    if (smem > kMaxStagedXBytes && !allow_dynamic_shared<staged, kMaxStagedXOptInBytes>()) smem = 0;
    auto kernel = smem != 0 ? staged : packed_gemv_kernel<F, kS, kG, false, Src, Sink>;
    launch_overlapped(kernel, grid_for(out * kG, kGemvThreads), kGemvThreads, smem, stream, x, src,
                      sink, in, out);
  };
  const auto chunks = F::chunks(in);
  if (packed::short_rows(chunks)) {
    launch(std::integral_constant<int, 8>{});
    return;
  }
  // One token, rows a warp covers in at most kU = 4 rounds of 32 chunks, x staged: the streamed
  // rows, a grid of the blocks the multiprocessors hold at once.
  if constexpr (kS == 1) {
    const auto smem = packed_staged_x_bytes<F, kWarp, 1>(chunks);
    const int rounds = static_cast<int>((chunks + kWarp - 1) / kWarp);
    if (smem != 0 && rounds <= 4 && packed::stream_rows_enabled()) {
      // Taken where a multiprocessor holds kStreamMinBlocks of the kernel (its registers grow with
      // kU and the format's decoding: Q6_K's two rounds take 240), else one row a warp.
      // `rows_a_warp`: the rows a warp takes at a time.
      const auto stream_launch = [&](auto kernel, std::int64_t rows_a_warp = 1) {
        const auto grid =
            streamed_grid(reinterpret_cast<const void*>(kernel), kGemvThreads, smem,
                          (out + rows_a_warp - 1) / rows_a_warp, packed::kStreamMinBlocks);
        if (grid == 0) return false;
        launch_overlapped(kernel, grid, kGemvThreads, smem, stream, x, src, sink, in, out);
        return true;
      };
      // Rows of one round and a quarter (Q4_K at 2,560 columns): two or three rows a warp share
      // their last round. Not Q5_K and Q6_K, whose decoding would spill at two blocks a
      // multiprocessor (their two-round streamed kernel does not fit two either).
      if constexpr (packed::kSharedTailFits<F>) {
        if (packed::shared_tail_takes(chunks) &&
            (packed::shared_tail_rows() == 3
                 ? stream_launch(packed_gemv_tail_kernel<F, 1, kWarp / 4, 3, Src, Sink>, 3)
                 : stream_launch(packed_gemv_tail_kernel<F, 1, kWarp / 4, 2, Src, Sink>, 2)))
          return;
      }
      const bool streamed =
          rounds == 1   ? stream_launch(packed_gemv_stream_kernel<F, 1, Src, Sink>)
          : rounds == 2 ? stream_launch(packed_gemv_stream_kernel<F, 2, Src, Sink>)
          : rounds == 3 ? stream_launch(packed_gemv_stream_kernel<F, 3, Src, Sink>)
                        : stream_launch(packed_gemv_stream_kernel<F, 4, Src, Sink>);
      if (streamed) return;
    }
  }
  launch(std::integral_constant<int, kWarp>{});
}

}  // namespace fs::cuda::packed_gemv
