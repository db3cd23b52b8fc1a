// Norms, elementwise ops, layout moves, hyper-connection stream ops and RoPE (and the per-head
// norm and RoPE of QSA's queries and keys in one kernel, head_norm_rope).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

constexpr int kThreads = 256;

// Threads for a block that reduces `n` values: a multiple of the warp, at most 256.
int reduce_threads(std::int64_t n) {
  return static_cast<int>(std::clamp<std::int64_t>((n + kWarp - 1) / kWarp * kWarp, kWarp, 256));
}

template <typename F>
__global__ void map_kernel(std::int64_t n, F f) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

// --- functors (one per op; device lambdas would need --extended-lambda) ---
struct ActivateOp {
  float* x;
  Activation act;
  __device__ void operator()(std::int64_t i) const { x[i] = apply_act(x[i], act); }
};
struct ScaleOp {
  float* x;
  float s;
  __device__ void operator()(std::int64_t i) const { x[i] *= s; }
};
struct AddOp {
  float* x;
  const float* y;
  __device__ void operator()(std::int64_t i) const { x[i] += y[i]; }
};
struct MulOp {
  float* x;
  const float* y;
  __device__ void operator()(std::int64_t i) const { x[i] *= y[i]; }
};
// activate then mul: act(g) rounded as ActivateOp stores it, then the product as MulOp's.
struct MulActivatedOp {
  float* x;
  const float* g;
  Activation act;
  __device__ void operator()(std::int64_t i) const {
    const float a = apply_act(g[i], act);
    x[i] = __fmul_rn(x[i], a);
  }
};
struct MulColsOp {
  float* x;
  const float* v;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i) const { x[i] *= v[i % cols]; }
};
struct MulRowsOp {
  float* x;
  const float* s;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i) const { x[i] *= s[i / cols]; }
};
struct SwigluOp {
  const float* gate;
  const float* up;
  float* out;
  __device__ void operator()(std::int64_t i) const {
    out[i] = apply_act(gate[i], Activation::kSilu) * up[i];
  }
};
struct SwigluPackedOp {
  const float* gu;
  float* out;
  std::int64_t half;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = i / half, c = i % half;
    const float* row = gu + r * 2 * half;
    out[i] = apply_act(row[c], Activation::kSilu) * row[half + c];
  }
};
struct SignedSqrtOp {
  float* x;
  float floor;
  __device__ void operator()(std::int64_t i) const {
    const float v = x[i];
    const float s = v > 0 ? 1.0f : (v < 0 ? -1.0f : 0.0f);
    x[i] = s * sqrtf(fmaxf(fabsf(v), floor));
  }
};
struct ClampOp {
  float* x;
  float lo, hi;
  __device__ void operator()(std::int64_t i) const { x[i] = fminf(fmaxf(x[i], lo), hi); }
};
struct SliceColsOp {
  const float* x;
  float* out;
  std::int64_t cols, begin, width;
  __device__ void operator()(std::int64_t i) const {
    out[i] = x[(i / width) * cols + begin + i % width];
  }
};
struct SplitOp {
  const float* x;
  float* a;
  float* b;
  std::int64_t heads, dim;
  __device__ void operator()(std::int64_t i) const {
    // i indexes a/b: row r, head h, column d.
    const std::int64_t width = heads * dim, r = i / width, h = (i % width) / dim, d = i % dim;
    const float* src = x + r * 2 * width + 2 * h * dim + d;
    a[i] = src[0];
    b[i] = src[dim];
  }
};
struct RepeatColsOp {
  const float* x;
  float* out;
  std::int64_t cols, times;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t wide = cols * times;
    out[i] = x[(i / wide) * cols + (i % wide) % cols];
  }
};
struct StreamMeanOp {
  const float* x;
  float* out;
  std::int64_t W, streams;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = i / W, c = i % W;
    const float* row = x + r * W * streams;
    float s = 0;
    for (std::int64_t k = 0; k < streams; ++k) s += row[k * W + c];
    out[i] = s / static_cast<float>(streams);
  }
};
struct AddScaledStreamsOp {
  float* h;
  const float* y;
  const float* w;
  std::int64_t W, streams;
  __device__ void operator()(std::int64_t i) const {
    // i indexes h [rows, streams * W].
    const std::int64_t wide = W * streams, r = i / wide, s = (i % wide) / W, c = i % W;
    h[i] = mul_add(w[r * streams + s], y[r * W + c], h[i]);
  }
};

