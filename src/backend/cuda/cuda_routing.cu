// Indexers and routing: block means, QSA block scores, softmax, top-k, block selection.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace fs::cuda {
namespace {

// out[b, c] = (sum_j x[first_row + b*group + j, c]) / group, summed in order as the CPU does.
__global__ void block_mean_kernel(const float* x, std::int64_t cols, std::int64_t first_row,
                                  std::int64_t blocks, std::int64_t group, float* out) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= blocks * cols) return;
  const std::int64_t b = i / cols, c = i % cols;
  const float* p = x + (first_row + b * group) * cols + c;
  float s = 0;
  for (std::int64_t j = 0; j < group; ++j) s += p[j * cols];
  out[i] = s / static_cast<float>(group);
}

// out[s, b] = scale * sum_h relu(q[s, h] . keys[b]); a warp per (s, b).
__global__ void index_scores_kernel(const float* q, const float* keys, std::int64_t S,
                                    std::int64_t B, std::int64_t heads, std::int64_t dim,
                                    float scale, float* out) {
  const std::int64_t wi =
      (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (wi >= S * B) return;
  const std::int64_t s = wi / B, b = wi % B;
  const int lane = threadIdx.x % kWarp;
  const float* kb = keys + b * dim;
  float total = 0;
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* qh = q + s * heads * dim + h * dim;
    float d = 0;
    for (std::int64_t c = lane; c < dim; c += kWarp) d += qh[c] * kb[c];
    d = warp_sum(d);
    total += d > 0 ? d : 0;
  }
  if (lane == 0) out[wi] = total * scale;
}

// Per row: e = exp(x - max) in fp32, their sum in double, x = e / sum.
__global__ void softmax_kernel(float* x, std::int64_t cols) {
  __shared__ float red_f[32];
  __shared__ double red_d[32];
  float* p = x + blockIdx.x * cols;
  float m = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, p[c]);
  m = block_max(m, red_f);
  double s = 0;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float e = expf(p[c] - m);
    p[c] = e;
    s += e;
  }
  s = block_sum(s, red_d);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) p[c] = static_cast<float>(p[c] / s);
}

// Whether (v, i) ranks above (bv, bi): larger value, or equal value and lower index; bi < 0 is
// "nothing yet".
__device__ __forceinline__ bool ranks_above(float v, std::int32_t i, float bv, std::int32_t bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

// The k best of each row (of its first n entries: n = cols, or (first+row+1)/block when block >
// 0), descending, ties to the lower index; -1 (and 0) past the available entries. Round r keeps
// the best entry ranked below round r-1's pick.
__global__ void topk_kernel(const float* x, std::int64_t cols, std::int64_t k, std::int64_t first,
                            std::int64_t block, std::int32_t* idx, float* val) {
  __shared__ float sv[32];
  __shared__ std::int32_t si[32];
  const std::int64_t row = blockIdx.x;
  const float* p = x + row * cols;
  std::int64_t n = cols;
  if (block > 0 && (first + row + 1) / block < cols) n = (first + row + 1) / block;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  float pv = INFINITY;
  std::int32_t pi = -1;
  bool done = false;
  for (std::int64_t r = 0; r < k; ++r) {
    float bv = -INFINITY;
    std::int32_t bi = -1;
    if (!done) {
      for (std::int64_t c = threadIdx.x; c < n; c += blockDim.x) {
        const float v = p[c];
        const auto i = static_cast<std::int32_t>(c);
        const bool below = pi < 0 || v < pv || (v == pv && i > pi);
        if (below && ranks_above(v, i, bv, bi)) {
          bv = v;
          bi = i;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const std::int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && ranks_above(ov, oi, bv, bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
      }
      __syncthreads();
      bv = -INFINITY;
      bi = -1;
      for (int w = 0; w < warps; ++w)
        if (si[w] >= 0 && ranks_above(sv[w], si[w], bv, bi)) {
          bv = sv[w];
          bi = si[w];
        }
      __syncthreads();
      done = bi < 0;
      pv = bv;
      pi = bi;
    }
    if (threadIdx.x == 0) {
      idx[row * k + r] = done ? -1 : bi;
      if (val != nullptr) val[row * k + r] = done ? 0.0f : bv;
    }
  }
}

}  // namespace

void CudaBackend::block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks,
                             std::int64_t group, Tensor& out) {
  constexpr const char* kOp = "block_mean";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(group > 0 && blocks >= 0 && first_row >= 0 && first_row + blocks * group <= x.rows() &&
                 &out != &x,
             kOp, "the blocks run past x (or out is x)"))
    return;
  if (!ensure(out, {blocks, x.cols()})) return;
  const auto n = blocks * x.cols();
  if (n == 0) return;
  block_mean_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(x.data(), x.cols(), first_row, blocks,
                                                            group, out.data());
  launched(kOp);
}

void CudaBackend::index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                               Tensor& out) {
  constexpr const char* kOp = "index_scores";
  if (failed() || !on_device(kOp, {&q, &keys})) return;
  const auto dim = keys.cols(), B = keys.shape().empty() ? 0 : keys.rows(), S = q.rows();
  if (!check(heads > 0 && q.cols() == heads * dim, kOp, "q must be [S, heads * dim]")) return;
  if (!ensure(out, {S, B})) return;
  if (S * B == 0) return;
  index_scores_kernel<<<grid_for(S * B * kWarp, 256), 256, 0, stream()>>>(
      q.data(), keys.data(), S, B, heads, dim, scale, out.data());
  launched(kOp);
}

void CudaBackend::softmax(Tensor& x) {
  if (failed() || !on_device("softmax", {&x})) return;
  if (x.numel() == 0) return;
  const int threads = static_cast<int>(
      std::clamp<std::int64_t>((x.cols() + kWarp - 1) / kWarp * kWarp, kWarp, 256));
  softmax_kernel<<<static_cast<unsigned>(x.rows()), threads, 0, stream()>>>(x.data(), x.cols());
  launched("softmax");
}

void CudaBackend::run_topk(const Tensor& x, std::int64_t k, std::int64_t first, std::int64_t block,
                           Tensor& idx, Tensor* val, const char* op) {
  if (failed() || !on_device(op, {&x})) return;
  if (!check(k >= 0 && &idx != &x && val != &x, op, "k must be non-negative")) return;
  const auto rows = x.shape().empty() ? 0 : x.rows();
  if (!ensure(idx, {rows, k}, DType::kI32)) return;
  if (val != nullptr && !ensure(*val, {rows, k})) return;
  if (rows == 0 || k == 0) return;
  const int threads = static_cast<int>(
      std::clamp<std::int64_t>((x.cols() + kWarp - 1) / kWarp * kWarp, kWarp, 256));
  topk_kernel<<<static_cast<unsigned>(rows), threads, 0, stream()>>>(
      x.data(), x.cols(), k, first, block, idx.data_as<std::int32_t>(),
      val == nullptr ? nullptr : val->data());
  launched(op);
}

void CudaBackend::topk(const Tensor& x, std::int64_t k, Tensor& idx, Tensor& val) {
  run_topk(x, k, 0, 0, idx, &val, "topk");
}

void CudaBackend::select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block,
                                std::int64_t top, Tensor& picked) {
  if (!check(block > 0, "select_blocks", "block must be positive")) return;
  run_topk(scores, top, first, block, picked, nullptr, "select_blocks");
}

}  // namespace fs::cuda
