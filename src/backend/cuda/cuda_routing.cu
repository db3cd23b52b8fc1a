// Indexers and routing: block means, QSA block scores, softmax, top-k, block selection.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ranking.cuh"
#include "backend/cuda/cuda_route_warp.cuh"
#include "backend/cuda/cuda_select.h"
#include "backend/cuda/cuda_switches.h"
#include "backend/cuda/cuda_vocab_topk.h"

namespace fs::cuda {
namespace {

// out[b, c] = (sum_j x[first_row + b*group + j, c]) / group, summed in order as the CPU does.
__global__ void block_mean_kernel(const float* x, std::int64_t cols, StepScalar first_row,
                                  std::int64_t blocks, std::int64_t group, float* out) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= blocks * cols) return;
  const std::int64_t b = i / cols, c = i % cols;
  const float* p = x + (first_row.get() + b * group) * cols + c;
  float s = 0;
  for (std::int64_t j = 0; j < group; ++j) s += p[j * cols];
  out[i] = s / static_cast<float>(group);
}

// out[p, c] = sum_j softmax_j(gate[r_j, c] + ape[j*dim + c]) * keys[r_j, c], r_j = first_row +
// p*pool + j; a thread per (p, c), the sums in double in slot order as the CPU does.
__global__ void kpool_compress_kernel(const float* keys, const float* gate, const float* ape,
                                      std::int64_t dim, std::int64_t pool, std::int64_t first_row,
                                      std::int64_t pools, float* out) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= pools * dim) return;
  const std::int64_t p = i / dim, c = i % dim, r0 = first_row + p * pool;
  float mx = -INFINITY;
  for (std::int64_t j = 0; j < pool; ++j)
    mx = fmaxf(mx, __fadd_rn(gate[(r0 + j) * dim + c], ape[j * dim + c]));
  double sum = 0, acc = 0;
  for (std::int64_t j = 0; j < pool; ++j) {
    const double e =
        exp(static_cast<double>(__fadd_rn(gate[(r0 + j) * dim + c], ape[j * dim + c])) - mx);
    sum += e;
    acc += e * keys[(r0 + j) * dim + c];
  }
  out[i] = static_cast<float>(acc / sum);
}

// out[s, b] = scale * sum_h relu(q[s, h] . keys[b]); a warp per (s, b).
// B (the live key count, also out's row stride) may be a per-step scalar: the grid covers the
// cache's capacity and warps past B write nothing.
__global__ void index_scores_kernel(const float* q, const float* keys, std::int64_t S,
                                    StepScalar live_keys, std::int64_t heads, std::int64_t dim,
                                    float scale, float* out) {
  const std::int64_t B = live_keys.get();
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

constexpr int kScoreLanes = 8;  // lanes per block key
constexpr int kScoreThreads = 256;
constexpr int kScoreKeysPerBlock = kScoreThreads / kScoreLanes;
constexpr int kScoreQueries = 4;  // queries per block, held in shared memory
constexpr std::size_t kScoreSmemMax = 48 * 1024;

// out[s, b] = scale * sum_h relu(q[s, h] . keys[b]) for the decode shapes: 8 lanes per key, each
// holding 16-byte chunks c = 4*sub + 32*m of it in registers (the 8 lanes read 128 contiguous
// bytes per chunk, so a warp's loads are whole lines), the block's up to 4 queries in shared
// memory. Grid (key tiles of 32, query tiles of 4). keys is 16-byte aligned, dim % 4 == 0 and
// dim <= 32 * kChunks.
template <int kChunks>
__global__ void __launch_bounds__(kScoreThreads)
    index_scores_tiled_kernel(const float* q, const float* keys, std::int64_t S,
                              StepScalar live_keys, std::int64_t heads, std::int64_t dim,
                              float scale, float* out) {
  // Launched overlapped (session 39): launched the ordinary way it could not be resident before
  // the kernel ahead of it ended (the chain trace saw it only inside the 5.2 us the index key's
  // append held at 1k). q, the key count and the newest keys are the kernels' before.
  wait_for_inputs();
  release_dependents();
  const std::int64_t B = live_keys.get();
  extern __shared__ float4 q_tile4[];  // [nq][heads * dim] floats
  float* q_tile = reinterpret_cast<float*>(q_tile4);
  const std::int64_t s0 = static_cast<std::int64_t>(blockIdx.y) * kScoreQueries;
  const std::int64_t width = heads * dim;
  const int nq = static_cast<int>(S - s0 < kScoreQueries ? S - s0 : kScoreQueries);
  for (std::int64_t i = threadIdx.x; i < nq * width; i += blockDim.x) q_tile[i] = q[s0 * width + i];
  __syncthreads();
  const std::int64_t b =
      static_cast<std::int64_t>(blockIdx.x) * kScoreKeysPerBlock + threadIdx.x / kScoreLanes;
  const int sub = static_cast<int>(threadIdx.x % kScoreLanes);
  // Lanes past the last key compute on a live one (or key 0 of the capacity when none is live:
  // every lane takes part in the shuffles) and write nothing.
  const bool live = b < B;
  const float* kp = keys + (live ? b : (B > 0 ? B - 1 : 0)) * dim;
  float4 kr[kChunks];
#pragma unroll
  for (int m = 0; m < kChunks; ++m) {
    const std::int64_t c = 4 * sub + 32 * m;
    kr[m] = c < dim ? *reinterpret_cast<const float4*>(kp + c) : make_float4(0, 0, 0, 0);
  }
  for (int s = 0; s < nq; ++s) {
    float total = 0;
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* qh = q_tile + s * width + h * dim;
      float d = 0;
#pragma unroll
      for (int m = 0; m < kChunks; ++m) {
        const std::int64_t c = 4 * sub + 32 * m;
        if (c < dim) {
          const float4 qv = *reinterpret_cast<const float4*>(qh + c);
          d += qv.x * kr[m].x + qv.y * kr[m].y + qv.z * kr[m].z + qv.w * kr[m].w;
        }
      }
      // The 8 lanes of a key are an aligned group: xor offsets below 8 stay inside it.
      d += __shfl_xor_sync(0xffffffffu, d, 4);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      d += __shfl_xor_sync(0xffffffffu, d, 1);
      total += d > 0 ? d : 0;
    }
    if (live && sub == 0) out[(s0 + s) * B + b] = total * scale;
  }
}

