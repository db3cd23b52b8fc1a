// Manifold-constrained hyper-connections (mhc_weights, weighted_stream_sum, mhc_expand) and the
// DeepSeek/GLM expert selection (select_experts), as the CPU computes them
// (cpu_mhc_router.cpp): the small per-row mixes in double, like the CPU, so both sides round the
// Sinkhorn iterations alike.
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace fs::cuda {
namespace {

constexpr int kMaxStreams = 16;
constexpr int kRowThreads = 256;

// One block per row: the row's sum of squares (double), then thread 0 the mixes.
__global__ void mhc_weights_kernel(const float* h, std::int64_t cols, const float* m,
                                   std::int64_t mcols, const float* base, const float* scale, int H,
                                   float norm_eps, double eps, int iters, float* pre, float* post,
                                   float* comb) {
  __shared__ double red[kRowThreads / kWarp];
  const std::int64_t s = blockIdx.x;
  const float* hs = h + s * cols;
  double ss = 0;
  for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    ss += static_cast<double>(hs[i]) * hs[i];
  for (int o = kWarp / 2; o > 0; o /= 2) ss += __shfl_down_sync(0xffffffffu, ss, o);
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = ss;
  __syncthreads();
  if (threadIdx.x != 0) return;
  ss = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) ss += red[w];
  const double r = 1.0 / sqrt(ss / static_cast<double>(cols) + norm_eps);
  const float* ms = m + s * mcols;
  for (int j = 0; j < H; ++j)
    pre[s * H + j] = static_cast<float>(1.0 / (1.0 + exp(-(r * ms[j] * scale[0] + base[j]))) + eps);
  if (post == nullptr) return;
  for (int j = 0; j < H; ++j)
    post[s * H + j] =
        static_cast<float>(2.0 / (1.0 + exp(-(r * ms[H + j] * scale[1] + base[H + j]))));
  double c[kMaxStreams * kMaxStreams];
  for (int i = 0; i < H; ++i) {
    double mx = -INFINITY;
    for (int j = 0; j < H; ++j) {
      c[i * H + j] = r * ms[2 * H + i * H + j] * scale[2] + base[2 * H + i * H + j];
      mx = fmax(mx, c[i * H + j]);
    }
    double sum = 0;
    for (int j = 0; j < H; ++j) sum += (c[i * H + j] = exp(c[i * H + j] - mx));
    for (int j = 0; j < H; ++j) c[i * H + j] = c[i * H + j] / sum + eps;
  }
  for (int it = 0; it < iters; ++it) {
    if (it > 0)
      for (int i = 0; i < H; ++i) {
        double sum = 0;
        for (int j = 0; j < H; ++j) sum += c[i * H + j];
        for (int j = 0; j < H; ++j) c[i * H + j] /= sum + eps;
      }
    for (int j = 0; j < H; ++j) {
      double sum = 0;
      for (int i = 0; i < H; ++i) sum += c[i * H + j];
      for (int i = 0; i < H; ++i) c[i * H + j] /= sum + eps;
    }
  }
  for (int i = 0; i < H * H; ++i) comb[s * H * H + i] = static_cast<float>(c[i]);
}

// out[r, c] = sum_s w[r, s] * x[r, s*W + c], s ascending from 0 (the CPU's order).
__global__ void weighted_stream_sum_kernel(const float* x, const float* w, std::int64_t rows,
                                           std::int64_t W, int H, float* out) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * W) return;
  const std::int64_t r = i / W, c = i % W;
  const float* xr = x + r * H * W;
  float acc = 0;
  for (int s = 0; s < H; ++s) acc = mul_add(w[r * H + s], xr[s * W + c], acc);
  out[i] = acc;
}

// h[r, k, c] <- post[r, k] * y[r, c] + sum_j comb[r, j*H+k] * h[r, j, c]; a thread per (r, c)
// holds the column's H old values.
__global__ void mhc_expand_kernel(float* h, const float* y, const float* post, const float* comb,
                                  std::int64_t rows, std::int64_t W, int H) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * W) return;
  const std::int64_t r = i / W, c = i % W;
  float* hr = h + r * H * W;
  float old[kMaxStreams];
  for (int j = 0; j < H; ++j) old[j] = hr[j * W + c];
  const float* cr = comb + r * H * H;
  for (int k = 0; k < H; ++k) {
    float acc = __fmul_rn(post[r * H + k], y[r * W + c]);
    for (int j = 0; j < H; ++j) acc = mul_add(cr[j * H + k], old[j], acc);
    hr[k * W + c] = acc;
  }
}

