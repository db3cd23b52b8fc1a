// Block-sparse softmax attention over the QSA selection: split-K kernels for decode-sized work
// (few queries: the selected keys spread over many blocks, each kv head's rows loaded once for
// its query heads, then a deterministic merge), and the earlier kernel (a block per (query,
// head)), kept for shapes the split kernels do not take and behind FLASHSERVE_CUDA_OLD_ATTENTION.
// Two split kernels write the same partials for the same merge: the tiled one
// (cuda_attention_tiles.cu, session 13: 32-key tiles, a key a lane, cp.async loads in flight),
// and the one before it here (16-key tiles walked a key at a time), kept for shapes the tiled one
// does not take and behind FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION (cuda_switches.h).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_attention_tiles.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

constexpr int kAttnWarps = 8;
constexpr int kAttnThreads = kWarp * kAttnWarps;

// Block-sparse attention for one (query s, head h) per block. Each warp takes every kAttnWarps-th
// picked key, then every kAttnWarps-th tail key, with its own online softmax (fp32); the warps'
// partial states merge at the end. Lane holds dims d = lane + 32m.
template <int kPer>  // ceil(D / 32)
__global__ void __launch_bounds__(kAttnThreads)
    attention_kernel(const float* q, const float* k, const float* v, const std::int32_t* picked,
                     std::int64_t top, std::int64_t Hq, std::int64_t rep, std::int64_t D,
                     std::int64_t kv_stride, std::int64_t block, StepScalar first, float scale,
                     float* out) {
  extern __shared__ float sm[];  // acc [warps][D], m [warps], l [warps]
  const std::int64_t s = blockIdx.x / Hq, h = blockIdx.x % Hq, kvh = h / rep;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const float* qs = q + s * Hq * D + h * D;
  float qr[kPer], acc[kPer];
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const std::int64_t d = lane + kWarp * m;
    qr[m] = d < D ? qs[d] : 0.0f;
    acc[m] = 0.0f;
  }
  float mx = -INFINITY, l = 0.0f;
  auto visit = [&](std::int64_t key) {
    const float* kp = k + key * kv_stride + kvh * D;
    const float* vp = v + key * kv_stride + kvh * D;
    float dot = 0;
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const std::int64_t d = lane + kWarp * m;
      if (d < D) dot += qr[m] * kp[d];
    }
    const float sc = warp_sum(dot) * scale;
    const float m_new = fmaxf(mx, sc);
    const float corr = expf(mx - m_new), p = expf(sc - m_new);
    l = l * corr + p;
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const std::int64_t d = lane + kWarp * m;
      acc[m] = acc[m] * corr + (d < D ? p * vp[d] : 0.0f);
    }
    mx = m_new;
  };
  // Picked keys by flat index (entry, offset in block), so small blocks still use every warp.
  for (std::int64_t f = warp; f < top * block; f += kAttnWarps) {
    const std::int64_t b = picked[s * top + f / block];
    if (b >= 0) visit(b * block + f % block);
  }
  const std::int64_t pos = first.get() + s;
  for (std::int64_t key = (pos + 1) / block * block + warp; key <= pos; key += kAttnWarps)
    visit(key);

  float* sacc = sm;
  float* sm_m = sm + kAttnWarps * D;
  float* sm_l = sm_m + kAttnWarps;
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const std::int64_t d = lane + kWarp * m;
    if (d < D) sacc[warp * D + d] = acc[m];
  }
  if (lane == 0) {
    sm_m[warp] = mx;
    sm_l[warp] = l;
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm_m[w]);
  float L = 0;
  for (int w = 0; w < kAttnWarps; ++w)
    if (sm_m[w] != -INFINITY) L += sm_l[w] * expf(sm_m[w] - M);
  float* os = out + s * Hq * D + h * D;
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm_m[w] != -INFINITY) o += sacc[w * D + d] * expf(sm_m[w] - M);
    os[d] = L > 0 ? o / L : 0.0f;
  }
}

