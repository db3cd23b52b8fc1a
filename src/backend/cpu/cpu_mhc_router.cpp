// Manifold-constrained hyper-connections (mhc_weights, weighted_stream_sum, mhc_expand) and the
// DeepSeek/GLM expert selection (select_experts), the ops DeepSeek V4 and GLM 5.3 share.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace fs {
namespace {

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

// Row r of an index table of int32 or int64 entries.
std::int64_t table_entry(const Weight& table, std::int64_t i) {
  if (table.dtype == DType::kI64) return reinterpret_cast<const std::int64_t*>(table.data)[i];
  return reinterpret_cast<const std::int32_t*>(table.data)[i];
}

}  // namespace

bool CpuBackend::check(bool ok, const char* op, const char* what) {
  if (!ok) fail(invalid_argument(std::string("cpu backend: ") + op + ": " + what));
  return ok;
}

void CpuBackend::mhc_weights(const Tensor& h, const Tensor& m, const Weight& base,
                             const Weight& scale, std::int64_t streams, float norm_eps,
                             float hc_eps, std::int64_t sinkhorn_iters, Tensor& pre, Tensor* post,
                             Tensor* comb) {
  if (failed() || !check_vector(base, "mhc_weights") || !check_vector(scale, "mhc_weights")) return;
  const auto S = h.rows(), H = streams;
  const bool head = post == nullptr;
  assert(m.rows() == S && m.cols() == (head ? H : (2 + H) * H) && base.numel() == m.cols());
  assert(scale.numel() == (head ? 1 : 3));
  if (!ensure(pre, {S, H})) return;
  if (!head && (!ensure(*post, {S, H}) || !ensure(*comb, {S, H * H}))) return;
  const float* b = base.f32();
  const float* sc = scale.f32();
  const double eps = hc_eps;
  std::vector<double> c(static_cast<std::size_t>(H * H));
  for (std::int64_t s = 0; s < S; ++s) {
    // The unweighted RMSNorm of the whole row, applied to the product (a per-row scalar).
    double ss = 0;
    for (std::int64_t i = 0; i < h.cols(); ++i)
      ss += static_cast<double>(h.row(s)[i]) * h.row(s)[i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(h.cols()) + norm_eps);
    const float* ms = m.row(s);
    for (std::int64_t j = 0; j < H; ++j)
      pre.row(s)[j] = static_cast<float>(sigmoid(r * ms[j] * sc[0] + b[j]) + eps);
    if (head) continue;
    for (std::int64_t j = 0; j < H; ++j)
      post->row(s)[j] = static_cast<float>(2.0 * sigmoid(r * ms[H + j] * sc[1] + b[H + j]));
    // comb: a row softmax (+ eps), then Sinkhorn ending on a column normalisation.
    for (std::int64_t i = 0; i < H; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < H; ++j) {
        const auto at = static_cast<std::size_t>(i * H + j);
        c[at] = r * ms[2 * H + i * H + j] * sc[2] + b[2 * H + i * H + j];
        mx = std::max(mx, c[at]);
      }
      double sum = 0;
      for (std::int64_t j = 0; j < H; ++j)
        sum += (c[static_cast<std::size_t>(i * H + j)] =
                    std::exp(c[static_cast<std::size_t>(i * H + j)] - mx));
      for (std::int64_t j = 0; j < H; ++j)
        c[static_cast<std::size_t>(i * H + j)] = c[static_cast<std::size_t>(i * H + j)] / sum + eps;
    }
    const auto normalise_columns = [&] {
      for (std::int64_t j = 0; j < H; ++j) {
        double sum = 0;
        for (std::int64_t i = 0; i < H; ++i) sum += c[static_cast<std::size_t>(i * H + j)];
        for (std::int64_t i = 0; i < H; ++i) c[static_cast<std::size_t>(i * H + j)] /= sum + eps;
      }
    };
    const auto normalise_rows = [&] {
      for (std::int64_t i = 0; i < H; ++i) {
        double sum = 0;
        for (std::int64_t j = 0; j < H; ++j) sum += c[static_cast<std::size_t>(i * H + j)];
        for (std::int64_t j = 0; j < H; ++j) c[static_cast<std::size_t>(i * H + j)] /= sum + eps;
      }
    };
    normalise_columns();
    for (std::int64_t it = 1; it < sinkhorn_iters; ++it) {
      normalise_rows();
      normalise_columns();
    }
    for (std::int64_t i = 0; i < H * H; ++i)
      comb->row(s)[i] = static_cast<float>(c[static_cast<std::size_t>(i)]);
  }
}

void CpuBackend::weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out) {
  if (failed()) return;
  const auto streams = w.cols(), W = x.cols() / streams;
  assert(x.cols() == W * streams && w.rows() == x.rows());
  if (!ensure(out, {x.rows(), W})) return;
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.row(r);
    const float* wr = w.row(r);
    float* o = out.row(r);
    for (std::int64_t c = 0; c < W; ++c) {
      float acc = 0;
      for (std::int64_t s = 0; s < streams; ++s) acc += wr[s] * xr[s * W + c];
      o[c] = acc;
    }
  }
}

