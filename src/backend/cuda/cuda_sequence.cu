// Ops that mix tokens: causal depthwise conv with its tail, the gated delta rule (block-sparse
// softmax attention is in cuda_attention.cu).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

// y[t, c] = sum_j w[c, j] * win[t + j*dilation, c], win = tail ++ x (tail has L rows); the sum
// in the CPU's order, without fused multiply-adds.
template <typename T>
__global__ void conv1d_kernel(const float* x, const T* w, const float* tail, std::int64_t S,
                              std::int64_t C, std::int64_t K, std::int64_t dilation, std::int64_t L,
                              float* y) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= S * C) return;
  const std::int64_t t = i / C, c = i % C;
  float acc = 0;
  for (std::int64_t j = 0; j < K; ++j) {
    const std::int64_t r = t + j * dilation;
    const float v = r < L ? tail[r * C + c] : x[(r - L) * C + c];
    acc = mul_add(widen(w[c * K + j]), v, acc);
  }
  y[i] = acc;
}

// tail <- the last L rows of tail ++ x, a thread per channel walking rows upwards: row i reads
// window row S + i, which (when still in the tail) is overwritten only at the later step S + i.
__global__ void conv_tail_kernel(const float* x, float* tail, std::int64_t S, std::int64_t C,
                                 std::int64_t L) {
  wait_for_inputs();  // after conv1d_kernel, which reads the tail this overwrites
  release_dependents();
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (std::int64_t i = 0; i < L; ++i) {
    const std::int64_t r = S + i;
    tail[i * C + c] = r < L ? tail[r * C + c] : x[(r - L) * C + c];
  }
}

constexpr int kDeltaGroups = 8;  // warps per block; each owns every 8th state row
constexpr int kDeltaThreads = kWarp * kDeltaGroups;

// One token of the gated delta rule for thread (lane, grp) of a block's tile of 32 state columns:
// its state rows grp + 8m (st) decayed by decay(i), the column's delta from v_j and the token's
// key, the update, and the column's output, returned in group 0 (0 elsewhere). key(i) and
// query(i) are the token's l2-normed key and scaled query at state row i < dk; part holds the
// tile's sums. delta_rule_kernel and gdn_core_kernel both run this, so a decode step and an MTP
// verify make the same sums in the same order.
template <int kRows, typename Decay, typename Key, typename Query>
__device__ __forceinline__ float delta_token(float (&st)[kRows], int lane, int grp, std::int64_t dk,
                                             Decay decay, Key key, Query query, float vj, float b,
                                             float (&part)[2][kDeltaGroups][kWarp + 1]) {
  float kr[kRows];
  float mem = 0;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const std::int64_t i = grp + kDeltaGroups * m;
    kr[m] = i < dk ? key(i) : 0.0f;
    st[m] *= decay(i);
    mem += st[m] * kr[m];
  }
  part[0][grp][lane] = mem;
  __syncthreads();
  float total = 0;
#pragma unroll
  for (int gi = 0; gi < kDeltaGroups; ++gi) total += part[0][gi][lane];
  const float delta = (vj - total) * b;
  float o = 0;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const std::int64_t i = grp + kDeltaGroups * m;
    st[m] += kr[m] * delta;
    o += st[m] * (i < dk ? query(i) : 0.0f);
  }
  part[1][grp][lane] = o;
  __syncthreads();
  float ot = 0;
  if (grp == 0) {
#pragma unroll
    for (int gi = 0; gi < kDeltaGroups; ++gi) ot += part[1][gi][lane];
  }
  return ot;
}

