// The CPU backend's ops and the shared blocks against small direct computations.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "model/common/block_indexer.h"
#include "model/common/moe.h"

namespace fs {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  Tensor t(std::move(shape));
  for (auto& v : t.span()) v = d(rng);
  return t;
}

Weight f32_weight(const Tensor& t) {
  return {DType::kF32, t.shape(), reinterpret_cast<const std::uint8_t*>(t.data())};
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double m = a.size() == b.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng{7};
};

TEST_F(CpuOps, LinearF32AndBf16) {
  const auto x = random_tensor({5, 70}, rng), w = random_tensor({130, 70}, rng);
  Tensor y;
  be->linear(x, f32_weight(w), y);
  ASSERT_EQ(y.shape(), (Shape{5, 130}));
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t o = 0; o < 130; ++o) {
      double s = 0;
      for (std::int64_t i = 0; i < 70; ++i) s += static_cast<double>(x.row(r)[i]) * w.row(o)[i];
      EXPECT_NEAR(y.row(r)[o], s, 1e-4);
    }
  // bf16 weights (tiles of 64 rows, 130 is not a multiple) equal f32 weights rounded to bf16.
  std::vector<std::uint16_t> bf(static_cast<std::size_t>(w.numel()));
  Tensor rounded(w.shape());
  for (std::size_t i = 0; i < bf.size(); ++i) {
    bf[i] = f32_to_bf16(w.data()[i]);
    rounded.data()[i] = bf16_to_f32(bf[i]);
  }
  Tensor yb, yr;
  be->linear(x, {DType::kBF16, w.shape(), reinterpret_cast<const std::uint8_t*>(bf.data())}, yb);
  be->linear(x, f32_weight(rounded), yr);
  EXPECT_LE(max_abs_diff(yb.span(), yr.span()), 1e-5);
}

TEST_F(CpuOps, RmsNormVariants) {
  const auto x = random_tensor({3, 8}, rng), gate = random_tensor({3, 8}, rng);
  const std::vector<float> w = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f, -0.5f, 1.0f, 2.0f};
  Tensor y;
  // (1+w) over the whole row, grouped by 4, and plain w gated by sigmoid per group of 8.
  for (const std::int64_t group : {8, 4}) {
    be->rms_norm(x, w, group, 1e-6f, true, y);
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t g0 = 0; g0 < 8; g0 += group) {
        double ss = 0;
        for (auto c = g0; c < g0 + group; ++c) ss += x.row(r)[c] * x.row(r)[c];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(group) + 1e-6);
        for (auto c = g0; c < g0 + group; ++c)
          EXPECT_NEAR(y.row(r)[c], x.row(r)[c] * inv * (1.0 + w[static_cast<std::size_t>(c)]),
                      1e-5);
      }
  }
  // A per-head weight (one group's worth) is shared by every group.
  const std::vector<float> head_w(w.begin(), w.begin() + 4);
  Tensor yh;
  be->rms_norm(x, head_w, 4, 1e-6f, true, yh);
  be->rms_norm(x, std::vector<float>{0.1f, -0.2f, 0.3f, 0.0f, 0.1f, -0.2f, 0.3f, 0.0f}, 4, 1e-6f,
               true, y);
  EXPECT_EQ(max_abs_diff(yh.span(), y.span()), 0.0);
  be->rms_norm_gated(x, w, gate, 1e-6f, Activation::kSigmoid, y);
  for (std::int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (std::int64_t c = 0; c < 8; ++c) ss += x.row(r)[c] * x.row(r)[c];
    const double inv = 1.0 / std::sqrt(ss / 8 + 1e-6);
    for (std::int64_t c = 0; c < 8; ++c)
      EXPECT_NEAR(y.row(r)[c],
                  w[static_cast<std::size_t>(c)] * x.row(r)[c] * inv * sigmoid(gate.row(r)[c]),
                  1e-5);
  }
}

