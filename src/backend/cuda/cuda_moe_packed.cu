// The routed experts on packed weights (FP4 E2M1 + E8M0 as DeepSeek V4 releases its experts, the
// GGUF block types of ds4's and llama.cpp's files): the pair path of cuda_moe.cu over the packed
// GEMV core. Per (token, expert) pair, kG lanes per output row decode the routed expert's rows
// in registers (only routed experts' bytes are read), then the combine pass adds the pairs in
// the CPU reference's order. gate_up and down may be packed in different formats.
#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_moe_common.cuh"
#include "backend/cuda/cuda_moe_packed.h"
#include "backend/cuda/cuda_packed.cuh"

namespace fs::cuda {
namespace {

constexpr int kPackedMoeThreads = 256;

// act[p, r] = swiglu(gate_up[e] row r · x[s], gate_up[e] row I + r · x[s]), p = (s, j),
// e = experts[p]; kG lanes per r (no early exit: the group sums take whole warps, and the block
// stages x when kStaged).
template <typename F, int kG, bool kStaged>
__global__ void __launch_bounds__(kPackedMoeThreads)
    moe_gate_up_packed_kernel(const float* x, packed::Rows gu, const std::int32_t* experts,
                              std::int64_t k, std::int64_t E, std::int64_t H, std::int64_t I,
                              float limit, float* act) {
  wait_for_inputs();  // the ids and x are the kernels' before (launched overlapped)
  release_dependents();
  const std::int64_t p = blockIdx.x;
  const std::int64_t r = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const std::int64_t e = experts[p];
  const bool live = r < I && e >= 0 && e < E;
  const std::uint8_t* rows[2] = {live ? gu.row(e, r) : nullptr, live ? gu.row(e, I + r) : nullptr};
  const std::uint8_t* scale_rows[2] = {live ? gu.side_row(e, r) : nullptr,
                                       live ? gu.side_row(e, I + r) : nullptr};
  const float* xs[2] = {x + (p / k) * H, x + (p / k) * H};
  float acc[2][1] = {};
  packed_rows_dot<F, 1, 2, kG, F::kUnroll, true, false, kStaged>(rows, scale_rows, xs, H,
                                                                 F::chunks(H), lane, acc);
  const float g = group_sum<kG>(acc[0][0]), u = group_sum<kG>(acc[1][0]);
  if (lane == 0 && r < I) act[p * I + r] = live ? clamped_swiglu(g, u, limit) : 0.0f;
}

// IQ2_XXS rows of four rounds (DeepSeek V4's routed gate/up, 4,096 columns) take 135 registers,
// one block a multiprocessor: held to two (ptxas, session 33); of three rounds (the Qwen IQ2_XXS
// mix at 2,560 columns) 131-133, which left that mix's one-token gate/up on one row a warp: held
// to two as well (session 37). The others keep the compiler's choice (a bound on Q4_K's and
// Q8_0's four rounds would spill; they stay one row a warp).
template <typename F, int kU>
constexpr int stream_min_blocks() {
  return (kU == 4 || kU == 3) && std::is_same_v<F, packed::IQ2_XXS> ? 2 : 1;
}

// One token's act as moe_gate_up_packed_kernel computes it, with its (pair, row) items streamed
// through resident warps: item i = (p, r) = (i / I, i % I), a warp takes items warp, warp +
// warps, ... and walks their rows gate, up, gate, up, ..., issuing each row's loads before it
// decodes the row before it (packed_gemv_stream_kernel's form, one row in flight: a gate and an up
// row both in flight took 236 registers in Q4_K). x is staged once a block. The same lanes,
// chunks and packed_chunk_dot as kG = 32 there, so the same bits
// (QuantOps.StreamedPackedRowsGiveTheOneRowAWarpBits). Rows of at most kU rounds of a warp's
// chunks. An MTP verify's S = P / k tokens (session 37): each token's x staged as its one-token x
// (with its group sums), `slab` float4s apart, a pair's rows reading its token's: the same sums.
template <typename F, int kU>
__global__ void __launch_bounds__(kPackedMoeThreads, stream_min_blocks<F, kU>())
    moe_gate_up_packed_stream_kernel(const float* x, packed::Rows gu, const std::int32_t* experts,
                                     std::int64_t P, std::int64_t k, std::int64_t E, std::int64_t H,
                                     std::int64_t I, float limit, float* act) {
  wait_for_inputs();  // the ids and x are the kernels' before (launched overlapped)
  release_dependents();
  using L = PackedStagedX<F, kWarp>;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kPackedMoeThreads / kWarp);
  const std::int64_t items = P * I, chunks = F::chunks(H);
  std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kPackedMoeThreads / kWarp) +
                   static_cast<std::int64_t>(threadIdx.x / kWarp);
  typename F::Raw raw[2][kU];  // [gate, up][round]
  // Row h (0 gate, 1 up) of item `item`: nothing loaded past the last item or for a pair routed
  // nowhere.
  const auto load_row = [&](std::int64_t item, int h, typename F::Raw(&dst)[kU]) {
    const std::int64_t q = index_quotient(item, I);
    const std::int64_t e = item < items ? experts[q] : -1, r = item - q * I + h * I;
    const bool live = e >= 0 && e < E;
    const std::uint8_t* row = live ? gu.row(e, r) : nullptr;
    const std::uint8_t* side = live ? gu.side_row(e, r) : nullptr;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = lane + static_cast<std::int64_t>(u) * kWarp;
      dst[u] = row != nullptr && c < chunks ? F::load(row, side, c) : typename F::Raw{};
    }
  };
  const auto dot = [&](const typename F::Raw(&src)[kU], std::int64_t staged_tw, std::int64_t base) {
    float acc[1] = {0.0f};
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = lane + static_cast<std::int64_t>(u) * kWarp;
      if (c < chunks) packed_chunk_dot<F, 1, kWarp, true>(src[u], c, x, 0, staged_tw, acc, base);
    }
    return group_sum<kWarp>(acc[0]);
  };
  load_row(i, 0, raw[0]);
  const std::int64_t slab = packed_token_slab_words<F, kWarp>(chunks);
  for (std::int64_t s = 0; s < P / k; ++s)
    stage_packed_x<F, kWarp, 1>(x + s * H, 0, chunks, s * slab);
  const std::int64_t staged_tw = L::token_words(chunks);
  for (; i < items; i += warps) {
    const std::int64_t base = index_quotient(index_quotient(i, I), k) * slab;
    load_row(i, 1, raw[1]);
    const float g = dot(raw[0], staged_tw, base);
    load_row(i + warps, 0, raw[0]);
    const float u = dot(raw[1], staged_tw, base);
    const std::int64_t e = experts[index_quotient(i, I)];
    if (lane == 0) act[i] = e >= 0 && e < E ? clamped_swiglu(g, u, limit) : 0.0f;
  }
}

