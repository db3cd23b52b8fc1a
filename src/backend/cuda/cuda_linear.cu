// Dense products: GEMV kernels for few rows (cuda_gemv.cuh); for many, bf16 and FP8 weights on
// the tensor cores (cuda_grouped_gemm.h), f32 weights through cuBLAS sgemm.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_epilogue.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_grouped_gemm.h"
#include "backend/cuda/cuda_switches.h"
#include "backend/cuda/cuda_weight_checks.cuh"

namespace fs::cuda {
namespace {

constexpr int kGemvRows = 8;  // x rows up to which linear takes the GEMV path
constexpr std::size_t kWidenBytes = std::size_t{64} << 20;

// y[s, r] = W[r] · x[s] for s < kS: a group of kG threads per kR consecutive output rows, so x
// is read once per chunk for kR rows and every W byte once for all kS rows. Block-scaled FP8
// weights also take their scale grid (`scales`, `grid_cols` per grid row; null otherwise).
// 8 chunks of W in flight per thread (12 at one row a thread measured slower in the decode step,
// bench/NOTES.md 2026-12-02), shared among its kR rows. The order of a row's sum does not depend
// on it.
template <int kR>
inline constexpr int kDefaultChunksInFlight = kR == 1 ? 8 : (kR == 2 ? 4 : 2);

// kStaged: x is read from shared memory (StagedX, cuda_gemv.cuh). Staged one-token GEMVs keep
// to 85 registers so that 3 blocks share a multiprocessor: the FP8 out-projection took 127 and
// ran 2 blocks an SM, 1.21 waves of its 320 blocks, the SMs idle 42% of the kernel (ncu, session
// 10). The verify's 2-4 tokens keep to 128 so that 2 do: the FP8 kernels of 3-4 tokens took
// 136-160 and ran one block (8 warps) an SM (ptxas -v, session 15).
template <int kS, bool kStaged>
inline constexpr int kGemvMinBlocks = kStaged&& kS == 1 ? 3 : (kS <= 4 ? 2 : 1);

// Where a GEMV's values go: y [S, out]; or, kStreams, the hyper-connection write of them into
// `streams` (Backend::linear_into_streams; StreamsOut, cuda_epilogue.cuh).
struct GemvOut {
  float* y = nullptr;
  StreamsOut streams;
};

template <typename T, bool kVec, int kS, int kR, int kG, int kU = kDefaultChunksInFlight<kR>,
          bool kStaged = false, bool kStreams = false>
__global__ void __launch_bounds__(kGemvThreads, (kGemvMinBlocks<kS, kStaged>))
    gemv_kernel(const float* x, const T* w, const float* scales, std::int64_t grid_cols,
                const GemvOut o, std::int64_t in, std::int64_t out) {
  const std::int64_t group =
      (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const std::int64_t r0 = group * kR;
  // kStreams at one token and one row a group: lane 0 reads its row's h values and the gates
  // before the wait (StreamsAhead).
  constexpr bool kAhead = kStreams && kS == 1 && kR == 1;
  [[maybe_unused]] StreamsAhead ahead;
  if constexpr (kAhead) {
    if (lane == 0 && r0 < out) ahead.read(o.streams, out, r0);
  }
  const T* rows[kR];
  const float* xs[kR];
  const float* scale_rows[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    rows[r] = r0 + r < out ? w + (r0 + r) * in : nullptr;
    xs[r] = x;
    scale_rows[r] = scales != nullptr ? scales + ((r0 + r) / kFp8Block) * grid_cols : nullptr;
  }
  float acc[kR][kS] = {};
  // Weights only before the wait (inside rows_dot); x after it.
  rows_dot<T, kVec, kS, kR, kG, kU, true, true, kStaged>(rows, xs, scale_rows, in,
                                                         in / WeightChunk<T, kVec>::kN, lane, acc);
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const float v = group_sum<kG>(acc[r][s]);
      if (lane != 0 || r0 + r >= out) continue;
      if constexpr (!kStreams)
        o.y[s * out + r0 + r] = v;
      else if constexpr (kAhead)
        ahead.write(o.streams, out, r0, v);
      else
        StreamsAhead::write_streams(o.streams, out, s, r0 + r, v);
    }
}

// The scale grid of a GEMV's weight (block-scaled FP8 only).
struct GemvScales {
  const float* data = nullptr;
  std::int64_t grid_cols = 0;
};

// kLargeX: x may be staged beyond the default 48 KB (kMaxStagedXOptInBytes); where the attribute
// cannot be set the launch reads x unstaged, the same sums.
template <typename T, bool kVec, int kS, int kR, int kG, int kU = kDefaultChunksInFlight<kR>,
          bool kLargeX = false, bool kStreams = false>
void launch_gemv(const float* x, const T* w, GemvScales sc, const GemvOut& y, std::int64_t in,
                 std::int64_t out, cudaStream_t stream) {
  const auto groups = (out + kR - 1) / kR;
  auto kernel = gemv_kernel<T, kVec, kS, kR, kG, kU, false, kStreams>;
  std::size_t smem = 0;
  if constexpr (kStagesX<T, kVec, kG, kS>) {
    constexpr auto staged = gemv_kernel<T, kVec, kS, kR, kG, kU, true, kStreams>;
    smem = staged_x_launch_bytes<T, kVec, kG, kS>(
        in / WeightChunk<T, kVec>::kN, kLargeX ? kMaxStagedXOptInBytes : kMaxStagedXBytes);
    if (smem > kMaxStagedXBytes && !allow_dynamic_shared<staged, kMaxStagedXOptInBytes>()) smem = 0;
    if (smem) kernel = staged;
  }
  launch_overlapped(kernel, grid_for(groups * kG, kGemvThreads), kGemvThreads, smem, stream, x, w,
                    sc.data, sc.grid_cols, y, in, out);
}

// Lanes per row as gemv_short_rows says. Several tokens share each thread's W chunks over up to 4
// rows, unless that would leave the grid too small to fill the SMs (narrow outputs: the router, the
// GDN gates).
template <typename T, bool kVec, int kS, bool kStreams = false>
void gemv_rows(const float* x, const T* w, GemvScales sc, const GemvOut& y, std::int64_t in,
               std::int64_t out, cudaStream_t stream) {
  constexpr int kWide = kS == 1 ? 1 : (kS == 2 ? 2 : 4);
  const auto chunks = in / WeightChunk<T, kVec>::kN;
  const bool short_rows = gemv_short_rows(chunks);
  const bool many_rows = out >= kManyRows;
  // FP8 rows of the hidden width are 160 chunks, 5 a lane: one round of loads a warp, too few
  // bytes in flight (1.3 TB/s on the H200; 2560 -> 10240 took 21.1 us). Two rows a warp put all
  // 10 in flight at once (14.5 us, bench/NOTES.md session 9).
  if constexpr (kS == 1 && WeightChunk<T, kVec>::kDeferredScale) {
    if (!short_rows && many_rows && chunks <= 5 * kWarp) {
      launch_gemv<T, kVec, 1, 2, kWarp, 5, false, kStreams>(x, w, sc, y, in, out, stream);
      return;
    }
    // The out-projections' 384-chunk rows: all 12 chunks of a lane in one round.
    if (!short_rows && chunks > 8 * kWarp && chunks <= 12 * kWarp) {
      launch_gemv<T, kVec, 1, 1, kWarp, 12, false, kStreams>(x, w, sc, y, in, out, stream);
      return;
    }
  }
  // The same rows at the verify's 2-4 tokens: x staged (up to 96 KB, opt-in), two rows a warp so
  // that the grid is one wave at two blocks a multiprocessor (2560 rows: 160 blocks). Unstaged at
  // one row a warp they read x at the L1's pace, 8.8-23.8% of the copy bandwidth (cuda_kernel_bench
  // --fp8, session 15 call A: 15.3 / 32.4 / 41.7 us at 2 / 3 / 4 tokens against 6.9 at one).
  if constexpr (kS >= 2 && kS <= kMaxStagedTokens && WeightChunk<T, kVec>::kDeferredScale) {
    if (!short_rows && !many_rows && chunks > 8 * kWarp && chunks <= 12 * kWarp) {
      launch_gemv<T, kVec, kS, 2, kWarp, 6, true, kStreams>(x, w, sc, y, in, out, stream);
      return;
    }
  }
  if (short_rows) {
    if (many_rows)
      launch_gemv<T, kVec, kS, kWide, 8, kDefaultChunksInFlight<kWide>, false, kStreams>(
          x, w, sc, y, in, out, stream);
    else
      launch_gemv<T, kVec, kS, 1, 8, kDefaultChunksInFlight<1>, false, kStreams>(x, w, sc, y, in,
                                                                                 out, stream);
  } else {
    if (many_rows)
      launch_gemv<T, kVec, kS, kWide, kWarp, kDefaultChunksInFlight<kWide>, false, kStreams>(
          x, w, sc, y, in, out, stream);
    else
      launch_gemv<T, kVec, kS, 1, kWarp, kDefaultChunksInFlight<1>, false, kStreams>(
          x, w, sc, y, in, out, stream);
  }
}

template <typename T>
void gemv(std::int64_t S, const float* x, const T* w, float* y, std::int64_t in, std::int64_t out,
          cudaStream_t stream, GemvScales sc = {}) {
  const bool vec = vec_ok<T>(x, w, in);
  const GemvOut o{.y = y};
  with_count<kGemvRows>(S, [&](auto tokens) {
    constexpr int kS = decltype(tokens)::value;
    if (vec)
      gemv_rows<T, true, kS>(x, w, sc, o, in, out, stream);
    else
      gemv_rows<T, false, kS>(x, w, sc, o, in, out, stream);
  });
}

// The GEMV with the hyper-connection write (linear_into_streams): 1-4 tokens (decode and an MTP
// verify), 16-byte chunks (the caller checked vec_ok); the row sums are gemv's.
constexpr int kStreamsRows = 4;
template <typename T>
void gemv_into_streams(std::int64_t S, const float* x, const T* w, const GemvOut& o,
                       std::int64_t in, std::int64_t out, cudaStream_t stream, GemvScales sc = {}) {
  with_count<kStreamsRows>(S, [&](auto tokens) {
    gemv_rows<T, true, decltype(tokens)::value, true>(x, w, sc, o, in, out, stream);
  });
}

// Rows [r0, r0 + n) of a block-scaled FP8 matrix [*, in] dequantised to f32 (w = e4m3 * scale,
// the CPU's product), for the prefill sgemm.
__global__ void dequantize_fp8_kernel(const e4m3_bits* w, const float* scales,
                                      std::int64_t grid_cols, std::int64_t r0, std::int64_t n,
                                      std::int64_t in, float* dst) {
  const std::int64_t count = n * in;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = r0 + i / in, c = i % in;
    const float s = scales[(r / kFp8Block) * grid_cols + c / kFp8Block];
    dst[i] = Fp8Scale(s).apply(w[r * in + c]);
  }
}

__global__ void widen_kernel(const bf16_bits* src, float* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = widen(src[i]);
}

// Prefill's products on the tensor cores (cuda_grouped_gemm.h) where the widths allow;
// FLASHSERVE_CUDA_PREFILL_SGEMM=1 keeps the f32 tiles and cuBLAS sgemm (the form before).
bool tensor_core_prefill(GroupedWeights wt, std::int64_t S, std::int64_t in, const void* x,
                         const void* w) {
  return !env_flag("FLASHSERVE_CUDA_PREFILL_SGEMM") && dense_product_takes(wt, S, in, x, w);
}

__global__ void add_bias_kernel(float* y, const float* bias, std::int64_t n, std::int64_t cols) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += bias[i % cols];
}

}  // namespace