// Row p of `cols` in place: e = exp(x - max) in fp32, their sum in double, x = e / sum. The whole
// block calls it.
__device__ void softmax_row(float* p, std::int64_t cols) {
  __shared__ float red_f[32];
  __shared__ double red_d[32];
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

__global__ void softmax_kernel(float* x, std::int64_t cols) {
  softmax_row(x + blockIdx.x * cols, cols);
}

// The k best of the first n entries of row p, descending, ties to the lower index, into idx[0, k)
// and val[0, k) (when not null); -1 (and 0) past n. Round r keeps the best entry ranked below
// round r-1's pick. The whole block calls it; thread 0 writes.
__device__ void topk_row(const float* p, std::int64_t n, std::int64_t k, std::int32_t* idx,
                         float* val) {
  __shared__ float sv[32];
  __shared__ std::int32_t si[32];
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
      warp_best(bv, bi);
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
      idx[r] = done ? -1 : bi;
      if (val != nullptr) val[r] = done ? 0.0f : bv;
    }
  }
}

// The k best of each row (of its first n entries: n = cols, or (first+row+1)/block when block >
// 0), as topk_row.
__global__ void topk_kernel(const float* x, StepScalar live_cols, std::int64_t k,
                            StepScalar live_first, std::int64_t block, std::int32_t* idx,
                            float* val) {
  const std::int64_t cols = live_cols.get(), first = live_first.get();
  const std::int64_t row = blockIdx.x;
  std::int64_t n = cols;
  if (block > 0 && (first + row + 1) / block < cols) n = (first + row + 1) / block;
  topk_row(x + row * cols, n, k, idx + row * k, val == nullptr ? nullptr : val + row * k);
}

// The MoE router after its product, a block per token: softmax of the logits row (in place),
// its top k, and (when `normalize`) the k weights divided by their fp32 sum in order, as
// softmax, topk and normalize_rows compute them one after the other.
__global__ void route_kernel(float* logits, std::int64_t E, std::int64_t k, bool normalize,
                             std::int32_t* idx, float* val) {
  float* p = logits + blockIdx.x * E;
  softmax_row(p, E);
  __syncthreads();  // every thread's probabilities are written before the selection reads them
  std::int32_t* ri = idx + blockIdx.x * k;
  float* rv = val + blockIdx.x * k;
  topk_row(p, E, k, ri, rv);
  if (normalize && threadIdx.x == 0) {
    float sum = 0;
    for (std::int64_t c = 0; c < k; ++c) sum += rv[c];
    for (std::int64_t c = 0; c < k; ++c) rv[c] /= sum;
  }
}

// The decode router (cuda_route_warp.cuh): a warp per token.
template <int kPer>
__global__ void route_warp_kernel(const float* logits, std::int64_t S, std::int64_t E,
                                  std::int64_t k, bool normalize, std::int32_t* idx, float* val,
                                  bool fast) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  route_warp_rows<kPer>(logits, S, E, k, normalize, idx, val, blockIdx.x, fast);
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
  const StepScalar at = step_scalar(first_row);
  if (walking()) return;
  block_mean_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(x.data(), x.cols(), at, blocks, group,
                                                            out.data());
  launched(kOp);
}