// moe_gate_up_packed_stream_kernel for rows of one round and a quarter (Q4_K gate/up at 2,560
// columns: 40 chunks): an item's gate and up rows share their last round (packed::SharedTail
// with kP 2, row 0 the gate, row 1 the up), 3 rounds an item instead of 4, and each round's
// buffer is refilled with the next item's as soon as it is decoded. The bits are one row a
// warp's (packed::shared_tail_sums; QuantOps.StreamedPackedRowsGiveTheOneRowAWarpBits). S = P / k
// tokens as moe_gate_up_packed_stream_kernel takes them.
template <typename F, int kFull, int kTail>
__global__ void __launch_bounds__(kPackedMoeThreads, packed::kStreamMinBlocks)
    moe_gate_up_packed_tail_kernel(const float* x, packed::Rows gu, const std::int32_t* experts,
                                   std::int64_t P, std::int64_t k, std::int64_t E, std::int64_t H,
                                   std::int64_t I, float limit, float* act) {
  using T = packed::SharedTail<kFull, kTail, 2>;
  wait_for_inputs();  // the ids and x are the kernels' before (launched overlapped)
  release_dependents();
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kPackedMoeThreads / kWarp);
  const std::int64_t items = P * I, chunks = F::chunks(H);
  std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kPackedMoeThreads / kWarp) +
                   static_cast<std::int64_t>(threadIdx.x / kWarp);
  typename F::Raw raw[T::kRounds];
  // Round q of item `item`: nothing loaded past the last item or for a pair routed nowhere.
  const auto load = [&](std::int64_t item, int q) {
    const std::int64_t p = index_quotient(item, I);
    const std::int64_t e = item < items ? experts[p] : -1;
    const std::int64_t r = item - p * I + T::row(q, lane) * I;
    raw[q] = e >= 0 && e < E && T::live(q, lane)
                 ? F::load(gu.row(e, r), gu.side_row(e, r), T::chunk(q, lane))
                 : typename F::Raw{};
  };
