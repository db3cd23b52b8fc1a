// Dense products on packed weights (FP4 E2M1 + E8M0, GGUF blocks; backend/weight.h): the packed
// GEMV for up to kPackedGemvRows rows (every weight byte read once, decoded in registers), and
// for more rows the tensor-core tiles of cuda_grouped_packed.cu (the blocks decoded into shared
// memory). FLASHSERVE_CUDA_PREFILL_SGEMM=1, or a shape they do not take: tiles of weight rows
// dequantised into the pooled f32 scratch, one sgemm each, so no dequantised copy outlives the op.
#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_packed.cuh"

namespace fs::cuda {
namespace {

constexpr int kPackedGemvRows = 4;  // x rows up to which the packed GEMV runs (decode, MTP)
constexpr std::size_t kTileBytes = std::size_t{64} << 20;

// y[s, r] = W[r] · x[s], s < kS: kG lanes per weight row; kStaged: x in shared memory.
template <typename F, int kS, int kG, bool kStaged>
__global__ void __launch_bounds__(kGemvThreads)
    packed_gemv_kernel(const float* x, const std::uint8_t* w, std::int64_t row_bytes,
                       const std::uint8_t* scales, std::int64_t scale_row_bytes, float* y,
                       std::int64_t in, std::int64_t out) {
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const std::uint8_t* rows[1] = {r < out ? w + r * row_bytes : nullptr};
  const std::uint8_t* scale_rows[1] = {scales != nullptr && r < out ? scales + r * scale_row_bytes
                                                                    : nullptr};
  const float* xs[1] = {x};
  float acc[1][kS] = {};
  // The weights' first round before the wait (launched overlapped), x after it.
  packed_rows_dot<F, kS, 1, kG, F::kUnroll, true, true, kStaged>(rows, scale_rows, xs, in,
                                                                 F::chunks(in), lane, acc);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float v = group_sum<kG>(acc[0][s]);
    if (lane == 0 && r < out) y[s * out + r] = v;
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
template <typename F, int kU>
__global__ void __launch_bounds__(kGemvThreads)
    packed_gemv_stream_kernel(const float* x, const std::uint8_t* w, std::int64_t row_bytes,
                              const std::uint8_t* scales, std::int64_t scale_row_bytes, float* y,
                              std::int64_t in, std::int64_t out) {
  using L = PackedStagedX<F, kWarp>;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kGemvThreads / kWarp);
  std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kGemvThreads / kWarp) +
                   static_cast<std::int64_t>(threadIdx.x / kWarp);
  const std::int64_t chunks = F::chunks(in);
  typename F::Raw raw[2][kU];
  const auto load_row = [&](std::int64_t row, typename F::Raw(&dst)[kU]) {
    const std::uint8_t* wr = w + row * row_bytes;
    const std::uint8_t* sr = scales != nullptr ? scales + row * scale_row_bytes : nullptr;
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
      if (lane == 0) y[row] = v;
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
template <typename F, int kFull, int kTail, int kP>
__global__ void __launch_bounds__(kGemvThreads, packed::kStreamMinBlocks)
    packed_gemv_tail_kernel(const float* x, const std::uint8_t* w, std::int64_t row_bytes,
                            const std::uint8_t* scales, std::int64_t scale_row_bytes, float* y,
                            std::int64_t in, std::int64_t out) {
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
                 ? F::load(w + row * row_bytes,
                           scales != nullptr ? scales + row * scale_row_bytes : nullptr,
                           T::chunk(q, lane))
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
      if (lane == 0 && row < out) y[row] = sums[j];
    }
  }
}

// Rows [r0, r0 + n) of a packed matrix dequantised to f32 [n, in]: a thread per chunk.
template <typename F>
__global__ void packed_dequantize_kernel(const std::uint8_t* w, std::int64_t row_bytes,
                                         const std::uint8_t* scales, std::int64_t scale_row_bytes,
                                         std::int64_t r0, std::int64_t n, std::int64_t in,
                                         float* dst) {
  const std::int64_t per_row = F::chunks(in), count = n * per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / per_row, c = i % per_row;
    const auto raw = F::load(w + (r0 + r) * row_bytes,
                             scales != nullptr ? scales + (r0 + r) * scale_row_bytes : nullptr, c);
    float v[F::kChunk];
    packed::decode<F>(raw, v);
    float* row = dst + r * in;
#pragma unroll
    for (int run = 0; run < F::kChunk / 32; ++run) {
      float* o = row + F::column(c, run);
#pragma unroll
      for (int q = 0; q < 32; ++q) o[q] = v[32 * run + q];
    }
  }
}