bool CudaBackend::sgemm(const float* x, std::int64_t S, std::int64_t in, const float* w,
                        std::int64_t n, float* y, std::int64_t ldy) {
  // Row-major y[S, n] = x[S, in] · w[n, in]^T is column-major y^T[n, S] = w^T' · x^T', i.e.
  // C(n x S) = op(A) B with A = w seen column-major as [in, n] (transposed), B = x as [in, S].
  const float alpha = 1.0f, beta = 0.0f;
  return cublas_ok(
      blas_->sgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(S),
                   static_cast<int>(in), &alpha, w, static_cast<int>(in), x, static_cast<int>(in),
                   &beta, y, static_cast<int>(ldy)),
      "linear");
}

void CudaBackend::linear(const Tensor& x, const Weight& w, Tensor& y) {
  constexpr const char* kOp = "linear";
  if (failed() || !on_device(kOp, w, /*packed_ok=*/true) || !on_device(kOp, {&x})) return;
  const auto out = w.rows(), in = w.cols();
  if (!check(x.cols() == in, kOp, "x columns differ from the weight's input width")) return;
  if (w.is_packed()) return linear_packed(x, w, y);
  if (w.block_scaled()) return linear_fp8(x, w, y);
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16)
    return fail(unsupported_format("cuda: linear", w, "F32/BF16, FP8 and packed weights"));
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
  if (walking()) return;
  if (S <= kGemvRows) {
    if (w.dtype == DType::kF32) {
      gemv(S, x.data(), reinterpret_cast<const float*>(w.data), y.data(), in, out, stream());
    } else {
      gemv(S, x.data(), reinterpret_cast<const bf16_bits*>(w.data), y.data(), in, out, stream());
    }
    launched(kOp);
    return;
  }
  if (w.dtype == DType::kF32) {
    sgemm(x.data(), S, in, reinterpret_cast<const float*>(w.data), out, y.data(), out);
    return;
  }
  if (tensor_core_prefill(GroupedWeights::kBf16, S, in, x.data(), w.data)) {
    prefill_product(S, in, out, [&](DenseSplit split, float* partials) {
      return dense_product(x.data(), S, w.data, nullptr, GroupedWeights::kBf16, in, out, y.data(),
                           stream(), split, partials);
    });
    return;
  }
  // bf16 (FLASHSERVE_CUDA_PREFILL_SGEMM=1, or widths off 16 bytes): widen tiles of rows (exact)
  // into pooled f32 scratch, one sgemm per tile. The tiles reuse one buffer; stream order keeps a
  // tile from being overwritten before its product ran.
  const auto tile = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kWidenBytes / (static_cast<std::size_t>(in) * sizeof(float))), 1,
      out);
  Tensor& widened = scratch(widened_);
  if (!ensure(widened, {tile, in})) return;
  const auto* wb = reinterpret_cast<const bf16_bits*>(w.data);
  for (std::int64_t r0 = 0; r0 < out && !failed(); r0 += tile) {
    const auto n = std::min(tile, out - r0);
    const auto count = n * in;
    widen_kernel<<<std::min<unsigned>(grid_for(count, 256), 8192), 256, 0, stream()>>>(
        wb + r0 * in, widened.data(), count);
    if (!launched(kOp)) return;
    sgemm(x.data(), S, in, widened.data(), n, y.data() + r0, out);
  }
}

