// Ops that mix tokens: causal depthwise conv with its tail, the gated delta rule (chunked and
// recurrent), block-sparse softmax attention.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace fs {

void CpuBackend::causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation,
                               Tensor& tail, Tensor& y) {
  if (failed()) return;
  const auto S = x.rows(), C = x.cols(), K = w.cols();
  const auto L = (K - 1) * dilation;
  assert(tail.rows() == L && tail.cols() == C && w.rows() == C && w.device == Device::kHost);
  // The filter in f32 (read in place when it already is; a bf16 one is widened, exactly).
  std::vector<float> widened;
  const float* wf = w.f32();
  if (w.dtype != DType::kF32 || reinterpret_cast<std::uintptr_t>(w.data) % alignof(float) != 0) {
    widened.resize(static_cast<std::size_t>(C * K));
    convert_to_f32(w.dtype, w.data, widened.data(), widened.size());
    wf = widened.data();
  }
  // Window = tail ++ x: row t of the window is input position t - L.
  std::vector<float> win(static_cast<std::size_t>((L + S) * C));
  std::copy(tail.span().begin(), tail.span().end(), win.begin());
  std::copy(x.span().begin(), x.span().end(), win.begin() + L * C);
  if (!ensure(y, x.shape())) return;
  for (std::int64_t t = 0; t < S; ++t) {
    float* out = y.row(t);
    for (std::int64_t c = 0; c < C; ++c) {
      float acc = 0;
      for (std::int64_t j = 0; j < K; ++j)
        acc += wf[c * K + j] * win[static_cast<std::size_t>((t + j * dilation) * C + c)];
      out[c] = acc;
    }
  }
  std::copy(win.end() - L * C, win.end(), tail.data());
}

namespace {

struct HeadViews {
  std::int64_t S, Hv, dk, dv, rep;
};

HeadViews head_views(const Tensor& k, const Tensor& v, const Tensor& g, std::int64_t key_heads) {
  const auto Hv = g.cols();
  return {k.rows(), Hv, k.cols() / key_heads, v.cols() / Hv, Hv / key_heads};
}

}  // namespace

void CpuBackend::gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& g, const Tensor& beta,
                                            std::int64_t key_heads, Tensor& state, Tensor& out) {
  if (failed()) return;
  const auto d = head_views(k, v, g, key_heads);
  assert(state.numel() == d.Hv * d.dk * d.dv);
  if (!ensure(out, v.shape())) return;
  cpu_parallel_for(d.Hv, static_cast<double>(d.S * d.dk * d.dv * 4), [&](std::int64_t h) {
    float* Sm = state.data() + h * d.dk * d.dv;  // [dk, dv]
    const auto kh = h / d.rep;
    std::vector<float> delta(static_cast<std::size_t>(d.dv));
    for (std::int64_t t = 0; t < d.S; ++t) {
      const float* qt = q.row(t) + kh * d.dk;
      const float* kt = k.row(t) + kh * d.dk;
      const float* vt = v.row(t) + h * d.dv;
      const float decay = std::exp(g.row(t)[h]), b = beta.row(t)[h];
      for (std::int64_t i = 0; i < d.dk * d.dv; ++i) Sm[i] *= decay;
      // delta = (v - S^T k) * beta
      for (std::int64_t j = 0; j < d.dv; ++j) {
        float mem = 0;
        for (std::int64_t i = 0; i < d.dk; ++i) mem += Sm[i * d.dv + j] * kt[i];
        delta[static_cast<std::size_t>(j)] = (vt[j] - mem) * b;
      }
      for (std::int64_t i = 0; i < d.dk; ++i)
        for (std::int64_t j = 0; j < d.dv; ++j)
          Sm[i * d.dv + j] += kt[i] * delta[static_cast<std::size_t>(j)];
      float* ot = out.row(t) + h * d.dv;
      for (std::int64_t j = 0; j < d.dv; ++j) {
        float o = 0;
        for (std::int64_t i = 0; i < d.dk; ++i) o += Sm[i * d.dv + j] * qt[i];
        ot[j] = o;
      }
    }
  });
}