template <typename F, int kS>
void launch_packed_gemv(const float* x, const Weight& w, packed::SideData side, float* y,
                        cudaStream_t stream) {
  const auto in = w.cols(), out = w.rows();
  const auto row_bytes = static_cast<std::int64_t>(w.row_bytes());
  const auto launch = [&](auto lanes) {
    constexpr int kG = decltype(lanes)::value;
    // x staged past 48 KB where the device allows it: 2-4 tokens of a 64-weight-chunk format's
    // padded rows (64 KB at four tokens of 2,560) read x unstaged otherwise, at a third of the
    // speed (session 23: Q4_K 2560 -> 10240 at four tokens 121 us).
    constexpr auto staged = packed_gemv_kernel<F, kS, kG, true>;
    auto smem = packed_staged_x_bytes<F, kG, kS>(F::chunks(in), kMaxStagedXOptInBytes);
    if (smem > kMaxStagedXBytes && !allow_dynamic_shared<staged, kMaxStagedXOptInBytes>()) smem = 0;
    auto kernel = smem != 0 ? staged : packed_gemv_kernel<F, kS, kG, false>;
    launch_overlapped(kernel, grid_for(out * kG, kGemvThreads), kGemvThreads, smem, stream, x,
                      w.data, row_bytes, side.base, side.row_bytes, y, in, out);
  };
  const auto chunks = F::chunks(in);
  if (packed::short_rows(chunks)) {
    launch(std::integral_constant<int, 8>{});
    return;
  }
  // One token, rows a warp covers in at most kU = 4 rounds of 32 chunks, x staged: the streamed
  // rows, a grid of the blocks the multiprocessors hold at once.
  const auto smem = packed_staged_x_bytes<F, kWarp, 1>(chunks);
  const int rounds = static_cast<int>((chunks + kWarp - 1) / kWarp);
  if (kS == 1 && smem != 0 && rounds <= 4 && packed::stream_rows_enabled()) {
    // Taken where a multiprocessor holds kStreamMinBlocks of the kernel (its registers grow with
    // kU and the format's decoding: Q6_K's two rounds take 240), else one row a warp.
    // `rows_a_warp`: the rows a warp takes at a time.
    const auto stream_launch = [&](auto kernel, std::int64_t rows_a_warp = 1) {
      const auto grid =
          streamed_grid(reinterpret_cast<const void*>(kernel), kGemvThreads, smem,
                        (out + rows_a_warp - 1) / rows_a_warp, packed::kStreamMinBlocks);
      if (grid == 0) return false;
      launch_overlapped(kernel, grid, kGemvThreads, smem, stream, x, w.data, row_bytes, side.base,
                        side.row_bytes, y, in, out);
      return true;
    };
    // Rows of one round and a quarter (Q4_K at 2,560 columns): two or three rows a warp share
    // their last round. Not Q5_K and Q6_K, whose decoding would spill at two blocks a
    // multiprocessor (their two-round streamed kernel does not fit two either).
    if constexpr (packed::kSharedTailFits<F>) {
      if (packed::shared_tail_takes(chunks) &&
          (packed::shared_tail_rows() == 3
               ? stream_launch(packed_gemv_tail_kernel<F, 1, kWarp / 4, 3>, 3)
               : stream_launch(packed_gemv_tail_kernel<F, 1, kWarp / 4, 2>, 2)))
        return;
    }
    const bool streamed = rounds == 1   ? stream_launch(packed_gemv_stream_kernel<F, 1>)
                          : rounds == 2 ? stream_launch(packed_gemv_stream_kernel<F, 2>)
                          : rounds == 3 ? stream_launch(packed_gemv_stream_kernel<F, 3>)
                                        : stream_launch(packed_gemv_stream_kernel<F, 4>);
    if (streamed) return;
  }
  launch(std::integral_constant<int, kWarp>{});
}

}  // namespace

