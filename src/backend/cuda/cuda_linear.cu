// Dense products: GEMV kernels for few rows, cuBLAS sgemm for many; the grouped routed-expert op.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace fs::cuda {
namespace {

constexpr int kGemvRows = 8;       // x rows up to which linear takes the GEMV path
constexpr int kGemvThreads = 256;  // 8 warps, one output row each
constexpr std::size_t kWidenBytes = std::size_t{64} << 20;

// 16 bytes of weights widened to f32.
template <typename T>
struct Chunk;
template <>
struct Chunk<float> {
  static constexpr int kN = 4;
  __device__ __forceinline__ static void load(const float* p, float (&f)[kN]) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
};
template <>
struct Chunk<bf16_bits> {
  static constexpr int kN = 8;
  __device__ __forceinline__ static void load(const bf16_bits* p, float (&f)[kN]) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};

// acc[s] += this lane's share of row · x[s] (x rows `x_stride` floats apart); not yet reduced
// over the warp. kVec: row and x are 16-byte aligned and `in` is a multiple of the chunk.
template <typename T, int kS, bool kVec>
__device__ __forceinline__ void lane_dot(const T* row, const float* x, std::int64_t x_stride,
                                         std::int64_t in, float (&acc)[kS]) {
  const int lane = threadIdx.x % kWarp;
  if constexpr (kVec) {
    constexpr int kN = Chunk<T>::kN;
#pragma unroll 2
    for (std::int64_t k = lane * kN; k < in; k += kWarp * kN) {
      float w[kN];
      Chunk<T>::load(row + k, w);
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const float* xs = x + s * x_stride + k;
#pragma unroll
        for (int q = 0; q < kN; q += 4) {
          const float4 xv = *reinterpret_cast<const float4*>(xs + q);
          acc[s] += w[q] * xv.x;
          acc[s] += w[q + 1] * xv.y;
          acc[s] += w[q + 2] * xv.z;
          acc[s] += w[q + 3] * xv.w;
        }
      }
    }
  } else {
    for (std::int64_t k = lane; k < in; k += kWarp) {
      const float w = widen(row[k]);
#pragma unroll
      for (int s = 0; s < kS; ++s) acc[s] += w * x[s * x_stride + k];
    }
  }
}

// y[s, r] = W[r] · x[s] for s < kS; a warp per output row r.
template <typename T, int kS, bool kVec>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(const float* x, const T* w, float* y, std::int64_t in, std::int64_t out) {
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (r >= out) return;
  float acc[kS] = {};
  lane_dot<T, kS, kVec>(w + r * in, x, in, in, acc);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float v = warp_sum(acc[s]);
    if (threadIdx.x % kWarp == 0) y[s * out + r] = v;
  }
}

template <typename T, bool kVec>
void launch_gemv(std::int64_t S, const float* x, const T* w, float* y, std::int64_t in,
                 std::int64_t out, cudaStream_t stream) {
  const unsigned grid = grid_for(out * kWarp, kGemvThreads);
#define FS_GEMV_CASE(n)                                                           \
  case n:                                                                         \
    gemv_kernel<T, n, kVec><<<grid, kGemvThreads, 0, stream>>>(x, w, y, in, out); \
    break;
  switch (S) {
    FS_GEMV_CASE(1)
    FS_GEMV_CASE(2)
    FS_GEMV_CASE(3)
    FS_GEMV_CASE(4)
    FS_GEMV_CASE(5)
    FS_GEMV_CASE(6)
    FS_GEMV_CASE(7)
    FS_GEMV_CASE(8)
    default:
      break;
  }
#undef FS_GEMV_CASE
}

template <typename T>
bool vec_ok(const void* a, const void* b, std::int64_t in) {
  return in % Chunk<T>::kN == 0 && reinterpret_cast<std::uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(b) % 16 == 0;
}

template <typename T>
void gemv(std::int64_t S, const float* x, const T* w, float* y, std::int64_t in, std::int64_t out,
          cudaStream_t stream) {
  if (vec_ok<T>(x, w, in)) {
    launch_gemv<T, true>(S, x, w, y, in, out, stream);
  } else {
    launch_gemv<T, false>(S, x, w, y, in, out, stream);
  }
}

__global__ void widen_kernel(const bf16_bits* src, float* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = widen(src[i]);
}

__global__ void add_bias_kernel(float* y, const float* bias, std::int64_t n, std::int64_t cols) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += bias[i % cols];
}

