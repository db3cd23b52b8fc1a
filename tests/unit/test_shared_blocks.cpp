// The blocks DeepSeek V4 and GLM 5.3 share (model/common/mhc.h, router.h, moe.h) on the CPU
// backend, against the reference formulas computed here directly in double, in the order the HF
// modules write them (modeling_deepseek_v4.py 867-1094, modeling_glm5_next.py 87-303): the
// unweighted RMSNorm before the mix product, the Sinkhorn loop, the group-limited top-k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "model/common/mhc.h"
#include "model/common/moe.h"
#include "model/common/router.h"

namespace fs {
namespace {

std::vector<float> uniform(std::size_t n, std::mt19937& g, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

Weight f32(const std::vector<float>& v, Shape shape) {
  return {DType::kF32, std::move(shape), reinterpret_cast<const std::uint8_t*>(v.data())};
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

// HF's mHC mapping for one token: flat = h / rms(h); logits = flat · fn^T; then pre, post, comb.
struct Mix {
  std::vector<double> pre, post, comb;
};
Mix reference_mix(const float* h, const std::vector<float>& fn, const std::vector<float>& base,
                  const std::vector<float>& scale, int H, int D, double norm_eps, double eps,
                  int iters, bool head) {
  const int HD = H * D, mix = head ? H : (2 + H) * H;
  double ss = 0;
  for (int i = 0; i < HD; ++i) ss += static_cast<double>(h[i]) * h[i];
  const double r = 1.0 / std::sqrt(ss / HD + norm_eps);
  std::vector<double> logits(static_cast<std::size_t>(mix));
  for (int o = 0; o < mix; ++o) {
    double acc = 0;
    for (int i = 0; i < HD; ++i) acc += h[i] * r * fn[static_cast<std::size_t>(o * HD + i)];
    logits[static_cast<std::size_t>(o)] = acc;
  }
  Mix m;
  for (int j = 0; j < H; ++j) m.pre.push_back(sigmoid(logits[j] * scale[0] + base[j]) + eps);
  if (head) return m;
  for (int j = 0; j < H; ++j) m.post.push_back(2 * sigmoid(logits[H + j] * scale[1] + base[H + j]));
  std::vector<double> c(static_cast<std::size_t>(H * H));
  for (int i = 0; i < H; ++i) {
    double mx = -1e300, sum = 0;
    for (int j = 0; j < H; ++j) {
      c[i * H + j] = logits[2 * H + i * H + j] * scale[2] + base[2 * H + i * H + j];
      mx = std::max(mx, c[i * H + j]);
    }
    for (int j = 0; j < H; ++j) sum += (c[i * H + j] = std::exp(c[i * H + j] - mx));
    for (int j = 0; j < H; ++j) c[i * H + j] = c[i * H + j] / sum + eps;
  }
  auto cols = [&] {
    for (int j = 0; j < H; ++j) {
      double s = 0;
      for (int i = 0; i < H; ++i) s += c[i * H + j];
      for (int i = 0; i < H; ++i) c[i * H + j] /= s + eps;
    }
  };
  auto rows = [&] {
    for (int i = 0; i < H; ++i) {
      double s = 0;
      for (int j = 0; j < H; ++j) s += c[i * H + j];
      for (int j = 0; j < H; ++j) c[i * H + j] /= s + eps;
    }
  };
  cols();
  for (int it = 0; it < iters - 1; ++it) {
    rows();
    cols();
  }
  m.comb = c;
  return m;
}

class SharedBlocks : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 gen{20261201};
};

TEST_F(SharedBlocks, MhcReadAndWriteFollowTheReference) {
  constexpr int S = 3, H = 4, D = 24, HD = H * D, mix = (2 + H) * H;
  const auto hv = uniform(S * HD, gen, 2.0f), yv = uniform(S * D, gen, 1.0f);
  const auto fn = uniform(mix * HD, gen, 1.0f / std::sqrt(static_cast<float>(HD)));
  const auto base = uniform(mix, gen, 1.0f), scale = uniform(3, gen, 2.0f);
  MhcWeights w{f32(fn, {mix, HD}), f32(base, {mix}), f32(scale, {3}), H, D, 1e-6f, 1e-6f, 20};
  Tensor h({S, HD}, hv), y({S, D}, yv), collapsed;
  MhcMix m;
  mhc_read(*be, w, h, collapsed, m);
  mhc_write(*be, m, y, h);
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  for (int s = 0; s < S; ++s) {
    const float* hs = hv.data() + s * HD;
    const auto ref = reference_mix(hs, fn, base, scale, H, D, 1e-6, 1e-6, 20, false);
    for (int j = 0; j < H; ++j) EXPECT_NEAR(m.post.row(s)[j], ref.post[j], 1e-6);
    for (int i = 0; i < H * H; ++i) EXPECT_NEAR(m.comb.row(s)[i], ref.comb[i], 1e-6);
    // Sinkhorn ends on a column normalisation: every column sums to 1 (less its eps), and the
    // rows are close to 1 after 20 iterations.
    for (int k = 0; k < H; ++k) {
      double col = 0, row = 0;
      for (int j = 0; j < H; ++j) col += ref.comb[j * H + k], row += ref.comb[k * H + j];
      EXPECT_NEAR(col, 1.0, 1e-5);
      EXPECT_NEAR(row, 1.0, 1e-3);
    }
    for (int d = 0; d < D; ++d) {
      double c = 0;
      for (int j = 0; j < H; ++j) c += ref.pre[j] * hs[j * D + d];
      EXPECT_NEAR(collapsed.row(s)[d], c, 1e-5);
      // new stream k = post[k] * y + sum_j comb[j, k] * old stream j (comb^T · streams).
      for (int k = 0; k < H; ++k) {
        double v = ref.post[k] * yv[s * D + d];
        for (int j = 0; j < H; ++j) v += ref.comb[j * H + k] * hs[j * D + d];
        EXPECT_NEAR(h.row(s)[k * D + d], v, 1e-5) << "s " << s << " k " << k << " d " << d;
      }
    }
  }
}

TEST_F(SharedBlocks, MhcHeadIsThePreWeightedSum) {
  constexpr int S = 2, H = 4, D = 16, HD = H * D;
  const auto hv = uniform(S * HD, gen, 1.0f);
  const auto fn = uniform(H * HD, gen, 1.0f / std::sqrt(static_cast<float>(HD)));
  const auto base = uniform(H, gen, 1.0f), scale = uniform(1, gen, 2.0f);
  MhcHeadWeights w{f32(fn, {H, HD}), f32(base, {H}), f32(scale, {1}), H, D, 1e-6f, 1e-6f};
  Tensor h({S, HD}, hv), out;
  mhc_head(*be, w, h, out);
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  for (int s = 0; s < S; ++s) {
    const auto ref = reference_mix(hv.data() + s * HD, fn, base, scale, H, D, 1e-6, 1e-6, 0, true);
    for (int d = 0; d < D; ++d) {
      double c = 0;
      for (int j = 0; j < H; ++j) c += ref.pre[j] * hv[s * HD + j * D + d];
      EXPECT_NEAR(out.row(s)[d], c, 1e-5);
    }
  }
}

// HF's GLM router (Glm5NextTextTopkRouter.forward) for one token.
std::vector<int> reference_group_topk(const std::vector<double>& scores,
                                      const std::vector<float>& bias, int groups, int top_groups,
                                      int k) {
  const int E = static_cast<int>(scores.size()), per = E / groups;
  std::vector<double> choice(scores.size());
  for (int e = 0; e < E; ++e) choice[e] = scores[e] + bias[e];
  std::vector<double> gs(static_cast<std::size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    gs[g] = v[0] + v[1];
  }
  std::vector<int> gi(static_cast<std::size_t>(groups));
  std::iota(gi.begin(), gi.end(), 0);
  std::sort(gi.begin(), gi.end(), [&](int a, int b) { return gs[a] > gs[b]; });
  for (int t = top_groups; t < groups; ++t)
    for (int i = 0; i < per; ++i) choice[gi[t] * per + i] = -1e300;
  std::vector<int> ei(static_cast<std::size_t>(E));
  std::iota(ei.begin(), ei.end(), 0);
  std::sort(ei.begin(), ei.end(), [&](int a, int b) { return choice[a] > choice[b]; });
  ei.resize(static_cast<std::size_t>(k));
  return ei;
}

TEST_F(SharedBlocks, SigmoidRouterWithBiasAndGroupsChoosesAsGlm) {
  constexpr int S = 6, Dm = 32, E = 64, k = 6, groups = 8, top_groups = 3;
  const auto xv = uniform(S * Dm, gen, 1.0f), gate = uniform(E * Dm, gen, 0.5f);
  // A bias large enough to change choices: selection must use it and the weights must not.
  const auto bias = uniform(E, gen, 0.3f);
  RouterWeights w;
  w.gate = f32(gate, {E, Dm});
  w.selection_bias = f32(bias, {E});
  w.score = RouterScore::kSigmoid;
  w.experts = E;
  w.top_k = k;
  w.groups = groups;
  w.top_groups = top_groups;
  w.normalize = true;
  w.routed_scaling = 2.5f;
  Tensor x({S, Dm}, xv);
  Routing r;
  route(*be, w, x, nullptr, r);
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  for (int s = 0; s < S; ++s) {
    std::vector<double> scores(E);
    for (int e = 0; e < E; ++e) {
      double acc = 0;
      for (int i = 0; i < Dm; ++i) acc += xv[s * Dm + i] * gate[e * Dm + i];
      scores[e] = sigmoid(acc);
    }
    auto want = reference_group_topk(scores, bias, groups, top_groups, k);
    std::vector<int> got(r.experts.data_as<std::int32_t>() + s * k,
                         r.experts.data_as<std::int32_t>() + (s + 1) * k);
    EXPECT_EQ(got, want) << "token " << s;
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += scores[want[j]];
    for (int j = 0; j < k; ++j) EXPECT_NEAR(r.weights.row(s)[j], scores[want[j]] / sum * 2.5, 1e-5);
    // Every chosen expert lies in one of the top_groups groups.
    std::vector<int> used;
    for (int e : got) used.push_back(e / (E / groups));
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    EXPECT_LE(static_cast<int>(used.size()), top_groups);
  }
}

TEST_F(SharedBlocks, HashRouterTakesTheTableRowAndSqrtSoftplusWeights) {
  constexpr int S = 4, Dm = 16, E = 16, k = 3, vocab = 10;
  const auto xv = uniform(S * Dm, gen, 1.0f), gate = uniform(E * Dm, gen, 0.5f);
  std::vector<std::int64_t> table(vocab * k);
  for (int i = 0; i < vocab * k; ++i) table[static_cast<std::size_t>(i)] = (i * 7 + 3) % E;
  RouterWeights w;
  w.gate = f32(gate, {E, Dm});
  w.token_experts = {DType::kI64, {vocab, k}, reinterpret_cast<const std::uint8_t*>(table.data())};
  w.score = RouterScore::kSqrtSoftplus;
  w.experts = E;
  w.top_k = k;
  w.routed_scaling = 1.5f;
  const std::vector<std::int32_t> tokens = {7, 0, 9, 7};
  Tensor ids(host_memory(), {S, 1}, DType::kI32);
  std::copy(tokens.begin(), tokens.end(), ids.data_as<std::int32_t>());
  Tensor x({S, Dm}, xv);
  Routing r;
  route(*be, w, x, &ids, r);
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  for (int s = 0; s < S; ++s) {
    double sum = 0;
    std::vector<double> sc(k);
    for (int j = 0; j < k; ++j) {
      const auto e = table[static_cast<std::size_t>(tokens[s] * k + j)];
      EXPECT_EQ(r.experts.data_as<std::int32_t>()[s * k + j], e);
      double acc = 0;
      for (int i = 0; i < Dm; ++i) acc += xv[s * Dm + i] * gate[e * Dm + i];
      sum += (sc[j] = std::sqrt(std::log1p(std::exp(acc))));
    }
    for (int j = 0; j < k; ++j) EXPECT_NEAR(r.weights.row(s)[j], sc[j] / sum * 1.5, 1e-5);
  }
  // A token outside the table is refused by name.
  ids.data_as<std::int32_t>()[2] = vocab;
  route(*be, w, x, &ids, r);
  EXPECT_FALSE(be->status().ok());
  EXPECT_NE(be->status().message().find("outside the table"), std::string::npos);
}

TEST_F(SharedBlocks, ClampedMoeIsRoutedPlusSharedWithTheClampedSwiglu) {
  constexpr int S = 3, Dm = 16, E = 8, I = 8, k = 2;
  constexpr float L = 0.5f;  // small enough that most gate/up values are clamped
  const auto xv = uniform(S * Dm, gen, 2.0f), gate = uniform(E * Dm, gen, 0.5f);
  const auto gu = uniform(E * 2 * I * Dm, gen, 0.5f), dn = uniform(E * Dm * I, gen, 0.5f);
  const auto sg = uniform(I * Dm, gen, 0.5f), su = uniform(I * Dm, gen, 0.5f),
             sd = uniform(Dm * I, gen, 0.5f);
  ClampedMoeWeights w;
  w.router.gate = f32(gate, {E, Dm});
  w.router.score = RouterScore::kSoftmax;
  w.router.experts = E;
  w.router.top_k = k;
  w.gate_up = f32(gu, {E, 2 * I, Dm});
  w.down = f32(dn, {E, Dm, I});
  w.shared = {f32(sg, {I, Dm}), f32(su, {I, Dm}), f32(sd, {Dm, I}), L};
  w.swiglu_limit = L;
  Tensor x({S, Dm}, xv), y;
  clamped_moe(*be, w, x, nullptr, y);
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  const auto swiglu = [&](double g, double u) {
    g = std::min(g, static_cast<double>(L));
    u = std::clamp(u, -static_cast<double>(L), static_cast<double>(L));
    return g / (1 + std::exp(-g)) * u;
  };
  // mlp(x) with rows gate [I, Dm], up [I, Dm] and down [Dm, I].
  const auto mlp = [&](const float* xs, const float* g, const float* u, const float* d, int out) {
    std::vector<double> act(I);
    for (int i = 0; i < I; ++i) {
      double a = 0, b = 0;
      for (int c = 0; c < Dm; ++c) a += xs[c] * g[i * Dm + c], b += xs[c] * u[i * Dm + c];
      act[i] = swiglu(a, b);
    }
    double o = 0;
    for (int i = 0; i < I; ++i) o += d[out * I + i] * act[i];
    return o;
  };
  for (int s = 0; s < S; ++s) {
    const float* xs = xv.data() + s * Dm;
    std::vector<double> p(E);
    double mx = -1e300, z = 0;
    for (int e = 0; e < E; ++e) {
      double acc = 0;
      for (int c = 0; c < Dm; ++c) acc += xs[c] * gate[e * Dm + c];
      mx = std::max(mx, p[e] = acc);
    }
    for (auto& v : p) z += (v = std::exp(v - mx));
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    const double wsum = p[order[0]] + p[order[1]];
    for (int c = 0; c < Dm; ++c) {
      double want = mlp(xs, sg.data(), su.data(), sd.data(), c);
      for (int j = 0; j < k; ++j) {
        const int e = order[j];
        const float* g = gu.data() + e * 2 * I * Dm;
        want += p[e] / wsum * mlp(xs, g, g + I * Dm, dn.data() + e * Dm * I, c);
      }
      EXPECT_NEAR(y.row(s)[c], want, 1e-5) << "s " << s << " c " << c;
    }
  }
}

TEST(RouterScore, NamesAndAnUnknownOne) {
  EXPECT_EQ(*router_score_from_name("sqrtsoftplus"), RouterScore::kSqrtSoftplus);
  EXPECT_EQ(*router_score_from_name("sigmoid"), RouterScore::kSigmoid);
  EXPECT_EQ(*router_score_from_name("softmax"), RouterScore::kSoftmax);
  const auto bad = router_score_from_name("relu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("relu"), std::string::npos);
}

}  // namespace
}  // namespace fs