void CudaBackend::linear_packed(const Tensor& x, const Weight& w, Tensor& y) {
  constexpr const char* kOp = "linear";
  const auto out = w.rows(), in = w.cols();
  if (!check(w.shape.size() == 2, kOp, "a packed weight must be a 2-D matrix")) return;
  if (auto st = w.check_storage(); !st.ok()) return fail(st.with_context("cuda: linear"));
  if (!packed::decodable(w))
    return fail(unsupported_format("cuda: linear", w,
                                   "F32/BF16, FP8, FP4 E2M1 in rows of whole 32-blocks and "
                                   "Q8_0/Q2_K/Q4_K/Q5_K/Q6_K/IQ2_XXS weights"));
  const std::uint8_t* codebook = nullptr;
  if (w.storage() == quant::QuantType::kIQ2_XXS && (codebook = iq2_grid()) == nullptr) return;
  const auto side = packed::side_data(w, codebook);
  if (!check(&x != &y, kOp, "y may not be x")) return;
  Shape shape = x.shape();
  shape.back() = out;
  if (!ensure(y, shape)) return;
  const auto S = x.rows();
  if (S == 0 || out == 0) return;
  if (in == 0) {
    memory_->zero(y.raw(), y.bytes());
    return;
  }
  // x rows of 32-float runs are read as float4: 16-byte aligned (pooled tensors are).
  if (!check(reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0, kOp,
             "x must be 16-byte aligned for a packed weight"))
    return;
  if (walking()) return;
  if (S <= kPackedGemvRows) {
    packed::with_format(w, [&](auto f) {
      using F = decltype(f);
      with_count<kPackedGemvRows>(S, [&](auto tokens) {
        launch_packed_gemv<F, decltype(tokens)::value>(x.data(), w, side, y.data(), stream());
      });
    });
    launched(kOp);
    return;
  }
  // A prefill: the tiles of cuda_grouped_packed.cu on the tensor cores.
  if (!env_flag("FLASHSERVE_CUDA_PREFILL_SGEMM") && packed_products_take(w, x.data()) &&
      dense_rows_fit(S)) {
    prefill_product(S, in, out, [&](DenseSplit split, float* partials) {
      return dense_product_packed(x.data(), S, w, codebook, y.data(), stream(), split, partials);
    });
    return;
  }
  const auto tile = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kTileBytes / (static_cast<std::size_t>(in) * sizeof(float))), 1,
      out);
  Tensor& widened = scratch(widened_);
  if (!ensure(widened, {tile, in})) return;
  const auto row_bytes = static_cast<std::int64_t>(w.row_bytes());
  for (std::int64_t r0 = 0; r0 < out && !failed(); r0 += tile) {
    const auto n = std::min(tile, out - r0);
    packed::with_format(w, [&](auto f) {
      using F = decltype(f);
      packed_dequantize_kernel<F>
          <<<std::min<unsigned>(grid_for(n * F::chunks(in), 256), 8192), 256, 0, stream()>>>(
              w.data, row_bytes, side.base, side.row_bytes, r0, n, in, widened.data());
    });
    if (!launched(kOp)) return;
    sgemm(x.data(), S, in, widened.data(), n, y.data() + r0, out);
  }
}

}  // namespace fs::cuda