TEST_F(CpuOps, RopeRotatesPairsAndPreservesRelativePositions) {
  const std::int64_t D = 16, R = 8;
  auto q = random_tensor({1, D}, rng), k = random_tensor({1, D}, rng);
  auto at = [&](Tensor t, Position p) {
    const Position pos[] = {p};
    be->rope(t, D, R, pos, 10000.0);
    return t;
  };
  // Position 0 is the identity; the dims past R pass through.
  EXPECT_EQ(max_abs_diff(at(q, 0).span(), q.span()), 0.0);
  const auto q5 = at(q, 5);
  for (std::int64_t i = R; i < D; ++i) EXPECT_EQ(q5.data()[i], q.data()[i]);
  // Direct rotate-half formula.
  for (std::int64_t i = 0; i < R / 2; ++i) {
    const double f = 5.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / R);
    EXPECT_NEAR(q5.data()[i], q.data()[i] * std::cos(f) - q.data()[i + R / 2] * std::sin(f), 1e-5);
    EXPECT_NEAR(q5.data()[i + R / 2], q.data()[i + R / 2] * std::cos(f) + q.data()[i] * std::sin(f),
                1e-5);
  }
  // q(p) . k(p') depends on p - p' only.
  auto dot = [&](const Tensor& a, const Tensor& b) {
    double s = 0;
    for (std::int64_t i = 0; i < D; ++i) s += a.data()[i] * b.data()[i];
    return s;
  };
  EXPECT_NEAR(dot(at(q, 9), at(k, 4)), dot(at(q, 105), at(k, 100)), 1e-4);
}

TEST_F(CpuOps, CausalConvWithStateEqualsOneCall) {
  const std::int64_t C = 6, K = 4, dil = 3, S = 20, L = (K - 1) * dil;
  const auto x = random_tensor({S, C}, rng), w = random_tensor({C, K}, rng);
  Tensor tail({L, C}), y;
  be->causal_conv1d(x, w, dil, tail, y);
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        const auto src = t - (K - 1 - j) * dil;
        if (src >= 0) s += w.row(c)[j] * x.row(src)[c];
      }
      EXPECT_NEAR(y.row(t)[c], s, 1e-5);
    }
  // Fed in pieces of 1, 7, 2 and 10 tokens through the tail: the same outputs and final tail.
  Tensor tail2({L, C}), y2, piece, out;
  std::vector<float> all;
  std::int64_t at = 0;
  for (const std::int64_t n : {1, 7, 2, 10}) {
    piece = Tensor({n, C}, std::vector<float>(x.row(at), x.row(at + n)));
    be->causal_conv1d(piece, w, dil, tail2, out);
    all.insert(all.end(), out.span().begin(), out.span().end());
    at += n;
  }
  EXPECT_LE(max_abs_diff(all, y.span()), 1e-6);
  EXPECT_EQ(max_abs_diff(tail2.span(), tail.span()), 0.0);
  EXPECT_EQ(max_abs_diff(tail.span(), std::span(x.row(S - L), x.row(S))), 0.0);
}

