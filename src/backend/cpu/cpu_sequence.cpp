// Ops that mix tokens: causal depthwise conv with its tail, the gated delta rule (chunked and
// recurrent), block-sparse softmax attention.
#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace fs {

void CpuBackend::causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation,
                               Tensor& tail, Tensor& y) {
  if (failed() || !check_elements(w, "causal_conv1d")) return;
  const auto S = x.rows(), C = x.cols(), K = w.cols();
  const auto L = (K - 1) * dilation;
  assert(tail.rows() == L && tail.cols() == C && w.rows() == C && w.device == Device::kHost);
  // The filter widened to f32 and transposed to [K, C], so each tap is a row over the channels.
  std::vector<float> wf(static_cast<std::size_t>(C * K));
  {
    std::vector<float> widened(static_cast<std::size_t>(C * K));
    convert_to_f32(w.dtype, w.data, widened.data(), widened.size());
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t j = 0; j < K; ++j)
        wf[static_cast<std::size_t>(j * C + c)] = widened[static_cast<std::size_t>(c * K + j)];
  }
  // Window = tail ++ x: row t of the window is input position t - L.
  std::vector<float> win(static_cast<std::size_t>((L + S) * C));
  std::copy(tail.span().begin(), tail.span().end(), win.begin());
  std::copy(x.span().begin(), x.span().end(), win.begin() + L * C);
  if (!ensure(y, x.shape())) return;
  cpu_parallel_ranges(
      S, 2.0 * static_cast<double>(S * C * K), [&](std::int64_t t0, std::int64_t t1) {
        cpu::causal_conv_rows(win.data() + t0 * C, wf.data(), C, K, dilation, t1 - t0, y.row(t0));
      });
  std::copy(win.end() - L * C, win.end(), tail.data());
}

namespace {

// The heads of a delta rule call: value heads from beta [S, Hv]; the decay g is [S, Hv] (one per
// head, GDN) or [S, Hv*dk] (one per key channel, KDA).
struct HeadViews {
  std::int64_t S, Hv, dk, dv, rep;
  bool per_channel;
};

HeadViews head_views(const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     std::int64_t key_heads) {
  const auto Hv = beta.cols(), dk = k.cols() / key_heads;
  return {k.rows(), Hv, dk, v.cols() / Hv, Hv / key_heads, g.cols() != Hv};
}

// Value head h's view of the call's tensors.
cpu::DeltaRuleHead head_of(const HeadViews& d, std::int64_t h, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& out) {
  const auto kh = h / d.rep;
  return {q.data() + kh * d.dk,
          k.data() + kh * d.dk,
          v.data() + h * d.dv,
          g.data() + (d.per_channel ? h * d.dk : h),
          beta.data() + h,
          q.cols(),
          k.cols(),
          v.cols(),
          g.cols(),
          beta.cols(),
          out.data() + h * d.dv,
          out.cols(),
          d.S,
          d.dk,
          d.dv,
          d.per_channel ? 1 : 0};
}

}  // namespace

void CpuBackend::gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& g, const Tensor& beta,
                                            std::int64_t key_heads, Tensor& state, Tensor& out) {
  if (failed()) return;
  const auto d = head_views(k, v, g, beta, key_heads);
  assert(state.numel() == d.Hv * d.dk * d.dv && g.cols() == (d.per_channel ? d.Hv * d.dk : d.Hv));
  if (!ensure(out, v.shape())) return;
  cpu_parallel_for(d.Hv, static_cast<double>(d.S * d.dk * d.dv * 7), [&](std::int64_t h) {
    cpu::delta_rule_recurrent_head(head_of(d, h, q, k, v, g, beta, out),
                                   state.data() + h * d.dk * d.dv);
  });
}