void CudaBackend::prefill_product(std::int64_t S, std::int64_t in, std::int64_t out,
                                  const DenseLaunch& launch) {
  const DenseSplit split = dense_product_split(S, in, out);
  float* partials = nullptr;
  if (split.splits > 1) {
    Tensor& p = scratch(split_k_);
    if (!ensure(p, {split.splits * S, out})) return;
    partials = p.data();
  }
  launched("linear", launch(split, partials));
}

// Block-scaled FP8 (weight.h): the GEMV reads the e4m3 bytes and the scales directly; more rows
// dequantise tiles of weight rows into the pooled f32 scratch (as bf16 widens them) for sgemm.
void CudaBackend::linear_fp8(const Tensor& x, const Weight& w, Tensor& y) {
  constexpr const char* kOp = "linear";
  const auto out = w.rows(), in = w.cols();
  // E8M0 scales became f32 at upload (upload_stored).
  if (w.dtype != DType::kF8E4M3 || w.shape.size() != 2 ||
      w.scales.format != quant::ScaleFormat::kF32 || w.scales.block_rows != kFp8Block ||
      w.scales.block_cols != kFp8Block)
    return fail(unsupported_format("cuda: linear", w,
                                   "2-D F8_E4M3 with 128x128 F32 scales as upload leaves them"));
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
  if (walking()) return;
  const GemvScales sc{reinterpret_cast<const float*>(w.scales.data), w.scales.grid_cols(in)};
  const auto* wq = reinterpret_cast<const e4m3_bits*>(w.data);
  if (S <= kGemvRows) {
    gemv(S, x.data(), wq, y.data(), in, out, stream(), sc);
    launched(kOp);
    return;
  }
  if (tensor_core_prefill(GroupedWeights::kFp8Scaled, S, in, x.data(), w.data)) {
    prefill_product(S, in, out, [&](DenseSplit split, float* partials) {
      return dense_product(x.data(), S, w.data, sc.data, GroupedWeights::kFp8Scaled, in, out,
                           y.data(), stream(), split, partials);
    });
    return;
  }
  const auto tile = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kWidenBytes / (static_cast<std::size_t>(in) * sizeof(float))), 1,
      out);
  Tensor& widened = scratch(widened_);
  if (!ensure(widened, {tile, in})) return;
  for (std::int64_t r0 = 0; r0 < out && !failed(); r0 += tile) {
    const auto n = std::min(tile, out - r0);
    dequantize_fp8_kernel<<<std::min<unsigned>(grid_for(n * in, 256), 8192), 256, 0, stream()>>>(
        wq, sc.data, sc.grid_cols, r0, n, in, widened.data());
    if (!launched(kOp)) return;
    sgemm(x.data(), S, in, widened.data(), n, y.data() + r0, out);
  }
}

