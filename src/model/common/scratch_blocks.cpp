// SCRATCH (uncommitted): see mhc.h.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>
#include "model/common/mhc.h"
namespace fs {
namespace {
std::vector<float> wf(const Weight& w) {
  std::vector<float> v(static_cast<std::size_t>(w.numel()));
  convert_to_f32(w.dtype, w.data, v.data(), v.size());
  return v;
}
}  // namespace
void mhc_read(Backend& be, const MhcWeights& w, const Tensor& h, Tensor& collapsed, MhcMix& mix) {
  const auto S = h.rows(), H = w.streams, D = w.width, M = (2 + H) * H;
  const auto fn = wf(w.fn), base = wf(w.base), sc = wf(w.scale);
  collapsed = be.new_tensor({S, D});
  mix.post = be.new_tensor({S, H});
  mix.comb = be.new_tensor({S, H * H});
  for (std::int64_t s = 0; s < S; ++s) {
    const float* z = h.row(s);
    double ss = 0;
    for (std::int64_t c = 0; c < H * D; ++c) ss += double(z[c]) * z[c];
    const double r = 1.0 / std::sqrt(ss / double(H * D) + w.norm_eps);
    std::vector<double> m(M, 0.0);
    for (std::int64_t j = 0; j < M; ++j) {
      double a = 0;
      for (std::int64_t c = 0; c < H * D; ++c) a += z[c] * r * fn[j * H * D + c];
      m[j] = a;
    }
    std::vector<double> pre(H);
    for (std::int64_t i = 0; i < H; ++i) {
      pre[i] = 1.0 / (1.0 + std::exp(-(m[i] * sc[0] + base[i]))) + w.hc_eps;
      mix.post.row(s)[i] = float(2.0 / (1.0 + std::exp(-(m[H + i] * sc[1] + base[H + i]))));
    }
    std::vector<double> C(H * H);
    for (std::int64_t i = 0; i < H; ++i) {
      double mx = -1e300;
      for (std::int64_t j = 0; j < H; ++j) {
        C[i * H + j] = m[2 * H + i * H + j] * sc[2] + base[2 * H + i * H + j];
        mx = std::max(mx, C[i * H + j]);
      }
      double z2 = 0;
      for (std::int64_t j = 0; j < H; ++j) z2 += (C[i * H + j] = std::exp(C[i * H + j] - mx));
      for (std::int64_t j = 0; j < H; ++j) C[i * H + j] = C[i * H + j] / z2 + w.hc_eps;
    }
    auto colnorm = [&] {
      for (std::int64_t j = 0; j < H; ++j) {
        double t = 0;
        for (std::int64_t i = 0; i < H; ++i) t += C[i * H + j];
        for (std::int64_t i = 0; i < H; ++i) C[i * H + j] /= (t + w.hc_eps);
      }
    };
    auto rownorm = [&] {
      for (std::int64_t i = 0; i < H; ++i) {
        double t = 0;
        for (std::int64_t j = 0; j < H; ++j) t += C[i * H + j];
        for (std::int64_t j = 0; j < H; ++j) C[i * H + j] /= (t + w.hc_eps);
      }
    };
    colnorm();
    for (std::int64_t it = 0; it < w.sinkhorn_iters - 1; ++it) rownorm(), colnorm();
    for (std::int64_t i = 0; i < H * H; ++i) mix.comb.row(s)[i] = float(C[i]);
    for (std::int64_t d = 0; d < D; ++d) {
      double a = 0;
      for (std::int64_t i = 0; i < H; ++i) a += pre[i] * z[i * D + d];
      collapsed.row(s)[d] = float(a);
    }
  }
}
void mhc_write(Backend&, const MhcMix& mix, const Tensor& y, Tensor& h) {
  const auto S = h.rows(), H = mix.post.cols(), D = y.cols();
  std::vector<float> old(static_cast<std::size_t>(H * D));
  for (std::int64_t s = 0; s < S; ++s) {
    std::copy(h.row(s), h.row(s) + H * D, old.begin());
    for (std::int64_t k = 0; k < H; ++k)
      for (std::int64_t d = 0; d < D; ++d) {
        double a = double(mix.post.row(s)[k]) * y.row(s)[d];
        for (std::int64_t j = 0; j < H; ++j)
          a += double(mix.comb.row(s)[j * H + k]) * old[j * D + d];
        h.row(s)[k * D + d] = float(a);
      }
  }
}
namespace {
void mlp_rows(const float* g, const float* u, const float* dn, std::int64_t I, std::int64_t Hd,
              float L, const float* x, double wgt, double* out) {
  std::vector<double> hh(I);
  for (std::int64_t i = 0; i < I; ++i) {
    double a = 0, b = 0;
    for (std::int64_t c = 0; c < Hd; ++c)
      a += double(g[i * Hd + c]) * x[c], b += double(u[i * Hd + c]) * x[c];
    if (L > 0) a = std::min<double>(a, L), b = std::clamp<double>(b, -L, L);
    hh[i] = a / (1 + std::exp(-a)) * b;
  }
  for (std::int64_t d = 0; d < Hd; ++d) {
    double a = 0;
    for (std::int64_t i = 0; i < I; ++i) a += double(dn[d * I + i]) * hh[i];
    out[d] += wgt * a;
  }
}
}  // namespace
void swiglu_mlp(Backend& be, const SwigluMlpWeights& w, const Tensor& x, Tensor& y) {
  const auto S = x.rows(), Hd = x.cols(), I = w.gate.rows();
  const auto g = wf(w.gate), u = wf(w.up), dn = wf(w.down);
  Tensor out = be.new_tensor({S, Hd});
  for (std::int64_t s = 0; s < S; ++s) {
    std::vector<double> o(Hd, 0.0);
    mlp_rows(g.data(), u.data(), dn.data(), I, Hd, w.swiglu_limit, x.row(s), 1.0, o.data());
    for (std::int64_t d = 0; d < Hd; ++d) out.row(s)[d] = float(o[d]);
  }
  y = std::move(out);
}
void clamped_moe(Backend& be, const ClampedMoeWeights& w, const Tensor& x, const Tensor*,
                 Tensor& y) {
  const auto S = x.rows(), Hd = x.cols(), E = w.router.experts, K = w.router.top_k;
  const auto gate = wf(w.router.gate), bias = wf(w.router.selection_bias), gu = wf(w.gate_up),
             dn = wf(w.down);
  const auto I = w.gate_up.shape[1] / 2;
  const auto sg = wf(w.shared.gate), su = wf(w.shared.up), sd = wf(w.shared.down);
  Tensor out = be.new_tensor({S, Hd});
  for (std::int64_t s = 0; s < S; ++s) {
    std::vector<double> sc(E), ch(E);
    for (std::int64_t e = 0; e < E; ++e) {
      double a = 0;
      for (std::int64_t c = 0; c < Hd; ++c) a += double(gate[e * Hd + c]) * x.row(s)[c];
      sc[e] = 1.0 / (1.0 + std::exp(-a));
      ch[e] = sc[e] + (bias.empty() ? 0.0 : bias[e]);
    }
    std::vector<int> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return ch[a] > ch[b]; });
    double tot = 0;
    for (std::int64_t j = 0; j < K; ++j) tot += sc[idx[j]];
    std::vector<double> o(Hd, 0.0);
    for (std::int64_t j = 0; j < K; ++j) {
      const int e = idx[j];
      double wgt = sc[e];
      if (w.router.normalize) wgt /= (tot + 1e-20);
      wgt *= w.router.routed_scaling;
      const float* base = gu.data() + e * 2 * I * Hd;
      mlp_rows(base, base + I * Hd, dn.data() + e * Hd * I, I, Hd, w.swiglu_limit, x.row(s), wgt,
               o.data());
    }
    mlp_rows(sg.data(), su.data(), sd.data(), w.shared.gate.rows(), Hd, w.shared.swiglu_limit,
             x.row(s), 1.0, o.data());
    for (std::int64_t d = 0; d < Hd; ++d) out.row(s)[d] = float(o[d]);
  }
  y = std::move(out);
}
}  // namespace fs