namespace {

using cpu::DeltaRuleHead;

int i32(std::int64_t v) {
  return static_cast<int>(v);
}

// Per chunk of C tokens with in-chunk cumulative log decay gc (Q4M 263-396), every step but the
// decay factors and one small triangular inverse a BLAS product:
//   A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j) for j < i;  T = (I + A)^-1
//   [U | W] = T [beta v | beta exp(gc) k]
//   Vn = U - W S
//   O = diag(exp(gc)) Q S + (Q K^T o D) Vn,  D[i][j] = exp(gc_i - gc_j) for j <= i, else 0
//   S <- exp(gc_last) S + (diag(exp(gc_last - gc)) K)^T Vn
// The last chunk is simply shorter (the reference's zero padding contributes nothing).
void delta_rule_chunks(const DeltaRuleHead& h, float* state) {
  constexpr std::int64_t Cm = 64;
  const auto dk = h.dk, dv = h.dv, ldr = dv + dk;
  thread_local std::vector<float> scratch;
  const auto need = static_cast<std::size_t>(3 * Cm * Cm + 2 * Cm * ldr + Cm * dk + 3 * Cm);
  if (scratch.size() < need) scratch.resize(need);
  float* KK = scratch.data();  // [C][Cm]: k_i . k_j, then A
  float* QK = KK + Cm * Cm;    // [C][Cm]: q_i . k_j, then (Q K^T o D)
  float* T = QK + Cm * Cm;     // [Cm][Cm]: (I + A)^-1
  float* B = T + Cm * Cm;      // [C][dv + dk]: [beta v | beta exp(gc) k]
  float* R = B + Cm * ldr;     // [C][dv + dk]: [U | W], then [Vn | W]
  float* Kd = R + Cm * ldr;    // [C][dk]: k_j exp(gc_last - gc_j)
  float* gc = Kd + Cm * dk;    // [C]
  float* eg = gc + Cm;         // [C]: exp(gc)
  float* dec = eg + Cm;        // [C]: exp(gc_i - gc_j) for one row i
  for (std::int64_t c0 = 0; c0 < h.tokens; c0 += Cm) {
    const auto C = std::min(Cm, h.tokens - c0);
    const float* K = h.k + c0 * h.ldk;
    const float* Q = h.q + c0 * h.ldq;
    float* O = h.out + c0 * h.ldo;
    float acc = 0;
    for (std::int64_t i = 0; i < C; ++i) {
      gc[i] = (acc += h.g[(c0 + i) * h.ldg]);  // gstep 0: one decay per head
      eg[i] = std::exp(gc[i]);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(C), i32(C), i32(dk), 1.0f, K,
                i32(h.ldk), K, i32(h.ldk), 0.0f, KK, i32(Cm));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(C), i32(C), i32(dk), 1.0f, Q,
                i32(h.ldq), K, i32(h.ldk), 0.0f, QK, i32(Cm));
    for (std::int64_t i = 0; i < C; ++i) {
      const float b = h.beta[(c0 + i) * h.ldb];
      float* kk = KK + i * Cm;
      float* qk = QK + i * Cm;
      cpu::exp_diff(gc[i], gc, dec, i + 1);
      for (std::int64_t j = 0; j <= i; ++j) {
        kk[j] = b * kk[j] * dec[j];  // the diagonal is not read (unit)
        qk[j] *= dec[j];
      }
      for (std::int64_t j = i + 1; j < C; ++j) qk[j] = 0.0f;
      float* r = B + i * ldr;
      const float* vt = h.v + (c0 + i) * h.ldv;
      const float* kt = K + i * h.ldk;
      for (std::int64_t x = 0; x < dv; ++x) r[x] = b * vt[x];
      const float bw = b * eg[i];
      for (std::int64_t x = 0; x < dk; ++x) r[dv + x] = bw * kt[x];
    }
    cpu::unit_lower_inverse64(KK, C, T);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(ldr), i32(C), 1.0f, T,
                i32(Cm), B, i32(ldr), 0.0f, R, i32(ldr));
    // Vn = U - W S, in place of U.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(dv), i32(dk), -1.0f, R + dv,
                i32(ldr), state, i32(dv), 1.0f, R, i32(ldr));
    // O = diag(exp(gc)) Q S + (Q K^T o D) Vn.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(dv), i32(dk), 1.0f, Q,
                i32(h.ldq), state, i32(dv), 0.0f, O, i32(h.ldo));
    for (std::int64_t i = 0; i < C; ++i)
      for (std::int64_t x = 0; x < dv; ++x) O[i * h.ldo + x] *= eg[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(dv), i32(C), 1.0f, QK,
                i32(Cm), R, i32(ldr), 1.0f, O, i32(h.ldo));
    // S <- exp(gc_last) S + Kd^T Vn.
    const float glast = gc[C - 1];
    cpu::exp_diff(glast, gc, dec, C);
    for (std::int64_t j = 0; j < C; ++j)
      for (std::int64_t y = 0; y < dk; ++y) Kd[j * dk + y] = K[j * h.ldk + y] * dec[j];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i32(dk), i32(dv), i32(C), 1.0f, Kd,
                i32(dk), R, i32(ldr), eg[C - 1], state, i32(dv));
  }
}