// (a, ia) ranks before the best so far (b, ib; ib < 0: none yet): the larger value, ties to the
// lower id.
__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
  return ib < 0 || a > b || (a == b && ia < ib);
}

constexpr int kMaxExperts = 1024;
constexpr int kMaxGroups = 256;

// One warp per row: the biased scores in shared memory, the experts outside the best groups set
// to -inf, then k passes of a warp-wide argmax over the experts not yet taken (ties to the lower
// id), the order of the CPU's partial sort. Token ids and table entries were checked where they
// entered (the tokenizer, the loader); one out of range here routes to no expert (-1), which
// moe_experts skips.
__global__ void select_experts_kernel(const float* scores, const float* bias,
                                      const std::int32_t* table, const std::int32_t* token_ids,
                                      std::int64_t vocab, int E, int groups, int top_groups, int k,
                                      bool normalize, float scaling, std::int32_t* experts,
                                      float* weights) {
  __shared__ float choice[kMaxExperts];
  __shared__ bool taken[kMaxExperts];
  __shared__ float gscore[kMaxGroups];
  __shared__ bool keep[kMaxGroups];
  const std::int64_t s = blockIdx.x;
  const int lane = threadIdx.x;
  const float* sc = scores + s * E;
  std::int32_t* ids = experts + s * k;
  if (table != nullptr) {
    const std::int32_t tok = token_ids[s];
    for (int j = lane; j < k; j += kWarp) {
      const std::int32_t e = tok >= 0 && tok < vocab ? table[tok * k + j] : -1;
      ids[j] = e >= 0 && e < E ? e : -1;
    }
  } else {
    for (int e = lane; e < E; e += kWarp) {
      choice[e] = sc[e] + (bias != nullptr ? bias[e] : 0.0f);
      taken[e] = false;
    }
    __syncwarp();
    if (groups > 1) {
      const int per = E / groups;
      for (int g = lane; g < groups; g += kWarp) {
        float a = -INFINITY, b2 = -INFINITY;
        for (int i = 0; i < per; ++i) {
          const float v = choice[g * per + i];
          if (v > a) {
            b2 = a;
            a = v;
          } else if (v > b2) {
            b2 = v;
          }
        }
        gscore[g] = per > 1 ? a + b2 : a;
        keep[g] = false;
      }
      __syncwarp();
      // The best groups, ties to the lower group (the CPU's stable sort).
      if (lane == 0)
        for (int t = 0; t < top_groups; ++t) {
          int best = -1;
          for (int g = 0; g < groups; ++g)
            if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
          keep[best] = true;
        }
      __syncwarp();
      for (int e = lane; e < E; e += kWarp)
        if (!keep[e / per]) choice[e] = -INFINITY;
      __syncwarp();
    }
    for (int j = 0; j < k; ++j) {
      float bv = 0;
      int bi = -1;
      for (int e = lane; e < E; e += kWarp)
        if (!taken[e] && ranks_before(choice[e], e, bv, bi)) bv = choice[e], bi = e;
      for (int o = kWarp / 2; o > 0; o /= 2) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, o);
        const int oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (oi >= 0 && ranks_before(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      bi = __shfl_sync(0xffffffffu, bi, 0);
      if (lane == 0) {
        ids[j] = bi;
        if (bi >= 0) taken[bi] = true;
      }
      __syncwarp();
    }
  }
  __syncwarp();
  if (lane == 0) {
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += (weights[s * k + j] = ids[j] >= 0 ? sc[ids[j]] : 0.0f);
    for (int j = 0; j < k; ++j) {
      const float w = weights[s * k + j];
      weights[s * k + j] = (normalize ? w / (sum + 1e-20f) : w) * scaling;
    }
  }
}

}  // namespace

void CudaBackend::mhc_weights(const Tensor& h, const Tensor& m, const Weight& base,
                              const Weight& scale, std::int64_t streams, float norm_eps,
                              float hc_eps, std::int64_t sinkhorn_iters, Tensor& pre, Tensor* post,
                              Tensor* comb) {
  constexpr const char* kOp = "mhc_weights";
  if (failed() || !on_device(kOp, {&h, &m}) || !on_device(kOp, base) || !on_device(kOp, scale))
    return;
  const bool head = post == nullptr;
  const auto S = h.rows(), H = streams;
  if (!check(H >= 1 && H <= kMaxStreams && m.rows() == S && m.cols() == (head ? H : (2 + H) * H) &&
                 base.numel() == m.cols() && scale.numel() == (head ? 1 : 3) &&
                 (head || comb != nullptr),
             kOp, "mix logits, base and scale do not match the streams (at most 16)"))
    return;
  if (!ensure(pre, {S, H})) return;
  if (!head && (!ensure(*post, {S, H}) || !ensure(*comb, {S, H * H}))) return;
  if (S == 0) return;
  if (walking()) return;
  mhc_weights_kernel<<<static_cast<unsigned>(S), kRowThreads, 0, stream()>>>(
      h.data(), h.cols(), m.data(), m.cols(), base.f32(), scale.f32(), static_cast<int>(H),
      norm_eps, hc_eps, static_cast<int>(sinkhorn_iters), pre.data(), head ? nullptr : post->data(),
      head ? nullptr : comb->data());
  launched(kOp);
}