// act[p, r] = silu(gate_up[e] row r · x[s]) * (gate_up[e] row I + r · x[s]), p = (s, j),
// e = experts[p]; a warp per r. Pairs run along grid.x, row tiles along grid.y.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kGemvThreads)
    moe_gate_up_kernel(const float* x, const T* gate_up, const std::int32_t* experts,
                       std::int64_t k, std::int64_t E, std::int64_t H, std::int64_t I, float* act) {
  const std::int64_t p = blockIdx.x;
  const std::int64_t r = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (r >= I) return;
  const std::int64_t e = experts[p];
  float* o = act + p * I + r;
  if (e < 0 || e >= E) {
    if (threadIdx.x % kWarp == 0) *o = 0.0f;
    return;
  }
  const T* w = gate_up + e * (2 * I * H);
  const float* xs = x + (p / k) * H;
  float g[1] = {}, u[1] = {};
  lane_dot<T, 1, kVec>(w + r * H, xs, H, H, g);
  lane_dot<T, 1, kVec>(w + (I + r) * H, xs, H, H, u);
  const float gv = warp_sum(g[0]), uv = warp_sum(u[0]);
  if (threadIdx.x % kWarp == 0) *o = apply_act(gv, Activation::kSilu) * uv;
}

// out[p, c] = down[e] row c · act[p]; a warp per c.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kGemvThreads)
    moe_down_kernel(const float* act, const T* down, const std::int32_t* experts, std::int64_t E,
                    std::int64_t H, std::int64_t I, float* out) {
  const std::int64_t p = blockIdx.x;
  const std::int64_t c = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (c >= H) return;
  const std::int64_t e = experts[p];
  float* o = out + p * H + c;
  if (e < 0 || e >= E) {
    if (threadIdx.x % kWarp == 0) *o = 0.0f;
    return;
  }
  float acc[1] = {};
  lane_dot<T, 1, kVec>(down + e * (H * I) + c * I, act + p * I, I, I, acc);
  const float v = warp_sum(acc[0]);
  if (threadIdx.x % kWarp == 0) *o = v;
}

constexpr int kMaxTopK = 64;

// y[s, c] = sum of weights[s, j] * out[s*k + j, c] over the token's valid pairs, added in the
// CPU reference's order (its per-expert loop: expert id ascending, then j), without fused
// multiply-adds. A block per (token, 256 columns).
__global__ void moe_combine_kernel(const float* out, const float* weights,
                                   const std::int32_t* experts, std::int64_t E, std::int64_t k,
                                   std::int64_t H, float* y) {
  __shared__ int order[kMaxTopK];
  __shared__ int count;
  const std::int64_t s = blockIdx.x;
  const std::int32_t* ids = experts + s * k;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < k; ++j) {
      const std::int32_t e = ids[j];
      if (e < 0 || e >= E) continue;
      int at = n;
      for (; at > 0 && ids[order[at - 1]] > e; --at) order[at] = order[at - 1];
      order[at] = j;
      ++n;
    }
    count = n;
  }
  __syncthreads();
  const std::int64_t c = blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= H) return;
  float acc = 0.0f;
  for (int i = 0; i < count; ++i) {
    const std::int64_t p = s * k + order[i];
    acc = mul_add(weights[p], out[p * H + c], acc);
  }
  y[s * H + c] = acc;
}

template <typename T>
void launch_gate_up(const float* x, const T* w, const std::int32_t* experts, std::int64_t P,
                    std::int64_t k, std::int64_t E, std::int64_t H, std::int64_t I, float* act,
                    cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(P), grid_for(I * kWarp, kGemvThreads));
  if (vec_ok<T>(x, w, H)) {
    moe_gate_up_kernel<T, true><<<grid, kGemvThreads, 0, stream>>>(x, w, experts, k, E, H, I, act);
  } else {
    moe_gate_up_kernel<T, false><<<grid, kGemvThreads, 0, stream>>>(x, w, experts, k, E, H, I, act);
  }
}

template <typename T>
void launch_down(const float* act, const T* w, const std::int32_t* experts, std::int64_t P,
                 std::int64_t E, std::int64_t H, std::int64_t I, float* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(P), grid_for(H * kWarp, kGemvThreads));
  if (vec_ok<T>(act, w, I)) {
    moe_down_kernel<T, true><<<grid, kGemvThreads, 0, stream>>>(act, w, experts, E, H, I, out);
  } else {
    moe_down_kernel<T, false><<<grid, kGemvThreads, 0, stream>>>(act, w, experts, E, H, I, out);
  }
}

}  // namespace

bool CudaBackend::sgemm(const float* x, std::int64_t S, std::int64_t in, const float* w,
                        std::int64_t n, float* y, std::int64_t ldy) {
  // Row-major y[S, n] = x[S, in] · w[n, in]^T is column-major y^T[n, S] = w^T' · x^T', i.e.
  // C(n x S) = op(A) B with A = w seen column-major as [in, n] (transposed), B = x as [in, S].
  const float alpha = 1.0f, beta = 0.0f;
  return cublas_ok(
      cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(S),
                  static_cast<int>(in), &alpha, w, static_cast<int>(in), x, static_cast<int>(in),
                  &beta, y, static_cast<int>(ldy)),
      "linear");
}