template <typename F>
void launch_map(std::int64_t n, F f, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = std::min<unsigned>(grid_for(n, kThreads), 65536u);
  launch_overlapped(map_kernel<F>, grid, kThreads, 0, stream, n, f);
}

// RMSNorm of one (row, group) per block; also the gated form (gate != nullptr).
__global__ void rms_norm_kernel(const float* x, const float* w, std::int64_t wn, std::int64_t group,
                                std::int64_t cols, float eps, bool unit_offset, const float* gate,
                                Activation act, float* y) {
  __shared__ double red[32];
  const std::int64_t groups = cols / group;
  const std::int64_t base = (blockIdx.x / groups) * cols + (blockIdx.x % groups) * group;
  const std::int64_t col0 = (blockIdx.x % groups) * group;
  const float* in = x + base;
  // Decode's groups (a GDN head's 128, the hidden 2560) fit kPer values a thread: w is loaded
  // before the wait (no kernel writes it) and x and the gate together after it, so the reduction
  // is the only round trip left between them and the store (w and the gate used to be loaded
  // after it). The sum is the same: each thread adds its columns in the same order.
  constexpr int kPer = 16;
  if (group <= kPer * static_cast<std::int64_t>(blockDim.x)) {
    float wv[kPer], xv[kPer], gv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * blockDim.x;
      wv[j] = c < group ? w[(col0 + c) % wn] : 0.0f;
    }
    wait_for_inputs();  // when launched overlapped (cuda_common.h)
    release_dependents();
    double ss = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * blockDim.x;
      xv[j] = c < group ? in[c] : 0.0f;
      gv[j] = c < group && gate != nullptr ? gate[base + c] : 0.0f;
      ss += static_cast<double>(xv[j]) * xv[j];
    }
    ss = block_sum(ss, red);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(group) + eps));
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const std::int64_t c = threadIdx.x + static_cast<std::int64_t>(j) * blockDim.x;
      if (c >= group) break;
      float v = xv[j] * inv * (unit_offset ? 1.0f + wv[j] : wv[j]);
      if (gate != nullptr) v *= apply_act(gv[j], act);
      y[base + c] = v;
    }
    return;
  }
  wait_for_inputs();
  release_dependents();
  double ss = 0;
  for (std::int64_t c = threadIdx.x; c < group; c += blockDim.x)
    ss += static_cast<double>(in[c]) * in[c];
  ss = block_sum(ss, red);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(group) + eps));
  for (std::int64_t c = threadIdx.x; c < group; c += blockDim.x) {
    const float wc = w[(col0 + c) % wn];
    float v = in[c] * inv * (unit_offset ? 1.0f + wc : wc);
    if (gate != nullptr) v *= apply_act(gate[base + c], act);
    y[base + c] = v;
  }
}

// LayerNorm of one (row, group) per block: mean and variance in double (two passes, as the CPU).
__global__ void layer_norm_kernel(const float* x, const float* w, const float* b,
                                  std::int64_t group, float eps, float* y) {
  __shared__ double red[32];
  const float* in = x + blockIdx.x * group;
  double sum = 0;
  for (std::int64_t c = threadIdx.x; c < group; c += blockDim.x) sum += in[c];
  const double mean = block_sum(sum, red) / static_cast<double>(group);
  double var = 0;
  for (std::int64_t c = threadIdx.x; c < group; c += blockDim.x)
    var += (in[c] - mean) * (in[c] - mean);
  var = block_sum(var, red);
  const double inv = 1.0 / sqrt(var / static_cast<double>(group) + eps);
  for (std::int64_t c = threadIdx.x; c < group; c += blockDim.x)
    y[blockIdx.x * group + c] = mul_add(static_cast<float>((in[c] - mean) * inv), w[c], b[c]);
}