void CudaBackend::weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out) {
  constexpr const char* kOp = "weighted_stream_sum";
  if (failed() || !on_device(kOp, {&x, &w})) return;
  const auto H = w.cols();
  if (!check(H >= 1 && x.cols() % H == 0 && w.rows() == x.rows() && &out != &x, kOp,
             "w [rows, streams] must divide x's rows into streams (and out may not be x)"))
    return;
  const auto W = x.cols() / H;
  if (!ensure(out, {x.rows(), W})) return;
  if (x.rows() * W == 0) return;
  if (walking()) return;
  weighted_stream_sum_kernel<<<grid_for(x.rows() * W, 256), 256, 0, stream()>>>(
      x.data(), w.data(), x.rows(), W, static_cast<int>(H), out.data());
  launched(kOp);
}

void CudaBackend::mhc_expand(Tensor& h, const Tensor& y, const Tensor& post, const Tensor& comb) {
  constexpr const char* kOp = "mhc_expand";
  if (failed() || !on_device(kOp, {&h, &y, &post, &comb})) return;
  const auto H = post.cols(), W = y.cols(), rows = h.rows();
  if (!check(H >= 1 && H <= kMaxStreams && h.cols() == H * W && comb.cols() == H * H &&
                 y.rows() == rows && post.rows() == rows && comb.rows() == rows,
             kOp, "h [rows, H*W], y [rows, W], post [rows, H], comb [rows, H*H] (H <= 16)"))
    return;
  if (rows * W == 0) return;
  if (walking()) return;
  mhc_expand_kernel<<<grid_for(rows * W, 256), 256, 0, stream()>>>(
      h.data(), y.data(), post.data(), comb.data(), rows, W, static_cast<int>(H));
  launched(kOp);
}

void CudaBackend::select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                                 const Tensor* token_ids, std::int64_t groups,
                                 std::int64_t top_groups, std::int64_t k, bool normalize,
                                 float scaling, Tensor& experts, Tensor& weights) {
  constexpr const char* kOp = "select_experts";
  if (failed() || !on_device(kOp, {&scores})) return;
  const bool hashed = !table.empty();
  if (hashed && (!on_device(kOp, table) || token_ids == nullptr || !on_device(kOp, {token_ids})))
    return;
  if (!hashed && !bias.empty() && !on_device(kOp, bias)) return;
  const auto S = scores.rows(), E = scores.cols();
  if (!check(!hashed || (table.dtype == DType::kI32 && table.cols() == k &&
                         token_ids->dtype() == DType::kI32 && token_ids->rows() == S),
             kOp, "a hash table needs int32 token ids [S, 1] and an int32 [vocab, k] table"))
    return;
  if (!check(groups >= 1 && groups <= kMaxGroups && E <= kMaxExperts && E % groups == 0 &&
                 top_groups >= 1 && top_groups <= groups && k >= 1 && k <= E,
             kOp, "at most 1024 experts in at most 256 groups that divide them, k <= experts"))
    return;
  if (!ensure(experts, {S, k}, DType::kI32) || !ensure(weights, {S, k})) return;
  if (S == 0) return;
  if (walking()) return;
  select_experts_kernel<<<static_cast<unsigned>(S), kWarp, 0, stream()>>>(
      scores.data(), hashed || bias.empty() ? nullptr : bias.f32(),
      hashed ? reinterpret_cast<const std::int32_t*>(table.data) : nullptr,
      hashed ? token_ids->data_as<std::int32_t>() : nullptr, hashed ? table.rows() : 0,
      static_cast<int>(E), static_cast<int>(groups), static_cast<int>(top_groups),
      static_cast<int>(k), normalize, scaling, experts.data_as<std::int32_t>(), weights.data());
  launched(kOp);
}

}  // namespace fs::cuda