// Split-K block-sparse attention for few queries (flash-decoding): the keys a query visits (its
// picked blocks' keys in order, then its unfinished tail) are a flat list split into `splits`
// chunks; block (query s, kv head g, chunk j) loads the chunk's K and V rows of head g into
// shared memory a tile of kTileKeys at a time, once for all `rep` query heads that read them (a
// warp each, lane holding dims d = lane + 32m), and keeps an online softmax per head. With one
// split it writes the output; otherwise its partial (max, sum, unnormalised output) for the merge.
constexpr int kTileKeys = 16;
constexpr int kSplitMaxThreads = 1024;  // rep <= 32 query heads per kv head
constexpr std::int64_t kMaxSplits = 128;
constexpr std::int64_t kMinKeysPerSplit = 32;
// Blocks to aim for when splitting: two per multiprocessor (264 on an H200), read once.
std::int64_t target_blocks() {
  return 2 * multiprocessors();
}

template <int kPer>  // ceil(D / 32)
__global__ void __launch_bounds__(kSplitMaxThreads)
    attention_split_kernel(const float* q, const float* k, const float* v,
                           const std::int32_t* picked, std::int64_t top, std::int64_t Hq,
                           std::int64_t rep, std::int64_t D, std::int64_t kv_stride,
                           std::int64_t block, StepScalar first, float scale, std::int64_t splits,
                           std::int64_t chunk, float* part_acc, float* part_ml, float* out) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  extern __shared__ float4 kv_tile4[];  // K [kTileKeys][D], then V [kTileKeys][D]
  float* k_tile = reinterpret_cast<float*>(kv_tile4);
  float* v_tile = k_tile + kTileKeys * D;
  __shared__ std::int64_t slot_key[kTileKeys];
  const std::int64_t s = blockIdx.x / splits, j = blockIdx.x % splits, g = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  const std::int64_t h = g * rep + warp;
  const float* qs = q + s * Hq * D + h * D;
  float qr[kPer], acc[kPer];
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const std::int64_t d = lane + kWarp * m;
    qr[m] = d < D ? qs[d] : 0.0f;
    acc[m] = 0.0f;
  }
  float mx = -INFINITY, l = 0.0f;
  const std::int64_t pos = first.get() + s, tail0 = (pos + 1) / block * block;
  const std::int64_t n_pick = top * block, n_all = n_pick + (pos + 1 - tail0);
  const std::int64_t f_begin = j * chunk;
  const std::int64_t f_end = f_begin + chunk < n_all ? f_begin + chunk : n_all;
  const std::int64_t d4 = D / 4;
  for (std::int64_t t0 = f_begin; t0 < f_end; t0 += kTileKeys) {
    if (tid < kTileKeys) {
      const std::int64_t f = t0 + tid;
      std::int64_t key = -1;
      if (f < f_end) {
        if (f < n_pick) {
          const std::int64_t b = picked[s * top + f / block];
          if (b >= 0) key = b * block + f % block;
        } else {
          key = tail0 + (f - n_pick);
        }
      }
      slot_key[tid] = key;
    }
    __syncthreads();
    for (std::int64_t i = tid; i < kTileKeys * d4; i += blockDim.x) {
      const std::int64_t slot = i / d4, c = (i % d4) * 4;
      const std::int64_t key = slot_key[slot];
      if (key < 0) continue;
      const std::int64_t at = key * kv_stride + g * D + c;
      *reinterpret_cast<float4*>(k_tile + slot * D + c) = *reinterpret_cast<const float4*>(k + at);
      *reinterpret_cast<float4*>(v_tile + slot * D + c) = *reinterpret_cast<const float4*>(v + at);
    }
    __syncthreads();
    const std::int64_t in_tile = f_end - t0 < kTileKeys ? f_end - t0 : kTileKeys;
    for (std::int64_t slot = 0; slot < in_tile; ++slot) {
      if (slot_key[slot] < 0) continue;
      const float* kp = k_tile + slot * D;
      const float* vp = v_tile + slot * D;
      float dot = 0;
#pragma unroll
      for (int m = 0; m < kPer; ++m) {
        const std::int64_t d = lane + kWarp * m;
        if (d < D) dot += qr[m] * kp[d];
      }
      const float sc = warp_sum(dot) * scale;
      const float m_new = fmaxf(mx, sc);
      const float corr = expf(mx - m_new), p = expf(sc - m_new);
      l = l * corr + p;
#pragma unroll
      for (int m = 0; m < kPer; ++m) {
        const std::int64_t d = lane + kWarp * m;
        acc[m] = acc[m] * corr + (d < D ? p * vp[d] : 0.0f);
      }
      mx = m_new;
    }
    __syncthreads();  // the next tile overwrites slot_key and the rows
  }
  if (splits == 1) {
    float* os = out + s * Hq * D + h * D;
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const std::int64_t d = lane + kWarp * m;
      if (d < D) os[d] = l > 0 ? acc[m] / l : 0.0f;
    }
    return;
  }
  const std::int64_t at = (s * Hq + h) * splits + j;
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const std::int64_t d = lane + kWarp * m;
    if (d < D) part_acc[at * D + d] = acc[m];
  }
  if (lane == 0) {
    part_ml[at * 2] = mx;
    part_ml[at * 2 + 1] = l;
  }
}