__global__ void l2_norm_kernel(float* x, std::int64_t group, float eps) {
  __shared__ double red[32];
  float* p = x + blockIdx.x * group;
  double ss = 0;
  for (std::int64_t c = threadIdx.x; c < group; c += blockDim.x)
    ss += static_cast<double>(p[c]) * p[c];
  ss = block_sum(ss, red);
  const float inv = static_cast<float>(1.0 / sqrt(ss + eps));
  for (std::int64_t c = threadIdx.x; c < group; c += blockDim.x) p[c] *= inv;
}

// Each row divided by its fp32 sum taken in column order (the CPU's order); a block per row.
__global__ void normalize_rows_kernel(float* x, std::int64_t cols) {
  __shared__ float sum;
  float* p = x + blockIdx.x * cols;
  if (threadIdx.x == 0) {
    float s = 0;
    for (std::int64_t c = 0; c < cols; ++c) s += p[c];
    sum = s;
  }
  __syncthreads();
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) p[c] /= sum;
}

// out[r, g] = sum over group g of a*b, in double; a warp per (r, g).
__global__ void grouped_dot_kernel(const float* a, const float* b, std::int64_t n,
                                   std::int64_t group, float* out) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  const std::int64_t wi =
      (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (wi >= n) return;
  const float* pa = a + wi * group;
  const float* pb = b + wi * group;
  double s = 0;
  for (std::int64_t c = threadIdx.x % kWarp; c < group; c += kWarp)
    s += static_cast<double>(pa[c]) * pb[c];
  s = warp_sum(s);
  if (threadIdx.x % kWarp == 0) out[wi] = static_cast<float>(s);
}

constexpr std::int64_t kMaxRopeHalf = 256;

// inv_freq[i] = theta^(-2i/rotary_dim), rounded to fp32 on the host exactly as the CPU does
// (std::pow in double), passed by value.
struct RopeFreqs {
  float v[kMaxRopeHalf];
};