// One kernel: the GEMV whose lane 0 of each row writes the row's value into the streams. Taken
// for 1-4 tokens of f32 activations with f32, bf16 or block-scaled FP8 rows in 16-byte chunks;
// everything else (and FLASHSERVE_CUDA_FUSED_HC_WRITE=0) runs linear then add_scaled_streams.
void CudaBackend::linear_into_streams(const Tensor& x, const Weight& w, const StreamsWrite& out) {
  constexpr const char* kOp = "linear_into_streams";
  if (failed()) return;
  const auto sequence = [&] { Backend::linear_into_streams(x, w, out); };
  const Tensor& h = out.h;
  const Tensor& inject = out.inject;
  const auto S = x.shape().empty() ? 0 : x.rows();
  const auto rows = w.shape.size() == 2 ? w.rows() : 0, in = w.shape.size() == 2 ? w.cols() : 0;
  const auto streams = inject.shape().size() == 2 ? inject.cols() : 0;
  const bool take = env_flag_default_on("FLASHSERVE_CUDA_FUSED_HC_WRITE") &&
                    w.device == Device::kCuda && w.data != nullptr && w.shape.size() == 2 &&
                    (matrix_dtype(w) || fp8_matrix(w)) && x.shape().size() == 2 &&
                    x.dtype() == DType::kF32 && x.device() == Device::kCuda && S >= 1 &&
                    S <= kStreamsRows && x.cols() == in && in > 0 && rows > 0 &&
                    chunked(w.dtype, x.data(), {&w}, in) && h.dtype() == DType::kF32 &&
                    h.device() == Device::kCuda && h.shape().size() == 2 && h.rows() == S &&
                    inject.dtype() == DType::kF32 && inject.device() == Device::kCuda &&
                    inject.shape().size() == 2 && inject.rows() == S && streams >= 1 &&
                    h.cols() == streams * rows && h.raw() != x.raw() && inject.raw() != h.raw();
  if (!take) return sequence();
  if (walking()) return;
  const GemvOut o{.streams = {.h = out.h.data(), .inject = inject.data(), .streams = streams}};
  if (w.dtype == DType::kF8E4M3) {
    const GemvScales sc{reinterpret_cast<const float*>(w.scales.data), w.scales.grid_cols(in)};
    gemv_into_streams(S, x.data(), reinterpret_cast<const e4m3_bits*>(w.data), o, in, rows,
                      stream(), sc);
  } else if (w.dtype == DType::kBF16) {
    gemv_into_streams(S, x.data(), reinterpret_cast<const bf16_bits*>(w.data), o, in, rows,
                      stream());
  } else {
    gemv_into_streams(S, x.data(), reinterpret_cast<const float*>(w.data), o, in, rows, stream());
  }
  launched(kOp);
}

void CudaBackend::add_bias(Tensor& y, const Weight& bias) {
  constexpr const char* kOp = "add_bias";
  if (failed() || !on_device(kOp, bias) || !on_device(kOp, {&y})) return;
  if (!check(bias.dtype == DType::kF32 && bias.numel() == y.cols(), kOp,
             "bias must be F32 with one value per column"))
    return;
  const auto n = y.numel();
  if (n == 0) return;
  if (walking()) return;
  add_bias_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(y.data(), bias.f32(), n, y.cols());
  launched(kOp);
}

}  // namespace fs::cuda