// The chunked form for a per-channel decay (KDA; HF M:483-581), G the chunk's cumulative log
// decay per key channel, G_i[x] = sum over t <= i of g_t[x]:
//   A[i][j] = beta_i sum_x k_i[x] k_j[x] exp(G_i[x] - G_j[x]) for j < i;  T = (I + A)^-1
//   QK[i][j] = sum_x q_i[x] k_j[x] exp(G_i[x] - G_j[x]) for j <= i, else 0
//   [U | W] = T [beta v | beta (k o exp(G))]
//   Vn = U - W S;  O = (Q o exp(G)) S + QK Vn
//   S <- diag(exp(G_last)) S + (K o exp(G_last - G))^T Vn
// The decay does not factor out of the dot products as a scalar does, and splitting
// exp(G_i - G_j) into exp(G_i) exp(-G_j) overflows (G falls to -320 over a chunk at GLM's bound
// of -5 per token). So the rows are taken in sub-chunks of 16 relative to the sub-chunk's first
// row r (as FLA's chunk_kda does): for j < r, exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j),
// both factors <= 1 for a log decay <= 0, and the sub-chunk's rows against all earlier ones are
// one BLAS product; pairs inside a sub-chunk take exp(G_i - G_j) as it is. No positive exponent
// is ever formed.
void delta_rule_chunks_per_channel(const DeltaRuleHead& h, float* state) {
  constexpr std::int64_t Cm = 64, Cs = 16;
  const auto dk = h.dk, dv = h.dv, ldr = dv + dk;
  thread_local std::vector<float> scratch;
  const auto need =
      static_cast<std::size_t>(3 * Cm * Cm + 2 * Cm * ldr + 3 * Cm * dk + 4 * Cs * dk);
  if (scratch.size() < need) scratch.resize(need);
  float* KK = scratch.data();  // [C][Cm]: A before beta
  float* QK = KK + Cm * Cm;    // [C][Cm]
  float* T = QK + Cm * Cm;     // [Cm][Cm]: (I + A)^-1
  float* B = T + Cm * Cm;      // [C][dv + dk]: [beta v | beta k o exp(G)]
  float* R = B + Cm * ldr;     // [C][dv + dk]: [U | W], then [Vn | W]
  float* G = R + Cm * ldr;     // [C][dk]
  float* Kr = G + Cm * dk;     // [C][dk]: k_j exp(G_r - G_j), later k_j exp(G_last - G_j)
  float* Qe = Kr + Cm * dk;    // [C][dk]: q_i exp(G_i)
  float* Kl = Qe + Cm * dk;    // [Cs][dk]: k_i exp(G_i - G_r), then k_i exp(G_i - G_j)
  float* Ql = Kl + Cs * dk;    // [Cs][dk]: q_i exp(G_i - G_r), then q_i exp(G_i - G_j)
  for (std::int64_t c0 = 0; c0 < h.tokens; c0 += Cm) {
    const auto C = std::min(Cm, h.tokens - c0);
    const float* K = h.k + c0 * h.ldk;
    const float* Q = h.q + c0 * h.ldq;
    float* O = h.out + c0 * h.ldo;
    std::copy_n(h.g + c0 * h.ldg, dk, G);
    for (std::int64_t i = 1; i < C; ++i) {
      const float* gt = h.g + (c0 + i) * h.ldg;
      for (std::int64_t x = 0; x < dk; ++x) G[i * dk + x] = G[(i - 1) * dk + x] + gt[x];
    }
    for (std::int64_t r = 0; r < C; r += Cs) {
      const auto n = std::min(Cs, C - r);
      if (r > 0) {
        for (std::int64_t j = 0; j < r; ++j)
          cpu::mul_exp_diff(K + j * h.ldk, G + r * dk, G + j * dk, Kr + j * dk, dk);
        for (std::int64_t i = 0; i < n; ++i) {
          cpu::mul_exp_diff(K + (r + i) * h.ldk, G + (r + i) * dk, G + r * dk, Kl + i * dk, dk);
          cpu::mul_exp_diff(Q + (r + i) * h.ldq, G + (r + i) * dk, G + r * dk, Ql + i * dk, dk);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(n), i32(r), i32(dk), 1.0f, Kl,
                    i32(dk), Kr, i32(dk), 0.0f, KK + r * Cm, i32(Cm));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(n), i32(r), i32(dk), 1.0f, Ql,
                    i32(dk), Kr, i32(dk), 0.0f, QK + r * Cm, i32(Cm));
      }
      // Column j of the sub-chunk's own pairs: rows i >= j against k_j.
      for (auto j = r; j < r + n; ++j) {
        const auto m = r + n - j;
        for (std::int64_t i = 0; i < m; ++i) {
          cpu::mul_exp_diff(K + (j + i) * h.ldk, G + (j + i) * dk, G + j * dk, Kl + i * dk, dk);
          cpu::mul_exp_diff(Q + (j + i) * h.ldq, G + (j + i) * dk, G + j * dk, Ql + i * dk, dk);
        }
        cblas_sgemv(CblasRowMajor, CblasNoTrans, i32(m), i32(dk), 1.0f, Kl, i32(dk), K + j * h.ldk,
                    1, 0.0f, KK + j * Cm + j, i32(Cm));
        cblas_sgemv(CblasRowMajor, CblasNoTrans, i32(m), i32(dk), 1.0f, Ql, i32(dk), K + j * h.ldk,
                    1, 0.0f, QK + j * Cm + j, i32(Cm));
      }
    }
    for (std::int64_t i = 0; i < C; ++i) {
      const float b = h.beta[(c0 + i) * h.ldb];
      float* kk = KK + i * Cm;
      for (std::int64_t j = 0; j < i; ++j) kk[j] *= b;  // the diagonal is not read (unit)
      std::fill(QK + i * Cm + i + 1, QK + i * Cm + C, 0.0f);
      float* row = B + i * ldr;
      const float* vt = h.v + (c0 + i) * h.ldv;
      for (std::int64_t x = 0; x < dv; ++x) row[x] = b * vt[x];
      cpu::mul_exp_diff(K + i * h.ldk, G + i * dk, nullptr, row + dv, dk);
      for (std::int64_t x = 0; x < dk; ++x) row[dv + x] *= b;
      cpu::mul_exp_diff(Q + i * h.ldq, G + i * dk, nullptr, Qe + i * dk, dk);
    }
    cpu::unit_lower_inverse64(KK, C, T);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(ldr), i32(C), 1.0f, T,
                i32(Cm), B, i32(ldr), 0.0f, R, i32(ldr));
    // Vn = U - W S, in place of U.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(dv), i32(dk), -1.0f, R + dv,
                i32(ldr), state, i32(dv), 1.0f, R, i32(ldr));
    // O = (Q o exp(G)) S + QK Vn.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(dv), i32(dk), 1.0f, Qe,
                i32(dk), state, i32(dv), 0.0f, O, i32(h.ldo));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(C), i32(dv), i32(C), 1.0f, QK,
                i32(Cm), R, i32(ldr), 1.0f, O, i32(h.ldo));
    // S <- diag(exp(G_last)) S + (K o exp(G_last - G))^T Vn.
    const float* Gl = G + (C - 1) * dk;
    for (std::int64_t x = 0; x < dk; ++x) {
      const float e = std::exp(Gl[x]);
      for (std::int64_t y = 0; y < dv; ++y) state[x * dv + y] *= e;
    }
    for (std::int64_t j = 0; j < C; ++j)
      cpu::mul_exp_diff(K + j * h.ldk, Gl, G + j * dk, Kr + j * dk, dk);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i32(dk), i32(dv), i32(C), 1.0f, Kr,
                i32(dk), R, i32(ldr), 1.0f, state, i32(dv));
  }
}