// One row per block: cos/sin of the row's position (the angle and its cos/sin in double, as the
// CPU), then every head rotated without fused multiply-adds.
__global__ void rope_kernel(float* x, std::int64_t cols, std::int64_t head_dim,
                            std::int64_t rotary_dim, StepScalar first, std::int64_t stride,
                            const RopeFreqs freqs) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  extern __shared__ float cs[];  // cos[half], sin[half]
  const std::int64_t half = rotary_dim / 2, heads = cols / head_dim;
  const std::int64_t pos = first.get() + static_cast<std::int64_t>(blockIdx.x) * stride;
  for (std::int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = static_cast<double>(pos) * freqs.v[i];
    double s, c;
    sincos(angle, &s, &c);
    cs[i] = static_cast<float>(c);
    cs[half + i] = static_cast<float>(s);
  }
  __syncthreads();
  float* row = x + static_cast<std::int64_t>(blockIdx.x) * cols;
  for (std::int64_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const std::int64_t h = j / half, i = j % half;
    float* p = row + h * head_dim;
    const float a = p[i], b = p[i + half], c = cs[i], s = cs[half + i];
    p[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    p[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

// dst + at bytes <- src: n elements of T (the rows append_rows adds to a cache).
template <typename T>
__global__ void append_kernel(const void* src, void* dst, StepScalar at, std::int64_t n) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  const T* s = static_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(static_cast<std::uint8_t*>(dst) + at.get());
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    d[i] = s[i];
}

// head_norm_rope: a block per (row, head) of a then of b, reduce_threads(head_dim) threads. The
// norm is rms_norm_kernel's (each thread's columns summed in the same order in double, the same
// block_sum, the same products), the rotation rope_kernel's (cos/sin of the row's position in
// double, no fused multiply-adds), the head kept in shared memory between them: the bits of the
// two kernels it replaces.
struct NormRopeSide {
  float* x = nullptr;  // [rows, heads * head_dim], in place
  const float* w = nullptr;
  std::int64_t wn = 0, heads = 0;
};

__global__ void head_norm_rope_kernel(NormRopeSide a, NormRopeSide b, std::int64_t head_dim,
                                      float eps, std::int64_t rotary_dim, StepScalar first,
                                      const RopeFreqs freqs) {
  __shared__ double red[32];
  extern __shared__ float head[];  // the normed head [head_dim], then cos[half], sin[half]
  const std::int64_t per_row = a.heads + b.heads;
  const std::int64_t row = blockIdx.x / per_row, k = blockIdx.x % per_row;
  const bool in_a = k < a.heads;
  const NormRopeSide& t = in_a ? a : b;
  const std::int64_t h = in_a ? k : k - a.heads, cols = t.heads * head_dim;
  float* p = t.x + row * cols + h * head_dim;
  float* cs = head + head_dim;
  const std::int64_t half = rotary_dim / 2;
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  const std::int64_t pos = first.get() + row;
  for (std::int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = static_cast<double>(pos) * freqs.v[i];
    double s, c;
    sincos(angle, &s, &c);
    cs[i] = static_cast<float>(c);
    cs[half + i] = static_cast<float>(s);
  }
  double ss = 0;
  for (std::int64_t c = threadIdx.x; c < head_dim; c += blockDim.x)
    ss += static_cast<double>(p[c]) * p[c];
  ss = block_sum(ss, red);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(head_dim) + eps));
  for (std::int64_t c = threadIdx.x; c < head_dim; c += blockDim.x)
    head[c] = p[c] * inv * (1.0f + t.w[(h * head_dim + c) % t.wn]);
  __syncthreads();
  for (std::int64_t c = threadIdx.x; c < head_dim; c += blockDim.x) {
    float v = head[c];
    if (c < half) {
      v = __fsub_rn(__fmul_rn(v, cs[c]), __fmul_rn(head[c + half], cs[half + c]));
    } else if (c < rotary_dim) {
      const std::int64_t i = c - half;
      v = __fadd_rn(__fmul_rn(v, cs[i]), __fmul_rn(head[i], cs[half + i]));
    }
    p[c] = v;
  }
}

}  // namespace

// --- normalisation -------------------------------------------------------------------------------

void CudaBackend::rms_norm(const Tensor& x, const Weight& w, std::int64_t group, float eps,
                           bool unit_offset, Tensor& y) {
  constexpr const char* kOp = "rms_norm";
  if (failed() || !on_device(kOp, w) || !on_device(kOp, {&x})) return;
  const auto cols = x.cols();
  if (!check(group > 0 && cols % group == 0 && w.dtype == DType::kF32 && w.numel() > 0 &&
                 cols % w.numel() == 0,
             kOp, "group must divide the row; w must be F32 spanning the row or one group"))
    return;
  if (&y != &x && !ensure(y, x.shape())) return;
  const auto blocks = x.rows() * (cols / group);
  if (blocks == 0) return;
  if (walking()) return;
  launch_overlapped(rms_norm_kernel, static_cast<unsigned>(blocks), reduce_threads(group), 0,
                    stream(), x.data(), w.f32(), w.numel(), group, cols, eps, unit_offset, nullptr,
                    Activation::kIdentity, y.data());
  launched(kOp);
}