// The gated delta rule, token by token. Block (value head h, tile of 32 state columns): thread
// (lane, group) holds state rows i = group + 8m of column j = tile*32 + lane in registers for the
// whole sequence. Columns are independent (delta_j reads only column j), so a token costs two
// block reductions over the row groups. kPerChannel: the log decay g is [S, Hv*dk], one per state
// row (KDA), instead of [S, Hv], one per head (GDN).
template <int kRows, bool kPerChannel>  // kRows = ceil(dk / 8)
__global__ void __launch_bounds__(kDeltaThreads)
    delta_rule_kernel(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, std::int64_t S, std::int64_t Hv, std::int64_t dk,
                      std::int64_t dv, std::int64_t rep, std::int64_t qk_stride, float* state,
                      float* out, float* states) {
  __shared__ float part[2][kDeltaGroups][kWarp + 1];
  const int lane = threadIdx.x, grp = threadIdx.y;
  const std::int64_t h = blockIdx.x, j = blockIdx.y * static_cast<std::int64_t>(kWarp) + lane;
  const bool col = j < dv;
  const std::int64_t kh = h / rep, v_stride = Hv * dv;
  float* Sm = state + h * dk * dv;
  // The state is loaded before the wait, as weights are (cuda_common.h): its last writer is this
  // kernel in an earlier step, or a copy queued before the step (a rollback, a restore), and both
  // have finished before the kernel before this one could stop waiting, which is when this one
  // starts. A DRAM round trip per layer off the step's critical path.
  float st[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const std::int64_t i = grp + kDeltaGroups * m;
    st[m] = (col && i < dk) ? Sm[i * dv + j] : 0.0f;
  }
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  for (std::int64_t t = 0; t < S; ++t) {
    const float* kt = k + t * qk_stride + kh * dk;
    const float* qt = q + t * qk_stride + kh * dk;
    const float b = beta[t * Hv + h];
    const float vj = col ? v[t * v_stride + h * dv + j] : 0.0f;
    const auto key = [&](std::int64_t i) { return kt[i]; };
    const auto query = [&](std::int64_t i) { return qt[i]; };
    float ot;
    if constexpr (kPerChannel) {
      const float* gt = g + (t * Hv + h) * dk;
      const auto decay = [&](std::int64_t i) { return i < dk ? expf(gt[i]) : 0.0f; };
      ot = delta_token<kRows>(st, lane, grp, dk, decay, key, query, vj, b, part);
    } else {
      const float d = expf(g[t * Hv + h]);
      const auto decay = [&](std::int64_t) { return d; };
      ot = delta_token<kRows>(st, lane, grp, dk, decay, key, query, vj, b, part);
    }
    if (grp == 0 && col) out[t * v_stride + h * dv + j] = ot;
    // gated_delta_rule_positions: the state after token t, for a rollback inside a verify.
    if (states != nullptr && col) {
      float* St = states + (t * Hv + h) * dk * dv;
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        const std::int64_t i = grp + kDeltaGroups * m;
        if (i < dk) St[i * dv + j] = st[m];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const std::int64_t i = grp + kDeltaGroups * m;
    if (col && i < dk) Sm[i * dv + j] = st[m];
  }
}

// gated_delta_net_core at one token: a block a value head h, thread (lane, group, tile) holding
// state rows group + 8m of column tile * 32 + lane, which is delta_rule_kernel's block (h, tile)
// side by side with the head's other tiles, so the recurrence makes the same sums in the same
// order. Around it, the ops that ran as kernels of their own, each with its kernel's arithmetic:
//  - the key head's q and k from the conv output, l2-normed as gdn_conv_kernel does (one channel a
//    thread, its square in double, the warps' sums then their sum, as block_sum over head_dim
//    threads), q scaled;
//  - the gated norm of the head's dv outputs as rms_norm_kernel does over a group of dv (column
//    tile * 32 + lane is that kernel's thread, so its warp is this tile).
// Needs dk <= 128 (q and k take 2 * dk / 32 warps) and dv a multiple of 32 up to 128.
constexpr int kCoreMaxTiles = 4;

template <int kRows>  // kRows = ceil(dk / 8)
__global__ void __launch_bounds__(kDeltaThreads* kCoreMaxTiles)
    gdn_core_kernel(const float* mixed, const float* z, const float* beta, const float* g,
                    const float* norm_w, std::int64_t Hv, std::int64_t dk, std::int64_t dv,
                    std::int64_t rep, std::int64_t key_dim, float q_scale, float eps,
                    Activation act, float* state, float* normed) {
  __shared__ float part[kCoreMaxTiles][2][kDeltaGroups][kWarp + 1];
  __shared__ float qs[kWarp * 4], ks[kWarp * 4];
  __shared__ double red[2][4], red_out[kCoreMaxTiles];
  const int lane = threadIdx.x, grp = threadIdx.y, tile = threadIdx.z;
  const int warp = grp + kDeltaGroups * tile;
  const std::int64_t h = blockIdx.x, j = tile * static_cast<std::int64_t>(kWarp) + lane;
  const std::int64_t kh = h / rep;
  float* Sm = state + h * dk * dv;
  // The state and the norm weight before the wait (delta_rule_kernel's reasoning for the state).
  float st[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const std::int64_t i = grp + kDeltaGroups * m;
    st[m] = i < dk ? Sm[i * dv + j] : 0.0f;
  }
  const float wn = norm_w[j];
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  // The head's v column, beta, g and z read at once, beside q and k (session 36): read where they
  // are used, after the barriers below, each was one more L2 round trip on the kernel's chain.
  const float vj = mixed[2 * key_dim + h * dv + j], beta_h = beta[h], g_h = g[h];
  const float zj = z[h * dv + j];
  // q and k of key head kh: warps 0..W-1 take q's channels, W..2W-1 k's (W = dk / 32 rounded up).
  const int W = static_cast<int>((dk + kWarp - 1) / kWarp);
  const bool is_q = warp < W, is_k = warp >= W && warp < 2 * W;
  const std::int64_t c = (is_q ? warp : warp - W) * static_cast<std::int64_t>(kWarp) + lane;
  float y = 0;
  if ((is_q || is_k) && c < dk) y = mixed[(is_q ? 0 : key_dim) + kh * dk + c];
  if (is_q || is_k) {
    const double sq = warp_sum(static_cast<double>(y) * y);
    if (lane == 0) red[is_q ? 0 : 1][is_q ? warp : warp - W] = sq;
  }
  __syncthreads();
  if (warp < 2) {  // warp 0 sums q's warps, warp 1 k's, as block_sum's second stage
    const double r = warp_sum(lane < W ? red[warp][lane] : 0.0);
    if (lane == 0) red[warp][0] = r;
  }
  __syncthreads();
  if ((is_q || is_k) && c < dk) {
    const float inv = static_cast<float>(1.0 / sqrt(red[is_q ? 0 : 1][0] + 1e-6f));
    if (is_q)
      qs[c] = __fmul_rn(__fmul_rn(y, inv), q_scale);
    else
      ks[c] = __fmul_rn(y, inv);
  }
  __syncthreads();
  // The recurrence for the one token (delta_rule_kernel at t = 0).
  const float d = expf(g_h);
  const float ot = delta_token<kRows>(
      st, lane, grp, dk, [&](std::int64_t) { return d; }, [&](std::int64_t i) { return ks[i]; },
      [&](std::int64_t i) { return qs[i]; }, vj, beta_h, part[tile]);
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const std::int64_t i = grp + kDeltaGroups * m;
    if (i < dk) Sm[i * dv + j] = st[m];
  }
  // The gated norm over the head's dv outputs (rms_norm_kernel, group dv, unit offset off).
  if (grp == 0) {
    const double sq = warp_sum(static_cast<double>(ot) * ot);
    if (lane == 0) red_out[tile] = sq;
  }
  __syncthreads();
  if (grp != 0) return;
  const int tiles = static_cast<int>(blockDim.z);
  const double ss = warp_sum(lane < tiles ? red_out[lane] : 0.0);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dv) + eps));
  float v = ot * inv * wn;
  v *= apply_act(zj, act);
  normed[h * dv + j] = v;
}

}  // namespace