// The chunked (WY / UT-transform) form of the same recurrence (Q4M 263-396). Per chunk of C
// tokens with in-chunk cumulative log decay gc:
//   A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j), j < i;  (I + A) U = beta v;  (I + A) W = beta k
//   exp(gc) Vn = U - W S;  O_i = exp(gc_i) q_i S + sum_{j<=i} (q_i . k_j) exp(gc_i - gc_j) Vn_j S
//   <- exp(gc_last) S + sum_j exp(gc_last - gc_j) k_j Vn_j^T
// The last chunk is simply shorter (the reference's zero padding contributes nothing).
void CpuBackend::gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& g, const Tensor& beta,
                                          std::int64_t key_heads, Tensor& state, Tensor& out) {
  constexpr std::int64_t kChunk = 64;
  if (failed()) return;
  const auto d = head_views(k, v, g, key_heads);
  assert(state.numel() == d.Hv * d.dk * d.dv);
  if (!ensure(out, v.shape())) return;
  cpu_parallel_for(d.Hv, static_cast<double>(d.S * d.dk * d.dv * 8), [&](std::int64_t h) {
    float* Sm = state.data() + h * d.dk * d.dv;
    const auto kh = h / d.rep;
    const auto dk = d.dk, dv = d.dv;
    std::vector<float> gc(kChunk), A(kChunk * kChunk), U(kChunk * dv), W(kChunk * dk),
        Vn(kChunk * dv), Snew(dk * dv);
    for (std::int64_t c0 = 0; c0 < d.S; c0 += kChunk) {
      const auto C = std::min(kChunk, d.S - c0);
      auto kr = [&](std::int64_t i) { return k.row(c0 + i) + kh * dk; };
      auto qr = [&](std::int64_t i) { return q.row(c0 + i) + kh * dk; };
      auto vr = [&](std::int64_t i) { return v.row(c0 + i) + h * dv; };
      auto br = [&](std::int64_t i) { return beta.row(c0 + i)[h]; };
      float acc = 0;
      for (std::int64_t i = 0; i < C; ++i)
        gc[static_cast<std::size_t>(i)] = (acc += g.row(c0 + i)[h]);
      auto dot = [&](const float* a, const float* b) {
        float s = 0;
        for (std::int64_t x = 0; x < dk; ++x) s += a[x] * b[x];
        return s;
      };
      for (std::int64_t i = 0; i < C; ++i)
        for (std::int64_t j = 0; j < i; ++j)
          A[static_cast<std::size_t>(i * kChunk + j)] =
              br(i) * dot(kr(i), kr(j)) *
              std::exp(gc[static_cast<std::size_t>(i)] - gc[static_cast<std::size_t>(j)]);
      // Forward substitution for the unit lower-triangular system.
      for (std::int64_t i = 0; i < C; ++i) {
        float* Ui = &U[static_cast<std::size_t>(i * dv)];
        float* Wi = &W[static_cast<std::size_t>(i * dk)];
        const float eg = std::exp(gc[static_cast<std::size_t>(i)]);
        for (std::int64_t x = 0; x < dv; ++x) Ui[x] = br(i) * vr(i)[x];
        for (std::int64_t x = 0; x < dk; ++x) Wi[x] = br(i) * kr(i)[x] * eg;
        for (std::int64_t j = 0; j < i; ++j) {
          const float a = A[static_cast<std::size_t>(i * kChunk + j)];
          for (std::int64_t x = 0; x < dv; ++x)
            Ui[x] -= a * U[static_cast<std::size_t>(j * dv + x)];
          for (std::int64_t x = 0; x < dk; ++x)
            Wi[x] -= a * W[static_cast<std::size_t>(j * dk + x)];
        }
      }
      // Vn = U - W S
      for (std::int64_t i = 0; i < C; ++i)
        for (std::int64_t x = 0; x < dv; ++x) {
          float s = U[static_cast<std::size_t>(i * dv + x)];
          for (std::int64_t y = 0; y < dk; ++y)
            s -= W[static_cast<std::size_t>(i * dk + y)] * Sm[y * dv + x];
          Vn[static_cast<std::size_t>(i * dv + x)] = s;
        }
      // Outputs.
      for (std::int64_t i = 0; i < C; ++i) {
        float* o = out.row(c0 + i) + h * dv;
        const float eg = std::exp(gc[static_cast<std::size_t>(i)]);
        for (std::int64_t x = 0; x < dv; ++x) {
          float s = 0;
          for (std::int64_t y = 0; y < dk; ++y) s += qr(i)[y] * Sm[y * dv + x];
          o[x] = s * eg;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const float a = dot(qr(i), kr(j)) * std::exp(gc[static_cast<std::size_t>(i)] -
                                                       gc[static_cast<std::size_t>(j)]);
          for (std::int64_t x = 0; x < dv; ++x)
            o[x] += a * Vn[static_cast<std::size_t>(j * dv + x)];
        }
      }
      // State update.
      const float glast = gc[static_cast<std::size_t>(C - 1)];
      const float elast = std::exp(glast);
      for (std::int64_t y = 0; y < dk * dv; ++y) Snew[static_cast<std::size_t>(y)] = Sm[y] * elast;
      for (std::int64_t j = 0; j < C; ++j) {
        const float e = std::exp(glast - gc[static_cast<std::size_t>(j)]);
        for (std::int64_t y = 0; y < dk; ++y) {
          const float kv = kr(j)[y] * e;
          for (std::int64_t x = 0; x < dv; ++x)
            Snew[static_cast<std::size_t>(y * dv + x)] +=
                kv * Vn[static_cast<std::size_t>(j * dv + x)];
        }
      }
      std::copy(Snew.begin(), Snew.end(), Sm);
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
  cpu_parallel_for(S * heads, static_cast<double>(keys.size() * heads * D * 2),
                   [&](std::int64_t job) {
                     const auto s = job / heads, h = job % heads, kvh = h / rep;
                     const auto b = offsets[static_cast<std::size_t>(s)];
                     const auto n = offsets[static_cast<std::size_t>(s) + 1] - b;
                     std::vector<float> p(static_cast<std::size_t>(n));
                     const float* qs = q.row(s) + h * D;
                     float m = -INFINITY;
                     for (std::int64_t i = 0; i < n; ++i) {
                       const float* ks = k.row(keys[static_cast<std::size_t>(b + i)]) + kvh * D;
                       float d = 0;
                       for (std::int64_t x = 0; x < D; ++x) d += qs[x] * ks[x];
                       p[static_cast<std::size_t>(i)] = d * scale;
                       m = std::max(m, d * scale);
                     }
                     double z = 0;
                     for (auto& e : p) z += (e = std::exp(e - m));
                     float* o = out.row(s) + h * D;
                     std::fill(o, o + D, 0.0f);
                     for (std::int64_t i = 0; i < n; ++i) {
                       const float w = static_cast<float>(p[static_cast<std::size_t>(i)] / z);
                       const float* vs = v.row(keys[static_cast<std::size_t>(b + i)]) + kvh * D;
                       for (std::int64_t x = 0; x < D; ++x) o[x] += w * vs[x];
                     }
                   });
}

}  // namespace fs