void CudaBackend::rms_norm_gated(const Tensor& x, const Weight& w, const Tensor& gate, float eps,
                                 Activation act, Tensor& y) {
  constexpr const char* kOp = "rms_norm_gated";
  if (failed() || !on_device(kOp, w) || !on_device(kOp, {&x, &gate})) return;
  const auto cols = x.cols(), group = w.numel();
  if (!check(group > 0 && cols % group == 0 && w.dtype == DType::kF32 && gate.numel() == x.numel(),
             kOp, "w must be F32 and divide the row; gate must match x"))
    return;
  if (&y != &x && !ensure(y, x.shape())) return;
  const auto blocks = x.rows() * (cols / group);
  if (blocks == 0) return;
  if (walking()) return;
  launch_overlapped(rms_norm_kernel, static_cast<unsigned>(blocks), reduce_threads(group), 0,
                    stream(), x.data(), w.f32(), w.numel(), group, cols, eps, false, gate.data(),
                    act, y.data());
  launched(kOp);
}

void CudaBackend::layer_norm(const Tensor& x, const Weight& w, const Weight& b, float eps,
                             Tensor& y) {
  constexpr const char* kOp = "layer_norm";
  if (failed() || !on_device(kOp, w) || !on_device(kOp, b) || !on_device(kOp, {&x})) return;
  const auto group = w.numel();
  if (!check(group > 0 && x.cols() % group == 0 && b.numel() == group && w.dtype == DType::kF32 &&
                 b.dtype == DType::kF32,
             kOp, "w and b must be F32 [group], group dividing the row"))
    return;
  if (&y != &x && !ensure(y, x.shape())) return;
  const auto blocks = x.numel() / group;
  if (blocks == 0 || walking()) return;
  layer_norm_kernel<<<static_cast<unsigned>(blocks), reduce_threads(group), 0, stream()>>>(
      x.data(), w.f32(), b.f32(), group, eps, y.data());
  launched(kOp);
}

void CudaBackend::l2_norm(Tensor& x, std::int64_t group, float eps) {
  constexpr const char* kOp = "l2_norm";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(group > 0 && x.numel() % group == 0, kOp, "group must divide the tensor")) return;
  const auto blocks = x.numel() / group;
  if (blocks == 0) return;
  if (walking()) return;
  l2_norm_kernel<<<static_cast<unsigned>(blocks), reduce_threads(group), 0, stream()>>>(x.data(),
                                                                                        group, eps);
  launched(kOp);
}

// --- elementwise ---------------------------------------------------------------------------------

void CudaBackend::activate(Tensor& x, Activation act) {
  if (failed() || !on_device("activate", {&x})) return;
  if (walking()) return;
  launch_map(x.numel(), ActivateOp{x.data(), act}, stream());
  launched("activate");
}

void CudaBackend::scale(Tensor& x, float s) {
  if (failed() || !on_device("scale", {&x})) return;
  if (walking()) return;
  launch_map(x.numel(), ScaleOp{x.data(), s}, stream());
  launched("scale");
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  if (failed() || !on_device("add", {&x, &y})) return;
  if (!check(x.numel() == y.numel(), "add", "sizes differ")) return;
  if (walking()) return;
  launch_map(x.numel(), AddOp{x.data(), y.data()}, stream());
  launched("add");
}

void CudaBackend::mul(Tensor& x, const Tensor& y) {
  if (failed() || !on_device("mul", {&x, &y})) return;
  if (!check(x.numel() == y.numel(), "mul", "sizes differ")) return;
  if (walking()) return;
  launch_map(x.numel(), MulOp{x.data(), y.data()}, stream());
  launched("mul");
}

void CudaBackend::mul_activated(Tensor& x, Tensor& gate, Activation act) {
  constexpr const char* kOp = "mul_activated";
  if (failed() || !on_device(kOp, {&x, &gate})) return;
  if (!check(x.numel() == gate.numel(), kOp, "sizes differ")) return;
  if (walking()) return;
  launch_map(x.numel(), MulActivatedOp{x.data(), gate.data(), act}, stream());
  launched(kOp);
}

void CudaBackend::mul_cols(Tensor& x, const Weight& v) {
  if (failed() || !on_device("mul_cols", v) || !on_device("mul_cols", {&x})) return;
  if (!check(v.dtype == DType::kF32 && v.numel() == x.cols(), "mul_cols",
             "v must be F32 with one value per column"))
    return;
  if (walking()) return;
  launch_map(x.numel(), MulColsOp{x.data(), v.f32(), x.cols()}, stream());
  launched("mul_cols");
}