void CudaBackend::causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation,
                                Tensor& tail, Tensor& y) {
  constexpr const char* kOp = "causal_conv1d";
  if (failed() || !on_device(kOp, w) || !on_device(kOp, {&x, &tail})) return;
  const auto S = x.rows(), C = x.cols(), K = w.cols();
  const auto L = (K - 1) * dilation;
  if (!check(w.rows() == C && K >= 1 && dilation >= 1 &&
                 (w.dtype == DType::kF32 || w.dtype == DType::kBF16),
             kOp, "w must be F32/BF16 [C, K] and dilation positive"))
    return;
  if (!check(L == 0 || (tail.rows() == L && tail.cols() == C), kOp,
             "tail must be [(K-1)*dilation, C]"))
    return;
  // The kernel reads x while writing y: when they alias, write a scratch and copy after the tail
  // has been updated from the unmodified x.
  const bool alias = &y == &x;
  Tensor& target = alias ? scratch(conv_tmp_) : y;
  if (!ensure(target, x.shape())) return;
  if (S == 0 || C == 0 || walking()) return;
  if (w.dtype == DType::kF32) {
    launch_overlapped(conv1d_kernel<float>, grid_for(S * C, 256), 256, 0, stream(), x.data(),
                      reinterpret_cast<const float*>(w.data), tail.data(), S, C, K, dilation, L,
                      target.data());
  } else {
    launch_overlapped(conv1d_kernel<bf16_bits>, grid_for(S * C, 256), 256, 0, stream(), x.data(),
                      reinterpret_cast<const bf16_bits*>(w.data), tail.data(), S, C, K, dilation, L,
                      target.data());
  }
  if (!launched(kOp)) return;
  if (L > 0) {
    launch_overlapped(conv_tail_kernel, grid_for(C, 256), 256, 0, stream(), x.data(), tail.data(),
                      S, C, L);
    if (!launched(kOp)) return;
  }
  if (alias) memory_->copy(y.raw(), target.raw(), y.bytes());
}