void CudaBackend::kpool_compress(const Tensor& keys, const Tensor& gate, const Weight& ape,
                                 std::int64_t pool, std::int64_t first_row, std::int64_t pools,
                                 Tensor& out) {
  constexpr const char* kOp = "kpool_compress";
  if (failed() || !on_device(kOp, ape) || !on_device(kOp, {&keys, &gate})) return;
  const auto dim = keys.cols();
  if (!check(pool > 0 && pools >= 0 && first_row >= 0 && gate.cols() == dim &&
                 gate.rows() == keys.rows() && ape.dtype == DType::kF32 &&
                 ape.numel() == pool * dim && first_row + pools * pool <= keys.rows() &&
                 &out != &keys && &out != &gate,
             kOp, "keys, gate [T, dim], ape F32 [pool*dim], the pools inside the rows"))
    return;
  if (!ensure(out, {pools, dim})) return;
  const auto n = pools * dim;
  if (n == 0 || walking()) return;
  kpool_compress_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(
      keys.data(), gate.data(), ape.f32(), dim, pool, first_row, pools, out.data());
  launched(kOp);
}

void CudaBackend::index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                               Tensor& out) {
  constexpr const char* kOp = "index_scores";
  if (failed() || !on_device(kOp, {&q, &keys})) return;
  const auto dim = keys.cols(), B = keys.shape().empty() ? 0 : keys.rows(), S = q.rows();
  if (!check(heads > 0 && q.cols() == heads * dim, kOp, "q must be [S, heads * dim]")) return;
  // Inside a step graph B is a per-step scalar: the grid covers the keys' capacity, and out is
  // allocated for it (the same block on every replay), its row stride the live B.
  const bool graphed = mode_ != StepMode::kEager;
  const auto row_bytes = static_cast<std::size_t>(std::max<std::int64_t>(dim, 1)) * sizeof(float);
  const auto cap = graphed ? std::max<std::int64_t>(
                                 B, static_cast<std::int64_t>(keys.capacity_bytes() / row_bytes))
                           : B;
  if (graphed && !ensure(out, {S, cap})) return;
  if (!ensure(out, {S, B})) return;
  if (S * cap == 0) return;
  const StepScalar live = step_scalar(B);
  if (walking()) return;
  const auto smem = static_cast<std::size_t>(kScoreQueries * heads * dim) * sizeof(float);
  const bool aligned = reinterpret_cast<std::uintptr_t>(keys.data()) % 16 == 0;
  const std::int64_t query_tiles = (S + kScoreQueries - 1) / kScoreQueries;
  const bool tiled = !old_kernel_requested("FLASHSERVE_CUDA_OLD_INDEX") && aligned &&
                     dim % 4 == 0 && dim <= 256 && smem <= kScoreSmemMax && query_tiles <= 65535;
  if (!tiled) {
    index_scores_kernel<<<grid_for(S * cap * kWarp, 256), 256, 0, stream()>>>(
        q.data(), keys.data(), S, live, heads, dim, scale, out.data());
    launched(kOp);
    return;
  }
  const dim3 grid(grid_for(cap, kScoreKeysPerBlock), static_cast<unsigned>(query_tiles));
  const auto kernel = dim <= 128 ? index_scores_tiled_kernel<4> : index_scores_tiled_kernel<8>;
  launch_overlapped(kernel, grid, dim3(kScoreThreads), smem, stream(), q.data(), keys.data(), S,
                    live, heads, dim, scale, out.data());
  launched(kOp);
}