void CudaBackend::mul_rows(Tensor& x, const Tensor& s) {
  if (failed() || !on_device("mul_rows", {&x, &s})) return;
  if (!check(s.numel() == x.rows(), "mul_rows", "s must hold one value per row")) return;
  if (walking()) return;
  launch_map(x.numel(), MulRowsOp{x.data(), s.data(), x.cols()}, stream());
  launched("mul_rows");
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  if (failed() || !on_device("swiglu", {&gate, &up})) return;
  if (!check(gate.numel() == up.numel(), "swiglu", "sizes differ")) return;
  if (&out != &gate && &out != &up && !ensure(out, gate.shape())) return;
  if (walking()) return;
  launch_map(gate.numel(), SwigluOp{gate.data(), up.data(), out.data()}, stream());
  launched("swiglu");
}

void CudaBackend::swiglu_packed(const Tensor& gu, Tensor& out) {
  if (failed() || !on_device("swiglu_packed", {&gu})) return;
  if (!check(&out != &gu, "swiglu_packed", "out may not be gu")) return;
  const auto half = gu.cols() / 2;
  if (!ensure(out, {gu.rows(), half})) return;
  if (walking()) return;
  launch_map(gu.rows() * half, SwigluPackedOp{gu.data(), out.data(), half}, stream());
  launched("swiglu_packed");
}

void CudaBackend::signed_sqrt(Tensor& x, float floor) {
  if (failed() || !on_device("signed_sqrt", {&x})) return;
  if (walking()) return;
  launch_map(x.numel(), SignedSqrtOp{x.data(), floor}, stream());
  launched("signed_sqrt");
}

void CudaBackend::normalize_rows(Tensor& x) {
  if (failed() || !on_device("normalize_rows", {&x})) return;
  if (x.numel() == 0) return;
  if (walking()) return;
  normalize_rows_kernel<<<static_cast<unsigned>(x.rows()), reduce_threads(x.cols()), 0, stream()>>>(
      x.data(), x.cols());
  launched("normalize_rows");
}

void CudaBackend::clamp(Tensor& x, float lo, float hi) {
  if (failed() || !on_device("clamp", {&x})) return;
  if (walking()) return;
  launch_map(x.numel(), ClampOp{x.data(), lo, hi}, stream());
  launched("clamp");
}

// --- layout --------------------------------------------------------------------------------------

void CudaBackend::slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width, Tensor& out) {
  constexpr const char* kOp = "slice_cols";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(begin >= 0 && width >= 0 && begin + width <= x.cols() && &out != &x, kOp,
             "columns out of range (or out is x)"))
    return;
  if (!ensure(out, {x.rows(), width})) return;
  if (walking()) return;
  launch_map(x.rows() * width, SliceColsOp{x.data(), out.data(), x.cols(), begin, width}, stream());
  launched(kOp);
}

void CudaBackend::slice_rows(const Tensor& x, std::int64_t begin, std::int64_t count, Tensor& out) {
  constexpr const char* kOp = "slice_rows";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(begin >= 0 && count >= 0 && begin + count <= x.rows() && &out != &x, kOp,
             "rows out of range (or out is x)"))
    return;
  if (!ensure(out, {count, x.cols()})) return;
  memory_->copy(out.raw(), x.data() + begin * x.cols(), out.bytes());
}

void CudaBackend::split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim,
                                    Tensor& a, Tensor& b) {
  constexpr const char* kOp = "split_interleaved";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(x.cols() == 2 * heads * dim, kOp, "x is not [rows, heads * 2 * dim]")) return;
  if (!ensure(a, {x.rows(), heads * dim}) || !ensure(b, {x.rows(), heads * dim})) return;
  if (walking()) return;
  launch_map(x.rows() * heads * dim, SplitOp{x.data(), a.data(), b.data(), heads, dim}, stream());
  launched(kOp);
}