#pragma unroll
  for (int q = 0; q < T::kRounds; ++q) load(i, q);
  const std::int64_t slab = packed_token_slab_words<F, kWarp>(chunks);
  for (std::int64_t s = 0; s < P / k; ++s)
    stage_packed_x<F, kWarp, 1>(x + s * H, 0, chunks, s * slab);
  const std::int64_t staged_tw = PackedStagedX<F, kWarp>::token_words(chunks);
  for (; i < items; i += warps) {
    const std::int64_t base = index_quotient(index_quotient(i, I), k) * slab;
    float gu_sums[2];
    packed::shared_tail_sums<F, kFull, kTail, 2>(
        raw, lane, x, staged_tw, [&](int q) { load(i + warps, q); }, gu_sums, base);
    const std::int64_t e = experts[index_quotient(i, I)];
    if (lane == 0) act[i] = e >= 0 && e < E ? clamped_swiglu(gu_sums[0], gu_sums[1], limit) : 0.0f;
  }
}

// out[p, c] = down[e] row c · act[p]; kG lanes per c (kStaged: act in shared memory).
template <typename F, int kG, bool kStaged>
__global__ void __launch_bounds__(kPackedMoeThreads)
    moe_down_packed_kernel(const float* act, packed::Rows down, const std::int32_t* experts,
                           std::int64_t E, std::int64_t H, std::int64_t I, float* out) {
  wait_for_inputs();  // act is the kernel's before (launched overlapped)
  release_dependents();
  const std::int64_t p = blockIdx.x;
  const std::int64_t c = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const std::int64_t e = experts[p];
  const bool live = c < H && e >= 0 && e < E;
  const std::uint8_t* rows[1] = {live ? down.row(e, c) : nullptr};
  const std::uint8_t* scale_rows[1] = {live ? down.side_row(e, c) : nullptr};
  const float* xs[1] = {act + p * I};
  float acc[1][1] = {};
  packed_rows_dot<F, 1, 1, kG, F::kUnroll, true, false, kStaged>(rows, scale_rows, xs, I,
                                                                 F::chunks(I), lane, acc);
  const float v = group_sum<kG>(acc[0][0]);
  if (lane == 0 && c < H) out[p * H + c] = live ? v : 0.0f;
}

// Launches kernel<F, kG> for `rows` output rows of `in` inputs per pair, kG by the row length.
template <typename F, typename Launch>
void by_lanes(std::int64_t in, Launch&& launch) {
  if (packed::short_rows(F::chunks(in)))
    launch(std::integral_constant<int, 8>{});
  else
    launch(std::integral_constant<int, kWarp>{});
}

}  // namespace