// out[s, h] = sum_j acc_j * exp(m_j - M) / sum_j l_j * exp(m_j - M), the splits in order (a
// deterministic merge); a block per (query, head). Splits that saw no key (m_j = -inf) weigh 0.
// The splits' (m, l) are read by as many threads, and the weighted sums run over shared
// weights with their loads in flight together: the form that walked the splits in one thread
// took 14 us a layer at 65 splits (bench/NOTES.md, 2026-12-02). The sums are in split order, as
// before.
// A column's partials are read kMergeBatch at a time into registers, then summed in order (session
// 36; the loop unrolled by 8 kept 8 loads in flight, so 33 splits at 1k context were 5 L2 round
// trips after the weights), and a thread's first batch is asked for before the (m, l) reads and
// the block's reductions, which it does not depend on. The same products in the same order.
constexpr int kMergeBatch = 32;
// With a gate (the op's output gate), each output is multiplied by act(gate) as mul_activated's
// MulActivatedOp does after the division: the same two roundings.
__global__ void attention_merge_kernel(const float* part_acc, const float* part_ml,
                                       std::int64_t splits, std::int64_t D, const float* gate,
                                       Activation act, float* out) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  __shared__ float weight[kMaxSplits];
  __shared__ float ls[kMaxSplits];
  __shared__ float red[32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * splits;
  float a[kMergeBatch];
  const auto fetch = [&](std::int64_t d, std::int64_t j0) {
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u)
      a[u] = d < D && j0 + u < splits ? part_acc[(base + j0 + u) * D + d] : 0.0f;
  };
  const std::int64_t d0 = threadIdx.x;
  fetch(d0, 0);
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < splits; j += blockDim.x)
    m = fmaxf(m, part_ml[(base + j) * 2]);
  const float M = block_max(m, red);
  for (std::int64_t j = threadIdx.x; j < splits; j += blockDim.x) {
    const float mj = part_ml[(base + j) * 2];
    weight[j] = mj == -INFINITY ? 0.0f : expf(mj - M);
    ls[j] = part_ml[(base + j) * 2 + 1];
  }
  __syncthreads();
  float L = 0;
  for (std::int64_t j = 0; j < splits; ++j) L = fmaf(ls[j], weight[j], L);
  float* os = out + static_cast<std::int64_t>(blockIdx.x) * D;
  for (std::int64_t d = d0; d < D; d += blockDim.x) {
    float o = 0;
    for (std::int64_t j0 = 0; j0 < splits; j0 += kMergeBatch) {
      if (d != d0 || j0 > 0) fetch(d, j0);
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u)
        if (j0 + u < splits) o += a[u] * weight[j0 + u];
    }
    const float v = L > 0 ? o / L : 0.0f;
    os[d] = gate != nullptr
                ? __fmul_rn(v, apply_act(gate[static_cast<std::int64_t>(blockIdx.x) * D + d], act))
                : v;
  }
}

// The merge of `rows` = queries x heads, each over `splits` partials.
void launch_merge(const float* acc, const float* ml, std::int64_t rows, std::int64_t splits,
                  std::int64_t D, const float* gate, Activation act, float* out,
                  cudaStream_t stream) {
  launch_overlapped(attention_merge_kernel, static_cast<unsigned>(rows), 256, 0, stream, acc, ml,
                    splits, D, gate, act, out);
}

}  // namespace

void CudaBackend::block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                         std::int64_t heads, std::int64_t kv_heads,
                                         const Tensor& picked, std::int64_t block,
                                         std::int64_t first, float scale, Tensor& out) {
  attention_with_gate(q, k, v, heads, kv_heads, picked, block, first, scale, nullptr,
                      Activation::kIdentity, out);
}