void CudaBackend::repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) {
  constexpr const char* kOp = "repeat_cols";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(&out != &x, kOp, "out may not be x")) return;
  if (!ensure(out, {x.rows(), x.cols() * times})) return;
  if (walking()) return;
  launch_map(out.numel(), RepeatColsOp{x.data(), out.data(), x.cols(), times}, stream());
  launched(kOp);
}

void CudaBackend::append_rows(Tensor& cache, const Tensor& x) {
  constexpr const char* kOp = "append_rows";
  if (failed() || !on_device(kOp, {&x})) return;
  // An empty cache (or one in another memory) takes x's width.
  if (cache.shape().empty() || cache.dim(0) == 0 || cache.device() != Device::kCuda) {
    if (!ensure(cache, {0, x.cols()}, x.dtype())) return;
  }
  if (!check(cache.cols() == x.cols() && cache.dtype() == x.dtype(), kOp,
             "x's columns or dtype differ from the cache's"))
    return;
  const auto old_bytes = cache.bytes();
  if (!cache.grow_rows(cache.dim(0) + x.rows())) {
    fail(out_of_range("cuda backend: out of memory growing a cache to " +
                      std::to_string(cache.dim(0) + x.rows()) + " rows"));
    return;
  }
  // The new rows are unspecified until this stream-ordered copy fills them. A kernel, not a copy
  // node: inside a step graph the row it writes at is a per-step scalar.
  const StepScalar at = step_scalar(static_cast<std::int64_t>(old_bytes));
  if (x.bytes() == 0 || walking()) return;
  const auto words = static_cast<std::int64_t>(x.bytes() / sizeof(std::uint32_t));
  if (x.bytes() % sizeof(std::uint32_t) == 0 && old_bytes % sizeof(std::uint32_t) == 0) {
    launch_overlapped(append_kernel<std::uint32_t>,
                      std::min<unsigned>(grid_for(words, kThreads), 4096), kThreads, 0, stream(),
                      x.raw(), cache.raw(), at, words);
  } else {
    const auto bytes = static_cast<std::int64_t>(x.bytes());
    launch_overlapped(append_kernel<std::uint8_t>,
                      std::min<unsigned>(grid_for(bytes, kThreads), 4096), kThreads, 0, stream(),
                      x.raw(), cache.raw(), at, bytes);
  }
  launched(kOp);
}

// --- hyper-connections ---------------------------------------------------------------------------

void CudaBackend::stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) {
  constexpr const char* kOp = "stream_mean";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(streams > 0 && x.cols() % streams == 0 && &out != &x, kOp,
             "streams must divide the row (and out may not be x)"))
    return;
  const auto W = x.cols() / streams;
  if (!ensure(out, {x.rows(), W})) return;
  if (walking()) return;
  launch_map(x.rows() * W, StreamMeanOp{x.data(), out.data(), W, streams}, stream());
  launched(kOp);
}

void CudaBackend::add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) {
  constexpr const char* kOp = "add_scaled_streams";
  if (failed() || !on_device(kOp, {&h, &y, &w})) return;
  const auto W = y.cols(), streams = w.cols();
  if (!check(h.cols() == W * streams && h.rows() == y.rows() && w.rows() == h.rows(), kOp,
             "h [rows, streams*W], y [rows, W] and w [rows, streams] disagree"))
    return;
  if (walking()) return;
  launch_map(h.numel(), AddScaledStreamsOp{h.data(), y.data(), w.data(), W, streams}, stream());
  launched(kOp);
}

void CudaBackend::grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) {
  constexpr const char* kOp = "grouped_dot";
  if (failed() || !on_device(kOp, {&a, &b})) return;
  if (!check(group > 0 && a.cols() % group == 0 && a.numel() == b.numel(), kOp,
             "group must divide the row; a and b must match"))
    return;
  const auto groups = a.cols() / group;
  if (!ensure(out, {a.rows(), groups})) return;
  const auto n = a.rows() * groups;
  if (n == 0) return;
  if (walking()) return;
  launch_overlapped(grouped_dot_kernel, grid_for(n * kWarp, kThreads), kThreads, 0, stream(),
                    a.data(), b.data(), n, group, out.data());
  launched(kOp);
}