// Which form computes a head faster on a CPU. The chunk form's products carry C*(dk + dv) work
// per token beside the recurrence's ~7*dk*dv, and the recurrence's state tile stays in L1 while
// it is small: measured on the 2-core development VM (S = 512, 8 heads, per call), dk = dv = 32:
// recurrence 0.5-1 ms, chunks 3.6 ms; 64: 3.8 vs 5.5 ms; 128: 26-31 vs 21 ms. KDA's chunk form
// (with its per-channel exps) the same way on a loaded VM: 128 x 128 about 3.4x and 64 x 128
// about 3x faster than the recurrence, so the same rule serves both decays.
bool recurrence_is_cheaper(std::int64_t dk, std::int64_t dv) {
  return dk * dv <= 64 * 64;
}

}  // namespace

// The chunked (WY / UT-transform) form of the same recurrence, one value head per job, or the
// recurrence itself where it is the cheaper way to the same function (see above).
void CpuBackend::gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& g, const Tensor& beta,
                                          std::int64_t key_heads, Tensor& state, Tensor& out) {
  if (failed()) return;
  const auto d = head_views(k, v, g, beta, key_heads);
  assert(state.numel() == d.Hv * d.dk * d.dv && g.cols() == (d.per_channel ? d.Hv * d.dk : d.Hv));
  if (!ensure(out, v.shape())) return;
  if (d.S == 0) return;
  cpu_parallel_for(d.Hv, static_cast<double>(d.S * d.dk * d.dv * 8), [&](std::int64_t h) {
    const auto head = head_of(d, h, q, k, v, g, beta, out);
    float* st = state.data() + h * d.dk * d.dv;
    if (recurrence_is_cheaper(d.dk, d.dv)) {
      cpu::delta_rule_recurrent_head(head, st);
    } else if (d.per_channel) {
      delta_rule_chunks_per_channel(head, st);
    } else {
      delta_rule_chunks(head, st);
    }
  });
}