void CudaBackend::gated_block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               std::int64_t heads, std::int64_t kv_heads,
                                               const Tensor& picked, std::int64_t block,
                                               std::int64_t first, float scale, Tensor& gate,
                                               Activation act, Tensor& out) {
  if (failed() || !on_device("gated_block_sparse_attention", {&gate})) return;
  if (!check(gate.shape() == q.shape() && gate.dtype() == DType::kF32 &&
                 reinterpret_cast<std::uintptr_t>(gate.data()) % 16 == 0,
             "gated_block_sparse_attention", "gate must be f32 shaped as q, 16-byte aligned"))
    return;
  if (!attention_with_gate(q, k, v, heads, kv_heads, picked, block, first, scale, &gate, act, out))
    mul_activated(out, gate, act);
}

bool CudaBackend::attention_with_gate(const Tensor& q, const Tensor& k, const Tensor& v,
                                      std::int64_t heads, std::int64_t kv_heads,
                                      const Tensor& picked, std::int64_t block, std::int64_t first,
                                      float scale, const Tensor* gate, Activation act,
                                      Tensor& out) {
  constexpr const char* kOp = "block_sparse_attention";
  if (failed() || !on_device(kOp, {&q, &k, &v, &picked})) return true;
  const auto S = q.rows();
  if (!check(
          heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && q.cols() % heads == 0 && block > 0,
          kOp, "heads must be a multiple of kv_heads and divide q's row; block positive"))
    return true;
  const auto D = q.cols() / heads;
  const auto top = picked.shape().empty() ? 0 : picked.cols();
  if (!check(k.cols() == kv_heads * D && v.cols() == kv_heads * D && D <= 256, kOp,
             "k, v must be [T, kv_heads * D] with D <= 256"))
    return true;
  if (!check(top == 0 || (picked.rows() == S && picked.dtype() == DType::kI32), kOp,
             "picked must be int32 [S, top]"))
    return true;
  if (!check(k.rows() > first + S - 1 || S == 0, kOp, "the cache is shorter than the queries"))
    return true;
  if (!check(&out != &q, kOp, "out may not be q")) return true;
  if (!ensure(out, q.shape())) return true;
  if (S == 0 || D == 0) return true;
  const auto rep = heads / kv_heads;
  const auto* p = top == 0 ? nullptr : picked.data_as<std::int32_t>();
  const auto per = (D + kWarp - 1) / kWarp;
  const bool aligned = reinterpret_cast<std::uintptr_t>(k.data()) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(v.data()) % 16 == 0;
  const bool split_kernels = !old_kernel_requested("FLASHSERVE_CUDA_OLD_ATTENTION") &&
                             rep <= kSplitMaxThreads / kWarp && D % 4 == 0 && aligned &&
                             k.dtype() == DType::kF32 && v.dtype() == DType::kF32;
  // The tiled kernel copies q rows by 16 bytes and stores float4s, so q and out need 16-byte rows
  // too; the reservation is sticky, so a replay's walk takes the same branch as its recording.
  if (split_kernels && !old_kernel_requested("FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION") &&
      tiled_attention_takes(rep, D) && reinterpret_cast<std::uintptr_t>(q.data()) % 16 == 0 &&
      reinterpret_cast<std::uintptr_t>(out.data()) % 16 == 0 && reserve_tiled_attention()) {
    // Every query visits at most top*block picked keys plus block-1 tail keys.
    const auto split = tiled_attention_split(top * block + block - 1, S * kv_heads);
    if (!check(split.splits <= kMaxSplits && S * split.splits < (std::int64_t{1} << 31) &&
                   kv_heads <= 65535,
               kOp, "split grid out of range"))
      return true;
    Tensor part_acc, part_ml;  // pooled scratch, released after the launch (stream order)
    TiledAttention a;
    if (split.splits > 1) {
      if (!ensure(part_acc, {S * heads * split.splits, D}) ||
          !ensure(part_ml, {S * heads * split.splits, 2}))
        return true;
      a.part_acc = part_acc.data();
      a.part_ml = part_ml.data();
    }
    // `first` is a per-step scalar inside a step graph; nothing else here depends on it.
    a.first = step_scalar(first);
    if (walking()) return true;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.picked = p;
    a.top = top;
    a.Hq = heads;
    a.rep = rep;
    a.D = D;
    a.kv_stride = kv_heads * D;
    a.block = block;
    a.scale = scale;
    a.splits = split.splits;
    a.chunk = split.chunk;
    a.stages = split.stages;
    a.out = out.data();
    a.gate = gate != nullptr ? gate->data() : nullptr;
    a.gate_act = act;
    launch_tiled_attention(a, S, kv_heads, stream());
    if (!launched(kOp) || split.splits == 1) return true;
    launch_merge(a.part_acc, a.part_ml, S * heads, split.splits, D, a.gate, act, out.data(),
                 stream());
    launched(kOp);
    return true;
  }
  if (split_kernels) {
    // Every query visits at most top*block picked keys plus block-1 tail keys.
    const std::int64_t most = top * block + block - 1;
    const std::int64_t groups = S * kv_heads;
    std::int64_t splits = 1;
    if (groups * 2 < target_blocks()) {
      splits = std::min({(most + kMinKeysPerSplit - 1) / kMinKeysPerSplit,
                         (target_blocks() + groups - 1) / groups, kMaxSplits});
      splits = std::max<std::int64_t>(splits, 1);
    }
    const std::int64_t chunk = std::max<std::int64_t>((most + splits - 1) / splits, 1);
    splits = std::max<std::int64_t>((most + chunk - 1) / chunk, 1);  // no chunk wholly past the end
    if (!check(splits <= kMaxSplits && S * splits < (std::int64_t{1} << 31) && kv_heads <= 65535,
               kOp, "split grid out of range"))
      return true;
    Tensor part_acc, part_ml;  // pooled scratch, released after the launch (stream order)
    float* acc = nullptr;
    float* ml = nullptr;
    if (splits > 1) {
      if (!ensure(part_acc, {S * heads * splits, D}) || !ensure(part_ml, {S * heads * splits, 2}))
        return true;
      acc = part_acc.data();
      ml = part_ml.data();
    }
    // `first` is a per-step scalar inside a step graph; nothing else here depends on it.
    const StepScalar at = step_scalar(first);
    if (walking()) return splits > 1;  // the merge applies the gate
    const dim3 grid(static_cast<unsigned>(S * splits), static_cast<unsigned>(kv_heads));
    const auto threads = static_cast<unsigned>(rep * kWarp);
    const auto smem = static_cast<std::size_t>(2 * kTileKeys * D) * sizeof(float);
    auto split = [&](auto per_lane) {
      constexpr int kPer = decltype(per_lane)::value;
      launch_overlapped(attention_split_kernel<kPer>, grid, threads, smem, stream(), q.data(),
                        k.data(), v.data(), p, top, heads, rep, D, kv_heads * D, block, at, scale,
                        splits, chunk, acc, ml, out.data());
    };
    if (per <= 1) {
      split(std::integral_constant<int, 1>{});
    } else if (per <= 2) {
      split(std::integral_constant<int, 2>{});
    } else if (per <= 4) {
      split(std::integral_constant<int, 4>{});
    } else {
      split(std::integral_constant<int, 8>{});
    }
    if (!launched(kOp)) return true;
    if (splits == 1) return false;  // the split kernel wrote out: no gate
    launch_merge(acc, ml, S * heads, splits, D, gate != nullptr ? gate->data() : nullptr, act,
                 out.data(), stream());
    launched(kOp);
    return true;
  }
  const StepScalar at = step_scalar(first);
  if (walking()) return false;
  const auto blocks = static_cast<unsigned>(S * heads);
  const auto smem = static_cast<std::size_t>(kAttnWarps * (D + 2)) * sizeof(float);
#define FS_ATTN_CASE(n)                                                                          \
  attention_kernel<n><<<blocks, kAttnThreads, smem, stream()>>>(                                 \
      q.data(), k.data(), v.data(), p, top, heads, heads / kv_heads, D, kv_heads * D, block, at, \
      scale, out.data())
  if (per <= 1) {
    FS_ATTN_CASE(1);
  } else if (per <= 2) {
    FS_ATTN_CASE(2);
  } else if (per <= 4) {
    FS_ATTN_CASE(4);
  } else {
    FS_ATTN_CASE(8);
  }
#undef FS_ATTN_CASE
  launched(kOp);
  return false;  // the earliest kernel takes no gate
}

}  // namespace fs::cuda