void CudaBackend::delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                             const Tensor& beta, std::int64_t key_heads, Tensor& state, Tensor& out,
                             Tensor* states, const char* op, bool chunks) {
  if (failed() || !on_device(op, {&q, &k, &v, &g, &beta, &state})) return;
  const auto S = k.rows(), Hv = beta.cols();
  if (!check(key_heads > 0 && Hv > 0 && Hv % key_heads == 0 && k.cols() % key_heads == 0 &&
                 v.cols() % Hv == 0 && q.numel() == k.numel() && v.rows() == S && g.rows() == S &&
                 beta.rows() == S,
             op, "q, k [S, Hk*dk], v [S, Hv*dv], beta [S, Hv] disagree"))
    return;
  const auto dk = k.cols() / key_heads, dv = v.cols() / Hv, rep = Hv / key_heads;
  const bool per_channel = g.cols() != Hv;
  if (!check(g.cols() == Hv || g.cols() == Hv * dk, op, "g must be [S, Hv] or [S, Hv*dk]")) return;
  if (!check(state.numel() == Hv * dk * dv, op, "state must be [Hv, dk, dv]")) return;
  if (!check(dk <= 32 * kDeltaGroups, op, "key head dim above 256")) return;
  if (!check(&out != &v, op, "out may not be v")) return;
  if (!ensure(out, v.shape())) return;
  if (states != nullptr && !ensure(*states, {S, state.numel()})) return;
  if (S == 0 || dv == 0) return;
  // A scalar decay (GDN) takes the chunks only from kScalarChunkTokens: on the H200 they were
  // slower than the token-by-token kernel at 512 tokens (540 vs 463 us at Qwen's 48 heads) and
  // 1.13x faster at 4,096 (bench/NOTES.md, 2026-12-02); a per-channel decay (KDA), whose token
  // kernel is slower, gained 1.6-1.8x at both.
  constexpr std::int64_t kScalarChunkTokens = 1024;
  if (chunks && (per_channel || S >= kScalarChunkTokens) &&
      delta_chunks_take(S, dk, dv, per_channel) && !env_flag("FLASHSERVE_CUDA_OLD_DELTA")) {
    delta_rule_chunks(q, k, v, g, beta, key_heads, state, out);
    return;
  }
  if (walking()) return;
  float* states_data = states != nullptr ? states->data() : nullptr;
  const dim3 grid(static_cast<unsigned>(Hv), grid_for(dv, kWarp));
  const dim3 threads(kWarp, kDeltaGroups);
  const auto rows = (dk + kDeltaGroups - 1) / kDeltaGroups;
  auto launch = [&](auto kernel) {
    launch_overlapped(kernel, grid, threads, 0, stream(), q.data(), k.data(), v.data(), g.data(),
                      beta.data(), S, Hv, dk, dv, rep, k.cols(), state.data(), out.data(),
                      states_data);
  };
  // Rows per thread rounded up to a power of two (a register array per thread).
  auto by_rows = [&](auto n) {
    constexpr int kN = decltype(n)::value;
    if (per_channel) {
      launch(delta_rule_kernel<kN, true>);
    } else {
      launch(delta_rule_kernel<kN, false>);
    }
  };
  if (rows <= 1) {
    by_rows(std::integral_constant<int, 1>{});
  } else if (rows <= 2) {
    by_rows(std::integral_constant<int, 2>{});
  } else if (rows <= 4) {
    by_rows(std::integral_constant<int, 4>{});
  } else if (rows <= 8) {
    by_rows(std::integral_constant<int, 8>{});
  } else if (rows <= 16) {
    by_rows(std::integral_constant<int, 16>{});
  } else {
    by_rows(std::integral_constant<int, 32>{});
  }
  launched(op);
}