// Query s reads the keys of its picked blocks in the order given, then its unfinished tail; the
// keys are listed first (as the old key-selection form did), so the scores, the softmax and the
// weighted sum run over the same keys in the same order.
void CpuBackend::block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        std::int64_t heads, std::int64_t kv_heads,
                                        const Tensor& picked, std::int64_t block,
                                        std::int64_t first, float scale, Tensor& out) {
  if (failed()) return;
  const auto D = q.cols() / heads, rep = heads / kv_heads, S = q.rows();
  assert(picked.dtype() == DType::kI32 && picked.rows() == S && k.rows() == v.rows());
  assert(k.cols() == kv_heads * D && v.cols() == kv_heads * D);
  if (!ensure(out, q.shape())) return;
  const auto top = picked.cols();
  const auto* pk = picked.data_as<std::int32_t>();
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(S + 1), 0);
  std::vector<std::int32_t> keys;
  for (std::int64_t s = 0; s < S; ++s) {
    for (std::int64_t j = 0; j < top; ++j) {
      const auto b = pk[s * top + j];
      if (b < 0) continue;
      for (std::int64_t t = 0; t < block; ++t)
        keys.push_back(static_cast<std::int32_t>(b * block + t));
    }
    const auto pos = first + s;
    for (auto t = (pos + 1) / block * block; t <= pos; ++t)
      keys.push_back(static_cast<std::int32_t>(t));
    offsets[static_cast<std::size_t>(s + 1)] = static_cast<std::int64_t>(keys.size());
  }
  assert(keys.empty() || *std::max_element(keys.begin(), keys.end()) < k.rows());
  // One job per (query, kv head): its `rep` query heads share the gathered keys.
  cpu_parallel_for(S * kv_heads, static_cast<double>(keys.size() * heads * D * 4),
                   [&](std::int64_t job) {
                     const auto s = job / kv_heads, kvh = job % kv_heads;
                     const auto b = offsets[static_cast<std::size_t>(s)];
                     const auto n = offsets[static_cast<std::size_t>(s) + 1] - b;
                     cpu::attention_heads(q.row(s) + kvh * rep * D, rep, D, k.data() + kvh * D,
                                          v.data() + kvh * D, k.cols(), keys.data() + b, n, scale,
                                          out.row(s) + kvh * rep * D);
                   });
}

}  // namespace fs
