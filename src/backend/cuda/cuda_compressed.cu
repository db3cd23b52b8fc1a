// DeepSeek V4's compressed-attention ops on the device (backend.h "compressed attention"):
// interleaved tail RoPE, the compressor's gated pooling, the lightning indexer's weighted scores,
// sink attention over raw + compressed rows, the grouped output projection. Straightforward
// kernels (a block per row, window, query head); softmax normalisers in double as the CPU. They
// run eagerly (DeepSeek V4 records no step graphs yet).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/weight_rows.h"

namespace fs::cuda {
namespace {

// One row per block: cos/sin of each pair's fp32 angle (in double, as the CPU), then every
// head's tail rotated without fused multiply-adds.
__global__ void rope_interleaved_kernel(float* x, std::int64_t cols, std::int64_t head_dim,
                                        const float* inv_freq, std::int64_t half,
                                        std::int64_t first, std::int64_t stride, bool inverse) {
  extern __shared__ float cs[];  // cos[half], sin[half]
  const auto pos = static_cast<float>(first + static_cast<std::int64_t>(blockIdx.x) * stride);
  for (std::int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    const float angle = __fmul_rn(pos, inv_freq[j]);
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    cs[j] = static_cast<float>(c);
    cs[half + j] = inverse ? -static_cast<float>(s) : static_cast<float>(s);
  }
  __syncthreads();
  const std::int64_t heads = cols / head_dim, tail = head_dim - 2 * half;
  float* row = x + static_cast<std::int64_t>(blockIdx.x) * cols;
  for (std::int64_t i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const std::int64_t h = i / half, j = i % half;
    float* p = row + h * head_dim + tail + 2 * j;
    const float a = p[0], b = p[1], c = cs[j], s = cs[half + j];
    p[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    p[1] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

// A thread per (window, channel): the softmax over the window's slots, as the CPU orders it.
__global__ void compressor_pool_kernel(const float* kv, const float* gate, std::int64_t width,
                                       std::int64_t src_first, const float* bias,
                                       std::int64_t ratio, std::int64_t first_window,
                                       std::int64_t windows, bool overlap, std::int64_t D,
                                       float* out) {
  const std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= windows * D) return;
  const std::int64_t wi = idx / D, i = idx % D, w = first_window + wi;
  // Slots: window w-1's first halves (overlap, w > 0), then window w's (second halves).
  const std::int64_t prev = overlap && w > 0 ? ratio : 0, n = prev + ratio;
  auto slot = [&](std::int64_t j, float& score, float& value) {
    const std::int64_t t = j < prev ? (w - 1) * ratio + j : w * ratio + (j - prev);
    const std::int64_t col = (j < prev ? 0 : (overlap ? D : 0)) + i;
    const std::int64_t row = t - src_first;
    score = __fadd_rn(gate[row * width + col], bias[(t % ratio) * width + col]);
    value = kv[row * width + col];
  };
  float m = -INFINITY, s, v;
  for (std::int64_t j = 0; j < n; ++j) {
    slot(j, s, v);
    m = fmaxf(m, s);
  }
  double sum = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    slot(j, s, v);
    sum += static_cast<double>(expf(s - m));
  }
  float acc = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    slot(j, s, v);
    acc = __fadd_rn(acc, __fmul_rn(v, static_cast<float>(static_cast<double>(expf(s - m)) / sum)));
  }
  out[wi * D + i] = acc;
}

// A warp per (query, row): per head the dot over dim across lanes, ReLU, weight, summed in head
// order.
__global__ void weighted_index_scores_kernel(const float* q, const float* keys, const float* w,
                                             std::int64_t N, std::int64_t heads, std::int64_t dim,
                                             float scale, float* out) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t s = blockIdx.y;
  const std::int64_t b =
      blockIdx.x * static_cast<std::int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (b >= N) return;
  const float* qs = q + s * heads * dim;
  const float* key = keys + b * dim;
  float acc = 0;
  for (std::int64_t h = 0; h < heads; ++h) {
    float d = 0;
    for (std::int64_t c = lane; c < dim; c += kWarp) d += qs[h * dim + c] * key[c];
    d = warp_sum(d);
    acc += w[s * heads + h] * fmaxf(d, 0.0f);
  }
  if (lane == 0) out[s * N + b] = acc * scale;
}

// A block per (query, head): the key list is the raw window, then the picked (or every visible)
// compressed row; logits in shared memory, the softmax with the sink, then the weighted sum.
__global__ void sink_attention_kernel(const float* q, const float* kv, std::int64_t kv_first,
                                      std::int64_t window, const float* comp, std::int64_t N,
                                      std::int64_t ratio, const std::int32_t* picked,
                                      std::int64_t top, const float* sinks, std::int64_t first,
                                      float scale, std::int64_t H, std::int64_t D, float* out) {
  extern __shared__ float logits[];
  __shared__ float red[32];
  __shared__ double dred[32];
  const std::int64_t s = blockIdx.x / H, h = blockIdx.x % H, p = first + s;
  const std::int64_t raw_begin = max(kv_first, p - window + 1);
  const std::int64_t n_raw = p - raw_begin + 1;
  const std::int64_t n_comp = picked != nullptr ? top : (ratio > 0 ? min(N, (p + 1) / ratio) : 0);
  const std::int64_t n = n_raw + n_comp;
  // The key of slot j; nullptr for a skipped pick.
  auto key = [&](std::int64_t j) -> const float* {
    if (j < n_raw) return kv + (raw_begin + j - kv_first) * D;
    const std::int64_t c = j - n_raw;
    const std::int64_t row = picked != nullptr ? picked[s * top + c] : c;
    return row < 0 ? nullptr : comp + row * D;
  };
  const float* qh = q + (s * H + h) * D;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  for (std::int64_t j = warp; j < n; j += warps) {
    const float* k = key(j);
    float d = 0;
    if (k != nullptr)
      for (std::int64_t c = lane; c < D; c += kWarp) d += qh[c] * k[c];
    d = warp_sum(d);
    if (lane == 0) logits[j] = k != nullptr ? d * scale : -INFINITY;
  }
  __syncthreads();
  float m = sinks[h];
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, logits[j]);
  m = block_max(m, red);
  double part = threadIdx.x == 0 ? static_cast<double>(expf(sinks[h] - m)) : 0.0;
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = logits[j] == -INFINITY ? 0.0f : expf(logits[j] - m);
    logits[j] = e;
    part += e;
  }
  const double sum = block_sum(part, dred);
  float* o = out + (s * H + h) * D;
  for (std::int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const float* k = key(j);
      if (k != nullptr) acc += static_cast<float>(logits[j] / sum) * k[c];
    }
    o[c] = acc;
  }
}

}  // namespace

