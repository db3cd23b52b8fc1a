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
    float decay = 0;
    if constexpr (!kPerChannel) decay = expf(g[t * Hv + h]);
    float kr[kRows];
    float mem = 0;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const std::int64_t i = grp + kDeltaGroups * m;
      kr[m] = i < dk ? kt[i] : 0.0f;
      if constexpr (kPerChannel) {
        st[m] *= i < dk ? expf(g[(t * Hv + h) * dk + i]) : 0.0f;
      } else {
        st[m] *= decay;
      }
      mem += st[m] * kr[m];
    }
    part[0][grp][lane] = mem;
    __syncthreads();
    float total = 0;
#pragma unroll
    for (int gi = 0; gi < kDeltaGroups; ++gi) total += part[0][gi][lane];
    const float vj = col ? v[t * v_stride + h * dv + j] : 0.0f;
    const float delta = (vj - total) * b;
    float o = 0;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const std::int64_t i = grp + kDeltaGroups * m;
      st[m] += kr[m] * delta;
      o += st[m] * (i < dk ? qt[i] : 0.0f);
    }
    part[1][grp][lane] = o;
    __syncthreads();
    if (grp == 0 && col) {
      float ot = 0;
#pragma unroll
      for (int gi = 0; gi < kDeltaGroups; ++gi) ot += part[1][gi][lane];
      out[t * v_stride + h * dv + j] = ot;
    }
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
  if (chunks && delta_chunks_take(S, dk, dv) && (per_channel || S >= kScalarChunkTokens) &&
      !env_flag("FLASHSERVE_CUDA_OLD_DELTA")) {
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

}  // namespace fs::cuda