void CudaBackend::softmax(Tensor& x) {
  if (failed() || !on_device("softmax", {&x})) return;
  if (x.numel() == 0) return;
  const int threads = static_cast<int>(
      std::clamp<std::int64_t>((x.cols() + kWarp - 1) / kWarp * kWarp, kWarp, 256));
  if (walking()) return;
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
  if (!check(x.dtype() == DType::kF32, op, "x must be f32")) return;
  // Block selection inside a step graph: the row width (the live block count, also the row
  // stride) and the position are per-step scalars; the launch is sized for the scores'
  // capacity (index_scores allocates them for the keys' capacity), which changes no result.
  auto cols = x.cols();
  StepScalar live_cols{nullptr, cols}, live_first{nullptr, first};
  if (block > 0 && mode_ != StepMode::kEager) {
    cols = std::max<std::int64_t>(
        cols, static_cast<std::int64_t>(x.capacity_bytes() / sizeof(float)) / rows);
    live_cols = step_scalar(x.cols());
    live_first = step_scalar(first);
  }
  if (walking()) return;
  // A vocabulary-wide row (sampled decoding's top 1,024): narrowed on the whole GPU, then the
  // radix select over the candidates (cuda_vocab_topk.h; FLASHSERVE_CUDA_VOCAB_TOPK=0 selects
  // over the whole row in one block instead, ~19x slower). Eager only (its scratch is local;
  // the sampler's rows are not recorded in a step graph).
  if (block == 0 && mode_ == StepMode::kEager &&
      env_flag_default_on("FLASHSERVE_CUDA_VOCAB_TOPK") &&
      !old_kernel_requested("FLASHSERVE_CUDA_OLD_TOPK") && vocab_topk_fits(rows, cols, k)) {
    const VocabTopkScratch n = vocab_topk_scratch(rows, cols);
    Tensor offers, thresholds, list_val, list_idx, counts, cand_val, cand_idx, width;
    if (!ensure(offers, {n.offers}, DType::kI32) ||
        !ensure(thresholds, {n.thresholds}, DType::kI32) || !ensure(list_val, {n.list}) ||
        !ensure(list_idx, {n.list}, DType::kI32) || !ensure(counts, {n.counts}, DType::kI32) ||
        !ensure(cand_val, {n.candidates}) || !ensure(cand_idx, {n.candidates}, DType::kI32) ||
        !ensure(width, {1}, DType::kI64))
      return;
    const VocabTopkBuffers buffers{
        .offers = reinterpret_cast<std::uint32_t*>(offers.data_as<std::int32_t>()),
        .thresholds = reinterpret_cast<std::uint32_t*>(thresholds.data_as<std::int32_t>()),
        .list_val = list_val.data(),
        .list_idx = list_idx.data_as<std::int32_t>(),
        .counts = counts.data_as<std::int32_t>(),
        .cand_val = cand_val.data(),
        .cand_idx = cand_idx.data_as<std::int32_t>(),
        .width = width.data_as<std::int64_t>()};
    launch_vocab_topk(x.data(), rows, cols, k, buffers, idx.data_as<std::int32_t>(),
                      val == nullptr ? nullptr : val->data(), stream());
    launched(op);
    return;
  }
  if (!old_kernel_requested("FLASHSERVE_CUDA_OLD_TOPK") && radix_select_fits(cols, k)) {
    launch_radix_topk(x.data(), rows, cols, live_cols, k, live_first, block,
                      idx.data_as<std::int32_t>(), val == nullptr ? nullptr : val->data(),
                      stream());
    launched(op);
    return;
  }
  const int threads =
      static_cast<int>(std::clamp<std::int64_t>((cols + kWarp - 1) / kWarp * kWarp, kWarp, 256));
  topk_kernel<<<static_cast<unsigned>(rows), threads, 0, stream()>>>(
      x.data(), live_cols, k, live_first, block, idx.data_as<std::int32_t>(),
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

void CudaBackend::route_experts(const Tensor& x, const Weight& router, std::int64_t top_k,
                                bool normalize, Tensor& experts, Tensor& weights) {
  constexpr const char* kOp = "route_experts";
  if (failed() || !on_device(kOp, {&x})) return;
  const auto S = x.shape().empty() ? 0 : x.rows(), E = router.rows();
  // A block per token walks the k picks one by one: meant for the router's k of ~10.
  constexpr std::int64_t kMaxFusedK = 64;
  if (S == 0 || E == 0 || top_k < 1 || top_k > kMaxFusedK || &experts == &weights) {
    Backend::route_experts(x, router, top_k, normalize, experts, weights);
    return;
  }
  Tensor logits;
  linear(x, router, logits);
  if (failed() || !ensure(experts, {S, top_k}, DType::kI32) || !ensure(weights, {S, top_k})) return;
  if (walking()) return;
  // Rows of up to 1024 experts take a warp each (4 tokens a block); wider ones a block each.
  constexpr int kRouteWarps = 4;
  const auto warp_blocks = static_cast<unsigned>((S + kRouteWarps - 1) / kRouteWarps);
  if (const int slots = route_warp_slots(E); slots != 0) {
    with_route_slots(slots, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      launch_overlapped(route_warp_kernel<kPer>, warp_blocks, kRouteWarps * kWarp, 0, stream(),
                        logits.data(), S, E, top_k, normalize, experts.data_as<std::int32_t>(),
                        weights.data(), route_fast_picks());
    });
    launched(kOp);
    return;
  }
  const int threads =
      static_cast<int>(std::clamp<std::int64_t>((E + kWarp - 1) / kWarp * kWarp, kWarp, 256));
  route_kernel<<<static_cast<unsigned>(S), threads, 0, stream()>>>(
      logits.data(), E, top_k, normalize, experts.data_as<std::int32_t>(), weights.data());
  launched(kOp);
}

}  // namespace fs::cuda