void CudaBackend::rope_interleaved(Tensor& x, std::int64_t head_dim, const Weight& inv_freq,
                                   std::int64_t first, std::int64_t stride, bool inverse) {
  constexpr const char* kOp = "rope_interleaved";
  if (failed() || !on_device(kOp, {&x}) || !on_device(kOp, inv_freq)) return;
  const auto half = inv_freq.numel();
  if (!check(inv_freq.dtype == DType::kF32 && head_dim > 0 && x.cols() % head_dim == 0 &&
                 2 * half <= head_dim,
             kOp, "head_dim must divide the row and hold the rotary pairs"))
    return;
  if (x.rows() == 0 || half == 0 || walking()) return;
  rope_interleaved_kernel<<<static_cast<unsigned>(x.rows()), 128,
                            static_cast<std::size_t>(2 * half) * sizeof(float), stream()>>>(
      x.data(), x.cols(), head_dim, inv_freq.f32(), half, first, stride, inverse);
  launched(kOp);
}

void CudaBackend::compressor_pool(const Tensor& kv, const Tensor& gate, std::int64_t src_first,
                                  const Weight& bias, std::int64_t first_window,
                                  std::int64_t windows, bool overlap, Tensor& out) {
  constexpr const char* kOp = "compressor_pool";
  if (failed() || !on_device(kOp, {&kv, &gate}) || !on_device(kOp, bias)) return;
  const auto width = kv.cols(), ratio = bias.rows(), D = overlap ? width / 2 : width;
  if (!check(gate.shape() == kv.shape() && bias.dtype == DType::kF32 && bias.cols() == width &&
                 ratio > 0,
             kOp, "kv, gate and bias must agree in width"))
    return;
  const auto lo = (overlap && first_window > 0 ? first_window - 1 : first_window) * ratio;
  const auto hi = (first_window + windows) * ratio;
  if (!check(windows == 0 || (lo >= src_first && hi <= src_first + kv.rows()), kOp,
             "the windows' positions must lie in the frontier"))
    return;
  if (!ensure(out, {windows, D})) return;
  if (windows == 0 || walking()) return;
  compressor_pool_kernel<<<grid_for(windows * D, 128), 128, 0, stream()>>>(
      kv.data(), gate.data(), width, src_first, bias.f32(), ratio, first_window, windows, overlap,
      D, out.data());
  launched(kOp);
}