// The routed gate/up of moe_experts_packed (act = swiglu of each pair's gate and up rows · x):
// for one token the (pair, row) items streamed through resident warps where the rows allow,
// else one row a group (cuda_moe_packed.h).
void launch_packed_gate_up(const float* x, const Weight& gate_up, const std::uint8_t* codebook,
                           const std::int32_t* ids, std::int64_t S, std::int64_t k, std::int64_t E,
                           std::int64_t H, std::int64_t I, float swiglu_limit, float* act,
                           cudaStream_t stream) {
  const auto P = S * k;
  packed::with_format(gate_up, [&](auto f) {
    using F = decltype(f);
    const auto chunks = F::chunks(H);
    // The streamed kernels stage each token's x as its one-token x: S slabs (past 48 KB for
    // four tokens of Q4_K at 2,560: 17 KB a token, opted into below).
    const auto one = packed_staged_x_bytes<F, kWarp, 1>(chunks);
    const auto staged =
        one == 0 ? std::size_t{0}
                 : static_cast<std::size_t>(S * packed_token_slab_words<F, kWarp>(chunks)) *
                       sizeof(float4);
    const int rounds = static_cast<int>((chunks + kWarp - 1) / kWarp);
    // Four rounds only for IQ2_XXS (DeepSeek V4's ds4 mix: 106.5 -> 90.8 us on an H100, session
    // 33). FP4's four rounds streamed were no faster (143.2 against 143.3 us) and Q2_K's are not
    // measured: both keep one row a warp.
    const bool four = rounds == 4 && std::is_same_v<F, packed::IQ2_XXS>;
    if (S <= kMaxPairTokens && !packed::short_rows(chunks) && staged != 0 &&
        staged <= kMaxStagedXOptInBytes && (rounds <= 3 || four) && packed::stream_rows_enabled() &&
        (S == 1 || packed::stream_tokens_enabled())) {
      // The (pair, row) items streamed through resident warps.
      const auto stream_launch = [&](auto tag) {
        constexpr auto kernel = decltype(tag)::kKernel;
        if (staged > kMaxStagedXBytes && !allow_dynamic_shared<kernel, kMaxStagedXOptInBytes>())
          return false;
        const auto grid = streamed_grid(reinterpret_cast<const void*>(kernel), kPackedMoeThreads,
                                        staged, P * I, packed::kStreamMinBlocks);
        if (grid == 0) return false;
        launch_overlapped(kernel, grid, kPackedMoeThreads, staged, stream, x,
                          packed::rows_of(gate_up, codebook), ids, P, k, E, H, I, swiglu_limit,
                          act);
        return true;
      };
      // Rows of one round and a quarter (Q4_K at 2,560): gate and up share their last round.
      if constexpr (packed::kSharedTailFits<F>) {
        if (packed::shared_tail_takes(chunks) &&
            stream_launch(KernelTag<moe_gate_up_packed_tail_kernel<F, 1, kWarp / 4>>{}))
          return;
      }
      if (rounds == 1   ? stream_launch(KernelTag<moe_gate_up_packed_stream_kernel<F, 1>>{})
          : rounds == 2 ? stream_launch(KernelTag<moe_gate_up_packed_stream_kernel<F, 2>>{})
          : rounds == 3 ? stream_launch(KernelTag<moe_gate_up_packed_stream_kernel<F, 3>>{})
                        : stream_launch(KernelTag<moe_gate_up_packed_stream_kernel<F, 4>>{}))
        return;
    }
    by_lanes<F>(H, [&](auto lanes) {
      constexpr int kG = decltype(lanes)::value;
      const dim3 grid(static_cast<unsigned>(P), grid_for(I * kG, kPackedMoeThreads));
      const auto smem = packed_staged_x_bytes<F, kG, 1>(F::chunks(H));
      launch_overlapped(smem != 0 ? moe_gate_up_packed_kernel<F, kG, true>
                                  : moe_gate_up_packed_kernel<F, kG, false>,
                        grid, kPackedMoeThreads, smem, stream, x,
                        packed::rows_of(gate_up, codebook), ids, k, E, H, I, swiglu_limit, act);
    });
  });
}