void CudaBackend::linear(const Tensor& x, const Weight& w, Tensor& y) {
  constexpr const char* kOp = "linear";
  if (failed() || !on_device(kOp, w) || !on_device(kOp, {&x})) return;
  const auto out = w.rows(), in = w.cols();
  if (!check(x.cols() == in, kOp, "x columns differ from the weight's input width")) return;
  if (!check(w.dtype == DType::kF32 || w.dtype == DType::kBF16, kOp, "weight is not F32/BF16"))
    return;
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
  // bf16: widen tiles of rows (exact) into pooled f32 scratch, one sgemm per tile. The tiles
  // reuse one buffer; stream order keeps a tile from being overwritten before its product ran.
  const auto tile = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kWidenBytes / (static_cast<std::size_t>(in) * sizeof(float))), 1,
      out);
  if (!ensure(widened_, {tile, in})) return;
  const auto* wb = reinterpret_cast<const bf16_bits*>(w.data);
  for (std::int64_t r0 = 0; r0 < out && !failed(); r0 += tile) {
    const auto n = std::min(tile, out - r0);
    const auto count = n * in;
    widen_kernel<<<std::min<unsigned>(grid_for(count, 256), 8192), 256, 0, stream()>>>(
        wb + r0 * in, widened_.data(), count);
    if (!launched(kOp)) return;
    sgemm(x.data(), S, in, widened_.data(), n, y.data() + r0, out);
  }
}

void CudaBackend::add_bias(Tensor& y, const Weight& bias) {
  constexpr const char* kOp = "add_bias";
  if (failed() || !on_device(kOp, bias) || !on_device(kOp, {&y})) return;
  if (!check(bias.dtype == DType::kF32 && bias.numel() == y.cols(), kOp,
             "bias must be F32 with one value per column"))
    return;
  const auto n = y.numel();
  if (n == 0) return;
  add_bias_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(y.data(), bias.f32(), n, y.cols());
  launched(kOp);
}

void CudaBackend::moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                              const Tensor& experts, const Tensor& weights, Tensor& y) {
  constexpr const char* kOp = "moe_experts";
  if (failed() || !on_device(kOp, gate_up) || !on_device(kOp, down) ||
      !on_device(kOp, {&x, &experts, &weights}))
    return;
  if (!check(gate_up.shape.size() == 3 && down.shape.size() == 3, kOp,
             "expert weights must be [E, out, in]"))
    return;
  const auto E = gate_up.shape[0], I = gate_up.shape[1] / 2, H = x.cols(), S = x.rows();
  if (!check(gate_up.shape[2] == H && down.shape[0] == E && down.shape[1] == H &&
                 down.shape[2] == I && gate_up.shape[1] == 2 * I,
             kOp, "gate_up [E, 2I, H] and down [E, H, I] do not match x [S, H]"))
    return;
  if (!check((gate_up.dtype == DType::kF32 || gate_up.dtype == DType::kBF16) &&
                 (down.dtype == DType::kF32 || down.dtype == DType::kBF16),
             kOp, "expert weights must be F32 or BF16"))
    return;
  const auto k = experts.cols();
  if (!check(experts.dtype() == DType::kI32 && experts.rows() == S &&
                 weights.dtype() == DType::kF32 && weights.rows() == S && weights.cols() == k,
             kOp, "experts must be int32 [S, k] and weights f32 [S, k]"))
    return;
  if (!check(k <= kMaxTopK, kOp, "more than 64 experts per token")) return;
  if (!ensure(y, {S, H})) return;
  if (S == 0 || H == 0) return;
  const auto P = S * k;
  if (P == 0 || I == 0) {
    memory_->zero(y.raw(), y.bytes());
    return;
  }
  if (!ensure(moe_act_, {P, I}) || !ensure(moe_out_, {P, H})) return;
  const auto* ids = experts.data_as<std::int32_t>();
  if (gate_up.dtype == DType::kBF16) {
    launch_gate_up(x.data(), reinterpret_cast<const bf16_bits*>(gate_up.data), ids, P, k, E, H, I,
                   moe_act_.data(), stream());
  } else {
    launch_gate_up(x.data(), reinterpret_cast<const float*>(gate_up.data), ids, P, k, E, H, I,
                   moe_act_.data(), stream());
  }
  if (!launched(kOp)) return;
  if (down.dtype == DType::kBF16) {
    launch_down(moe_act_.data(), reinterpret_cast<const bf16_bits*>(down.data), ids, P, E, H, I,
                moe_out_.data(), stream());
  } else {
    launch_down(moe_act_.data(), reinterpret_cast<const float*>(down.data), ids, P, E, H, I,
                moe_out_.data(), stream());
  }
  if (!launched(kOp)) return;
  moe_combine_kernel<<<dim3(static_cast<unsigned>(S), grid_for(H, 256)), 256, 0, stream()>>>(
      moe_out_.data(), weights.data(), ids, E, k, H, y.data());
  launched(kOp);
}

}  // namespace fs::cuda