void CudaBackend::weighted_index_scores(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                        float scale, Tensor& out) {
  constexpr const char* kOp = "weighted_index_scores";
  if (failed() || !on_device(kOp, {&q, &weights})) return;
  const auto S = q.rows(), heads = weights.cols();
  const auto N = keys.shape().empty() ? 0 : keys.rows();
  if (!ensure(out, {S, N})) return;
  if (S == 0 || N == 0 || walking()) return;
  if (!on_device(kOp, {&keys}) || !check(weights.rows() == S && q.cols() == heads * keys.cols(),
                                         kOp, "q must hold `heads` rows of the keys' width"))
    return;
  constexpr int kWarpsPerBlock = 4;
  const dim3 grid(grid_for(N, kWarpsPerBlock), static_cast<unsigned>(S));
  weighted_index_scores_kernel<<<grid, kWarpsPerBlock * kWarp, 0, stream()>>>(
      q.data(), keys.data(), weights.data(), N, heads, keys.cols(), scale, out.data());
  launched(kOp);
}

void CudaBackend::sink_attention(const Tensor& q, const Tensor& kv, std::int64_t kv_first,
                                 std::int64_t window, const Tensor& comp, std::int64_t ratio,
                                 const Tensor* picked, const Weight& sinks, std::int64_t first,
                                 float scale, Tensor& out) {
  constexpr const char* kOp = "sink_attention";
  if (failed() || !on_device(kOp, {&q, &kv}) || !on_device(kOp, sinks)) return;
  const auto S = q.rows(), D = kv.cols();
  const auto H = D > 0 ? q.cols() / D : 0;
  const auto N = comp.shape().empty() ? 0 : comp.rows();
  if (!check(H * D == q.cols() && sinks.numel() == H && sinks.dtype == DType::kF32 &&
                 (N == 0 || comp.cols() == D) && first - kv_first + S <= kv.rows() &&
                 kv_first <= first,
             kOp, "q, kv, comp and sinks must agree (one K=V head covering the queries)"))
    return;
  if (picked != nullptr && !check(picked->dtype() == DType::kI32 && picked->rows() == S, kOp,
                                  "picked must be [S, k] int32"))
    return;
  if (N > 0 && !on_device(kOp, {&comp})) return;
  if (picked != nullptr && !on_device(kOp, {picked})) return;
  if (!ensure(out, q.shape())) return;
  if (S == 0 || walking()) return;
  const auto top = picked != nullptr ? picked->cols() : 0;
  const auto max_keys = window + (picked != nullptr ? top : N);
  const auto smem = static_cast<std::size_t>(std::max<std::int64_t>(max_keys, 1)) * sizeof(float);
  if (!check(smem <= 48 * 1024, kOp, "more keys per query than fit in shared memory")) return;
  sink_attention_kernel<<<static_cast<unsigned>(S * H), 128, smem, stream()>>>(
      q.data(), kv.data(), kv_first, window, N > 0 ? comp.data() : nullptr, N, ratio,
      picked != nullptr ? picked->data_as<std::int32_t>() : nullptr, top, sinks.f32(), first, scale,
      H, D, out.data());
  launched(kOp);
}

// One product per group on a contiguous copy of its columns, copied into the group's columns.
void CudaBackend::grouped_linear(const Tensor& x, const Weight& w, std::int64_t groups, Tensor& y) {
  constexpr const char* kOp = "grouped_linear";
  if (failed() || !on_device(kOp, {&x}) || !on_device(kOp, w, /*packed_ok=*/true)) return;
  const auto S = x.rows(), in = groups > 0 ? x.cols() / groups : 0;
  const auto out = groups > 0 ? w.rows() / groups : 0;
  if (!check(groups > 0 && in * groups == x.cols() && w.cols() == in && out * groups == w.rows(),
             kOp, "the groups must split x's columns and w's rows evenly"))
    return;
  if (!ensure(y, {S, groups * out})) return;
  if (S == 0 || walking()) return;
  Tensor xg, yg;
  for (std::int64_t g = 0; g < groups; ++g) {
    slice_cols(x, g * in, in, xg);
    // The group's rows in any storage (linear reads every format it can, refusing the rest).
    auto wg = weight_rows(w, g * out, out);
    if (!wg.ok()) return fail(wg.status().with_context("cuda: grouped_linear"));
    linear(xg, *wg, yg);
    if (failed()) return;
    const auto row = static_cast<std::size_t>(out) * sizeof(float);
    if (cudaMemcpy2DAsync(y.data() + g * out, static_cast<std::size_t>(groups) * row, yg.data(),
                          row, row, static_cast<std::size_t>(S), cudaMemcpyDeviceToDevice,
                          stream()) != cudaSuccess) {
      check(false, kOp, "copying a group's output failed");
      return;
    }
  }
}

}  // namespace fs::cuda