void CudaBackend::moe_experts_packed(const Tensor& x, const Weight& gate_up, const Weight& down,
                                     const Tensor& experts, const Tensor& weights,
                                     float swiglu_limit, Tensor& y) {
  constexpr const char* kOp = "moe_experts";
  const auto E = gate_up.shape[0], I = gate_up.shape[1] / 2, H = x.cols(), S = x.rows();
  for (const Weight* w : {&gate_up, &down}) {
    if (auto st = w->check_storage(); !st.ok()) return fail(st.with_context("cuda: moe_experts"));
    if (!packed::decodable(*w))
      return fail(unsupported_format("cuda: moe_experts", *w,
                                     "packed experts in FP4 E2M1 (rows of whole 32-blocks) or "
                                     "Q8_0/Q2_K/Q4_K/Q5_K/Q6_K/IQ2_XXS, both gate_up and down"));
  }
  const std::uint8_t* codebook = nullptr;
  if ((gate_up.storage() == quant::QuantType::kIQ2_XXS ||
       down.storage() == quant::QuantType::kIQ2_XXS) &&
      (codebook = iq2_grid()) == nullptr)
    return;
  const auto k = experts.cols();
  if (!check(experts.dtype() == DType::kI32 && experts.rows() == S &&
                 weights.dtype() == DType::kF32 && weights.rows() == S && weights.cols() == k,
             kOp, "experts must be int32 [S, k] and weights f32 [S, k]"))
    return;
  if (!check(k <= kMaxTopK, kOp, "more than 64 experts per token")) return;
  if (!check(reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0, kOp,
             "x must be 16-byte aligned for packed experts"))
    return;
  if (!ensure(y, {S, H})) return;
  if (S == 0 || H == 0) return;
  const auto P = S * k;
  if (P == 0 || I == 0) {
    memory_->zero(y.raw(), y.bytes());
    return;
  }
  const auto* ids = experts.data_as<std::int32_t>();
  Tensor& act = scratch(moe_act_);
  Tensor& outp = scratch(moe_out_);
  if (!ensure(act, {P, I}) || !ensure(outp, {P, H})) return;
  // A prefill: each expert's blocks decoded once for a tile of up to 64 (or 32) of its pairs, on
  // the tensor cores (cuda_grouped_packed.cu). FLASHSERVE_CUDA_MOE_PAIRS=1 keeps the pair GEMVs.
  const int rows = packed_tile_rows(grouped_tile_rows(P, E));
  if (S > kMaxPairTokens && !env_flag("FLASHSERVE_CUDA_MOE_PAIRS") && E <= kMaxGroupedExperts &&
      packed_products_take(gate_up, x.data()) && packed_products_take(down, act.data()) &&
      grouped_tiles_fit(P, E, rows)) {
    grouped_experts(
        experts, weights, E, rows,
        [&](const std::int32_t* work) {
          return grouped_gate_up_packed(x.data(), k, gate_up, codebook, E, H, I, swiglu_limit, work,
                                        P, rows, act.data(), stream());
        },
        [&](const std::int32_t* work) {
          return grouped_down_packed(act.data(), down, codebook, E, H, I, work, P, rows,
                                     outp.data(), stream());
        },
        outp, y);
    return;
  }
  if (walking()) return;
  launch_packed_gate_up(x.data(), gate_up, codebook, ids, S, k, E, H, I, swiglu_limit, act.data(),
                        stream());
  if (!launched(kOp)) return;
  packed::with_format(down, [&](auto f) {
    using F = decltype(f);
    by_lanes<F>(I, [&](auto lanes) {
      constexpr int kG = decltype(lanes)::value;
      const dim3 grid(static_cast<unsigned>(P), grid_for(H * kG, kPackedMoeThreads));
      const auto smem = packed_staged_x_bytes<F, kG, 1>(F::chunks(I));
      launch_overlapped(
          smem != 0 ? moe_down_packed_kernel<F, kG, true> : moe_down_packed_kernel<F, kG, false>,
          grid, kPackedMoeThreads, smem, stream(), act.data(), packed::rows_of(down, codebook), ids,
          E, H, I, outp.data());
    });
  });
  if (!launched(kOp)) return;
  launch_overlapped(moe_combine_kernel, dim3(static_cast<unsigned>(P / k), grid_for(H, 256)), 256,
                    0, stream(), outp.data(), weights.data(), ids, E, k, H, y.data());
  launched(kOp);
}

}  // namespace fs::cuda