TEST_F(CpuOps, ChunkedDeltaRuleEqualsRecurrent) {
  const std::int64_t S = 150, Hk = 2, Hv = 4, dk = 8, dv = 6;
  auto q = random_tensor({S, Hk * dk}, rng), k = random_tensor({S, Hk * dk}, rng);
  const auto v = random_tensor({S, Hv * dv}, rng);
  auto g = random_tensor({S, Hv}, rng), beta = random_tensor({S, Hv}, rng);
  for (auto& e : g.span()) e = -std::fabs(e) * 0.3f;  // log decay <= 0
  for (auto& e : beta.span()) e = sigmoid(e);
  be->l2_norm(q, dk, 1e-6f);
  be->l2_norm(k, dk, 1e-6f);
  const auto init = random_tensor({Hv, dk, dv}, rng, 0.1f);
  Tensor s1 = init, s2 = init, o1, o2;
  be->gated_delta_rule_chunked(q, k, v, g, beta, Hk, s1, o1);  // chunks of 64, 64, 22
  be->gated_delta_rule_recurrent(q, k, v, g, beta, Hk, s2, o2);
  EXPECT_LE(max_abs_diff(o1.span(), o2.span()), 1e-4);
  EXPECT_LE(max_abs_diff(s1.span(), s2.span()), 1e-4);
  // The recurrence by hand for the first token of value head 3 (key head 1).
  {
    const auto h = 3, kh = 1;
    const float* S0 = init.data() + h * dk * dv;
    std::vector<double> Sn(S0, S0 + dk * dv);
    const double decay = std::exp(g.row(0)[h]);
    for (auto& e : Sn) e *= decay;
    for (std::int64_t j = 0; j < dv; ++j) {
      double mem = 0;
      for (std::int64_t i = 0; i < dk; ++i)
        mem += Sn[static_cast<std::size_t>(i * dv + j)] * k.row(0)[kh * dk + i];
      const double delta = (v.row(0)[h * dv + j] - mem) * beta.row(0)[h];
      for (std::int64_t i = 0; i < dk; ++i)
        Sn[static_cast<std::size_t>(i * dv + j)] += k.row(0)[kh * dk + i] * delta;
    }
    for (std::int64_t j = 0; j < dv; ++j) {
      double o = 0;
      for (std::int64_t i = 0; i < dk; ++i)
        o += Sn[static_cast<std::size_t>(i * dv + j)] * q.row(0)[kh * dk + i];
      EXPECT_NEAR(o2.row(0)[h * dv + j], o, 1e-5);
    }
  }
  // Chunked in two calls (70 + 80) equals one call.
  Tensor s3 = init, oa, ob;
  auto rows = [](const Tensor& t, std::int64_t a, std::int64_t n) {
    return Tensor({n, t.cols()}, std::vector<float>(t.row(a), t.row(a + n)));
  };
  be->gated_delta_rule_chunked(rows(q, 0, 70), rows(k, 0, 70), rows(v, 0, 70), rows(g, 0, 70),
                               rows(beta, 0, 70), Hk, s3, oa);
  be->gated_delta_rule_chunked(rows(q, 70, 80), rows(k, 70, 80), rows(v, 70, 80), rows(g, 70, 80),
                               rows(beta, 70, 80), Hk, s3, ob);
  std::vector<float> o3(oa.span().begin(), oa.span().end());
  o3.insert(o3.end(), ob.span().begin(), ob.span().end());
  EXPECT_LE(max_abs_diff(o3, o1.span()), 1e-4);
  EXPECT_LE(max_abs_diff(s3.span(), s1.span()), 1e-4);
}

TEST_F(CpuOps, AttentionEqualsNaiveSoftmax) {
  const std::int64_t Hq = 4, Hkv = 2, D = 8, T = 9;
  const auto q = random_tensor({2, Hq * D}, rng), k = random_tensor({T, Hkv * D}, rng),
             v = random_tensor({T, Hkv * D}, rng);
  KeySelection sel;
  const std::vector<std::int32_t> a = {0, 3, 4, 8}, b = {2, 5};
  sel.add_query(a);
  sel.add_query(b);
  Tensor out;
  be->attention(q, k, v, Hq, Hkv, sel, 0.5f, out);
  for (std::int64_t s = 0; s < 2; ++s) {
    const auto& keys = s == 0 ? a : b;
    for (std::int64_t h = 0; h < Hq; ++h) {
      const auto kvh = h / 2;
      std::vector<double> p;
      for (const auto t : keys) {
        double d = 0;
        for (std::int64_t x = 0; x < D; ++x) d += q.row(s)[h * D + x] * k.row(t)[kvh * D + x];
        p.push_back(std::exp(0.5 * d));
      }
      const double z = std::accumulate(p.begin(), p.end(), 0.0);
      for (std::int64_t x = 0; x < D; ++x) {
        double o = 0;
        for (std::size_t i = 0; i < keys.size(); ++i) o += p[i] / z * v.row(keys[i])[kvh * D + x];
        EXPECT_NEAR(out.row(s)[h * D + x], o, 1e-5);
      }
    }
  }
}

TEST_F(CpuOps, TopkOrderAndCounts) {
  const Tensor x({2, 5}, {0.1f, 0.9f, 0.5f, 0.9f, 0.3f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f});
  std::vector<std::int32_t> idx;
  std::vector<float> val;
  const std::vector<std::int64_t> counts = {5, 2};
  be->topk(x, 3, counts, idx, val);
  EXPECT_EQ(idx, (std::vector<std::int32_t>{1, 3, 2, 1, 0, -1}));  // ties: lower index first
}