void CpuBackend::mhc_expand(Tensor& h, const Tensor& y, const Tensor& post, const Tensor& comb) {
  if (failed()) return;
  const auto H = post.cols(), W = y.cols();
  assert(h.cols() == H * W && comb.cols() == H * H && y.rows() == h.rows() &&
         post.rows() == h.rows() && comb.rows() == h.rows());
  std::vector<float> old(static_cast<std::size_t>(H * W));
  for (std::int64_t r = 0; r < h.rows(); ++r) {
    float* hr = h.row(r);
    std::copy_n(hr, H * W, old.data());
    const float* pr = post.row(r);
    const float* cr = comb.row(r);
    const float* yr = y.row(r);
    for (std::int64_t k = 0; k < H; ++k)
      for (std::int64_t c = 0; c < W; ++c) {
        float acc = pr[k] * yr[c];
        for (std::int64_t j = 0; j < H; ++j)
          acc += cr[j * H + k] * old[static_cast<std::size_t>(j * W + c)];
        hr[k * W + c] = acc;
      }
  }
}

void CpuBackend::select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                                const Tensor* token_ids, std::int64_t groups,
                                std::int64_t top_groups, std::int64_t k, bool normalize,
                                float scaling, Tensor& experts, Tensor& weights) {
  if (failed()) return;
  const auto S = scores.rows(), E = scores.cols();
  const bool hashed = !table.empty();
  if (!hashed && !bias.empty() && !check_vector(bias, "select_experts")) return;
  if (hashed &&
      !check(token_ids != nullptr && token_ids->dtype() == DType::kI32 && token_ids->rows() == S &&
                 table.cols() == k && (table.dtype == DType::kI32 || table.dtype == DType::kI64),
             "select_experts", "a hash table needs int32 token ids [S, 1] and a [vocab, k] table"))
    return;
  if (!check(groups >= 1 && E % groups == 0 && top_groups >= 1 && top_groups <= groups && k <= E,
             "select_experts", "groups must divide the experts and k <= experts"))
    return;
  if (!ensure(experts, {S, k}, DType::kI32) || !ensure(weights, {S, k})) return;
  const auto per_group = E / groups;
  std::vector<float> choice(static_cast<std::size_t>(E));
  std::vector<std::int32_t> order(static_cast<std::size_t>(E));
  for (std::int64_t s = 0; s < S; ++s) {
    const float* sc = scores.row(s);
    auto* ids = experts.data_as<std::int32_t>() + s * k;
    if (hashed) {
      const auto tok = token_ids->data_as<std::int32_t>()[s];
      if (!check(tok >= 0 && tok < table.rows(), "select_experts", "token id outside the table"))
        return;
      for (std::int64_t j = 0; j < k; ++j) {
        const auto e = table_entry(table, tok * k + j);
        if (!check(e >= 0 && e < E, "select_experts", "table entry outside the experts")) return;
        ids[j] = static_cast<std::int32_t>(e);
      }
    } else {
      for (std::int64_t e = 0; e < E; ++e)
        choice[static_cast<std::size_t>(e)] = sc[e] + (bias.empty() ? 0.0f : bias.f32()[e]);
      if (groups > 1) {
        // Rank the groups by the sum of their two best biased scores; mask all but the best.
        std::vector<float> gscore(static_cast<std::size_t>(groups));
        for (std::int64_t g = 0; g < groups; ++g) {
          const float* p = choice.data() + g * per_group;
          float a = -std::numeric_limits<float>::infinity(), b2 = a;
          for (std::int64_t i = 0; i < per_group; ++i) {
            if (p[i] > a) {
              b2 = a;
              a = p[i];
            } else if (p[i] > b2) {
              b2 = p[i];
            }
          }
          gscore[static_cast<std::size_t>(g)] = per_group > 1 ? a + b2 : a;
        }
        std::vector<std::int32_t> gorder(static_cast<std::size_t>(groups));
        std::iota(gorder.begin(), gorder.end(), 0);
        std::stable_sort(gorder.begin(), gorder.end(), [&](std::int32_t x, std::int32_t y) {
          return gscore[static_cast<std::size_t>(x)] > gscore[static_cast<std::size_t>(y)];
        });
        for (std::int64_t g = top_groups; g < groups; ++g)
          std::fill_n(choice.data() + gorder[static_cast<std::size_t>(g)] * per_group, per_group,
                      -std::numeric_limits<float>::infinity());
      }
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](std::int32_t x, std::int32_t y) {
                          const float a = choice[static_cast<std::size_t>(x)],
                                      b = choice[static_cast<std::size_t>(y)];
                          return a > b || (a == b && x < y);
                        });
      std::copy_n(order.begin(), k, ids);
    }
    float* w = weights.row(s);
    float sum = 0;
    for (std::int64_t j = 0; j < k; ++j) sum += (w[j] = sc[ids[j]]);
    for (std::int64_t j = 0; j < k; ++j)
      w[j] = (normalize ? w[j] / (sum + 1e-20f) : w[j]) * scaling;
  }
}

}  // namespace fs