// --- positional ----------------------------------------------------------------------------------

void CudaBackend::rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim,
                       std::int64_t first, std::int64_t stride, double theta) {
  constexpr const char* kOp = "rope";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(head_dim > 0 && x.cols() % head_dim == 0 && rotary_dim % 2 == 0 &&
                 rotary_dim <= head_dim && rotary_dim >= 0,
             kOp, "head_dim must divide the row and hold an even rotary_dim"))
    return;
  if (!check(rotary_dim / 2 <= kMaxRopeHalf, kOp, "rotary_dim above 512")) return;
  if (x.rows() == 0 || rotary_dim == 0) return;
  const StepScalar at = step_scalar(first);
  if (walking()) return;
  RopeFreqs freqs{};
  for (std::int64_t i = 0; i < rotary_dim / 2; ++i)
    freqs.v[i] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rotary_dim)));
  const auto smem = static_cast<std::size_t>(rotary_dim) * sizeof(float);
  launch_overlapped(rope_kernel, static_cast<unsigned>(x.rows()), 128, smem, stream(), x.data(),
                    x.cols(), head_dim, rotary_dim, at, stride, freqs);
  launched(kOp);
}

void CudaBackend::head_norm_rope(Tensor& a, const Weight& wa, Tensor* b, const Weight& wb,
                                 std::int64_t head_dim, float eps, std::int64_t rotary_dim,
                                 std::int64_t first, double theta) {
  constexpr const char* kOp = "head_norm_rope";
  // One head a block, kept in shared memory; otherwise (heads over 4,096, rotary widths rope
  // refuses, a weight that is not f32 spanning a head or the row) the two ops it fuses.
  const auto fits = [&](const Tensor& t, const Weight& w) {
    return !t.shape().empty() && head_dim > 0 && t.cols() % head_dim == 0 &&
           w.dtype == DType::kF32 && !w.block_scaled() && w.numel() > 0 &&
           t.cols() % w.numel() == 0;
  };
  const bool fused = !env_flag("FLASHSERVE_CUDA_QSA_UNFUSED") && head_dim <= 4096 &&
                     rotary_dim % 2 == 0 && rotary_dim >= 0 && rotary_dim <= head_dim &&
                     rotary_dim / 2 <= kMaxRopeHalf && fits(a, wa) &&
                     (b == nullptr || (fits(*b, wb) && b->rows() == a.rows() && b != &a));
  if (!fused) {
    Backend::head_norm_rope(a, wa, b, wb, head_dim, eps, rotary_dim, first, theta);
    return;
  }
  if (failed() || !on_device(kOp, {&a}) || !on_device(kOp, wa)) return;
  if (b != nullptr && (!on_device(kOp, {b}) || !on_device(kOp, wb))) return;
  NormRopeSide sa{a.data(), wa.f32(), wa.numel(), a.cols() / head_dim}, sb;
  if (b != nullptr) sb = NormRopeSide{b->data(), wb.f32(), wb.numel(), b->cols() / head_dim};
  const auto blocks = a.rows() * (sa.heads + sb.heads);
  if (blocks == 0) return;
  const StepScalar at = step_scalar(first);
  if (walking()) return;
  RopeFreqs freqs{};
  for (std::int64_t i = 0; i < rotary_dim / 2; ++i)
    freqs.v[i] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rotary_dim)));
  const auto smem = static_cast<std::size_t>(head_dim + rotary_dim) * sizeof(float);
  launch_overlapped(head_norm_rope_kernel, static_cast<unsigned>(blocks), reduce_threads(head_dim),
                    smem, stream(), sa, sb, head_dim, eps, rotary_dim, at, freqs);
  launched(kOp);
}

}  // namespace fs::cuda