TEST_F(CpuOps, BlockSelectionKeepsTopBlocksAndTail) {
  // Query at position 13 sees 14 tokens: blocks [0..3], [4..7], [8..11] and the tail 12, 13.
  const Tensor scores({1, 3}, {0.5f, 0.1f, 0.7f});
  const Position pos[] = {13};
  KeySelection sel;
  select_block_tokens(*be, scores, pos, 4, 2, sel);
  EXPECT_EQ(sel.keys, (std::vector<std::int32_t>{8, 9, 10, 11, 0, 1, 2, 3, 12, 13}));
  // With a budget of every block it is dense causal attention.
  select_block_tokens(*be, scores, pos, 4, 8, sel);
  EXPECT_EQ(sel.keys.size(), 14u);
}

TEST_F(CpuOps, MoeRoutesTopKWithRenormalisationAndSharedGate) {
  const std::int64_t H = 6, E = 4, I = 3, S = 3;
  const auto x = random_tensor({S, H}, rng);
  const auto router = random_tensor({E, H}, rng), gate_up = random_tensor({E, 2 * I, H}, rng),
             down = random_tensor({E, H, I}, rng), sg = random_tensor({I, H}, rng),
             su = random_tensor({I, H}, rng), sd = random_tensor({H, I}, rng),
             sgate = random_tensor({1, H}, rng);
  MoeWeights w{f32_weight(router),
               f32_weight(gate_up),
               f32_weight(down),
               f32_weight(sg),
               f32_weight(su),
               f32_weight(sd),
               f32_weight(sgate),
               E,
               2,
               true};
  Routing r;
  moe_route(*be, w, x, r);
  Tensor y;
  moe(*be, w, x, y);
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  auto mv = [](const float* m, std::int64_t rows, std::int64_t cols,
               const std::vector<double>& in) {
    std::vector<double> o(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        o[static_cast<std::size_t>(i)] += m[i * cols + j] * in[static_cast<std::size_t>(j)];
    return o;
  };
  for (std::int64_t s = 0; s < S; ++s) {
    const std::vector<double> xs(x.row(s), x.row(s) + H);
    auto logits = mv(router.data(), E, H, xs);
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p;
    for (const auto l : logits) p.push_back(std::exp(l - mx));
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    const double top = p[order[0]] + p[order[1]];
    EXPECT_EQ(r.experts[static_cast<std::size_t>(2 * s)], order[0]);
    EXPECT_EQ(r.experts[static_cast<std::size_t>(2 * s + 1)], order[1]);
    EXPECT_NEAR(
        r.weights[static_cast<std::size_t>(2 * s)] + r.weights[static_cast<std::size_t>(2 * s + 1)],
        1.0, 1e-6);
    std::vector<double> expect(static_cast<std::size_t>(H), 0.0);
    for (int j = 0; j < 2; ++j) {
      const int e = order[static_cast<std::size_t>(j)];
      const auto gu = mv(gate_up.data() + e * 2 * I * H, 2 * I, H, xs);
      std::vector<double> act(static_cast<std::size_t>(I));
      for (std::int64_t i = 0; i < I; ++i)
        act[static_cast<std::size_t>(i)] =
            silu(gu[static_cast<std::size_t>(i)]) * gu[static_cast<std::size_t>(I + i)];
      const auto o = mv(down.data() + e * H * I, H, I, act);
      for (std::int64_t c = 0; c < H; ++c)
        expect[static_cast<std::size_t>(c)] +=
            p[static_cast<std::size_t>(e)] / top * o[static_cast<std::size_t>(c)];
    }
    const auto g = mv(sg.data(), I, H, xs), u = mv(su.data(), I, H, xs);
    std::vector<double> act(static_cast<std::size_t>(I));
    for (std::int64_t i = 0; i < I; ++i)
      act[static_cast<std::size_t>(i)] =
          silu(g[static_cast<std::size_t>(i)]) * u[static_cast<std::size_t>(i)];
    const auto sh = mv(sd.data(), H, I, act);
    const double gate = 1 / (1 + std::exp(-mv(sgate.data(), 1, H, xs)[0]));
    for (std::int64_t c = 0; c < H; ++c)
      EXPECT_NEAR(y.row(s)[c],
                  expect[static_cast<std::size_t>(c)] + gate * sh[static_cast<std::size_t>(c)],
                  1e-4);
  }
}

}  // namespace
}  // namespace fs