void CudaBackend::gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& g, const Tensor& beta,
                                             std::int64_t key_heads, Tensor& state, Tensor& out) {
  delta_rule(q, k, v, g, beta, key_heads, state, out, nullptr, "gated_delta_rule_recurrent");
}

// The chunk kernels (cuda_delta_chunks.cu), or token by token where they do not apply (see
// cuda_backend.h): the same function.
void CudaBackend::gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& g, const Tensor& beta,
                                           std::int64_t key_heads, Tensor& state, Tensor& out) {
  delta_rule(q, k, v, g, beta, key_heads, state, out, nullptr, "gated_delta_rule_chunked", true);
}

void CudaBackend::gated_delta_rule_positions(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& g, const Tensor& beta,
                                             std::int64_t key_heads, Tensor& state, Tensor& out,
                                             Tensor& states) {
  delta_rule(q, k, v, g, beta, key_heads, state, out, &states, "gated_delta_rule_positions");
}

void CudaBackend::gated_delta_net_core(const Tensor& mixed, const Tensor& z, const Tensor& beta,
                                       const Tensor& g, std::int64_t key_heads,
                                       std::int64_t head_dim, const Weight& norm, float eps,
                                       Activation act, Tensor& state, Tensor& normed) {
  constexpr const char* kOp = "gated_delta_net_core";
  if (failed() || !on_device(kOp, {&mixed, &z, &beta, &g, &state})) return;
  const auto S = mixed.shape().empty() ? 0 : mixed.rows(),
             Hv = beta.shape().empty() ? 0 : beta.cols();
  const auto key_dim = key_heads * head_dim, value_dim = mixed.cols() - 2 * key_dim;
  const auto dv = Hv > 0 ? value_dim / Hv : 0;
  const bool fused =
      !env_flag("FLASHSERVE_CUDA_GDN_UNFUSED") && S == 1 && key_heads > 0 && head_dim > 0 &&
      head_dim <= 4 * kWarp && Hv % key_heads == 0 && value_dim > 0 && value_dim % Hv == 0 &&
      dv % kWarp == 0 && dv <= kCoreMaxTiles * kWarp && z.numel() == value_dim &&
      beta.rows() == 1 && g.rows() == 1 && g.cols() == Hv && norm.dtype == DType::kF32 &&
      !norm.block_scaled() && norm.numel() == dv && state.numel() == Hv * head_dim * dv &&
      &normed != &mixed && &normed != &z && &normed != &state;
  if (!fused) {
    Backend::gated_delta_net_core(mixed, z, beta, g, key_heads, head_dim, norm, eps, act, state,
                                  normed);
    return;
  }
  if (!on_device(kOp, norm) || !ensure(normed, {1, value_dim})) return;
  if (walking()) return;
  const dim3 threads(kWarp, kDeltaGroups, static_cast<unsigned>(dv / kWarp));
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  auto launch = [&](auto kernel) {
    launch_overlapped(kernel, static_cast<unsigned>(Hv), threads, 0, stream(), mixed.data(),
                      z.data(), beta.data(), g.data(), norm.f32(), Hv, head_dim, dv, Hv / key_heads,
                      key_dim, q_scale, eps, act, state.data(), normed.data());
  };
  const auto rows = (head_dim + kDeltaGroups - 1) / kDeltaGroups;
  if (rows <= 1) {
    launch(gdn_core_kernel<1>);
  } else if (rows <= 2) {
    launch(gdn_core_kernel<2>);
  } else if (rows <= 4) {
    launch(gdn_core_kernel<4>);
  } else if (rows <= 8) {
    launch(gdn_core_kernel<8>);
  } else {
    launch(gdn_core_kernel<16>);
  }
  launched(kOp);
}

}  // namespace fs::cuda
