// The compressed-attention ops of DeepSeek V4 (backend.h "compressed attention"; arch-dsv4.md
// 2.4-2.10): interleaved tail RoPE, the compressor's gated pooling, the lightning indexer's
// weighted scores, sink attention over raw + compressed rows, and the grouped output projection.
// Plain loops: sums run in a fixed order (softmax normalisers in double), so results do not
// depend on the thread count.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/weight_rows.h"

namespace fs {
namespace {

float dot(const float* a, const float* b, std::int64_t n) {
  float s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void CpuBackend::rope_interleaved(Tensor& x, std::int64_t head_dim, const Weight& inv_freq,
                                  std::int64_t first, std::int64_t stride, bool inverse) {
  if (failed() || !check_vector(inv_freq, "rope_interleaved")) return;
  const auto half = inv_freq.numel(), heads = x.cols() / head_dim;
  assert(2 * half <= head_dim && heads * head_dim == x.cols());
  const float* f = inv_freq.f32();
  const auto tail = head_dim - 2 * half;
  cpu_parallel_ranges(x.rows(), static_cast<double>(x.numel()) * 4,
                      [&](std::int64_t r0, std::int64_t r1) {
                        std::vector<float> cosv(static_cast<std::size_t>(half)),
                            sinv(static_cast<std::size_t>(half));
                        for (auto r = r0; r < r1; ++r) {
                          const auto position = static_cast<float>(first + r * stride);
                          for (std::int64_t j = 0; j < half; ++j) {
                            // The angle is an fp32 product, as the reference's inv_freq @ pos.
                            const float angle = position * f[j];
                            cosv[static_cast<std::size_t>(j)] =
                                static_cast<float>(std::cos(static_cast<double>(angle)));
                            const auto s = static_cast<float>(std::sin(static_cast<double>(angle)));
                            sinv[static_cast<std::size_t>(j)] = inverse ? -s : s;
                          }
                          for (std::int64_t h = 0; h < heads; ++h) {
                            float* p = x.row(r) + h * head_dim + tail;
                            for (std::int64_t j = 0; j < half; ++j) {
                              const float a = p[2 * j], b = p[2 * j + 1];
                              const float c = cosv[static_cast<std::size_t>(j)],
                                          s = sinv[static_cast<std::size_t>(j)];
                              p[2 * j] = a * c - b * s;
                              p[2 * j + 1] = b * c + a * s;
                            }
                          }
                        }
                      });
}

void CpuBackend::compressor_pool(const Tensor& kv, const Tensor& gate, std::int64_t src_first,
                                 const Weight& bias, std::int64_t first_window,
                                 std::int64_t windows, bool overlap, Tensor& out) {
  if (failed() || !check_vector(bias, "compressor_pool")) return;
  const auto width = kv.cols(), ratio = bias.rows(), D = overlap ? width / 2 : width;
  assert(gate.shape() == kv.shape() && bias.cols() == width);
  if (!ensure(out, {windows, D})) return;
  const float* b = bias.f32();
  cpu_parallel_ranges(windows, static_cast<double>(windows * width * ratio) * 8,
                      [&](std::int64_t w0, std::int64_t w1) {
                        // Per slot, its kv, gate and bias rows, each offset to the half the slot
                        // reads.
                        std::vector<const float*> kvs, gates, biases;
                        std::vector<float> e;
                        for (auto wi = w0; wi < w1; ++wi) {
                          const auto w = first_window + wi;
                          kvs.clear(), gates.clear(), biases.clear();
                          auto add_window = [&](std::int64_t window, std::int64_t col) {
                            for (std::int64_t t = window * ratio; t < (window + 1) * ratio; ++t) {
                              const auto row = t - src_first;
                              assert(row >= 0 && row < kv.rows());
                              kvs.push_back(kv.row(row) + col);
                              gates.push_back(gate.row(row) + col);
                              biases.push_back(b + (t % ratio) * width + col);
                            }
                          };
                          if (overlap && w > 0) add_window(w - 1, 0);
                          add_window(w, overlap ? D : 0);
                          const auto n = kvs.size();
                          e.resize(n);
                          for (std::int64_t i = 0; i < D; ++i) {
                            float m = -std::numeric_limits<float>::infinity();
                            for (std::size_t j = 0; j < n; ++j)
                              m = std::max(m, e[j] = gates[j][i] + biases[j][i]);
                            double sum = 0;
                            for (auto& v : e) sum += (v = std::exp(v - m));
                            float acc = 0;
                            for (std::size_t j = 0; j < n; ++j)
                              acc += kvs[j][i] * static_cast<float>(e[j] / sum);
                            out.row(wi)[i] = acc;
                          }
                        }
                      });
}

void CpuBackend::weighted_index_scores(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                       float scale, Tensor& out) {
  if (failed()) return;
  const auto S = q.rows(), heads = weights.cols();
  const auto N = keys.shape().empty() ? 0 : keys.rows(),
             dim = keys.shape().empty() ? 0 : keys.cols();
  assert(weights.rows() == S && (N == 0 || q.cols() == heads * dim));
  if (!ensure(out, {S, N})) return;
  if (S == 0 || N == 0) return;
  cpu_parallel_ranges(S, 2.0 * static_cast<double>(S * N * heads * dim),
                      [&](std::int64_t s0, std::int64_t s1) {
                        for (auto s = s0; s < s1; ++s) {
                          const float* qs = q.row(s);
                          const float* ws = weights.row(s);
                          for (std::int64_t w = 0; w < N; ++w) {
                            float acc = 0;
                            for (std::int64_t h = 0; h < heads; ++h)
                              acc += ws[h] * std::max(0.0f, dot(qs + h * dim, keys.row(w), dim));
                            out.row(s)[w] = acc * scale;
                          }
                        }
                      });
}

void CpuBackend::sink_attention(const Tensor& q, const Tensor& kv, std::int64_t kv_first,
                                std::int64_t window, const Tensor& comp, std::int64_t ratio,
                                const Tensor* picked, const Weight& sinks, std::int64_t first,
                                float scale, Tensor& out) {
  if (failed() || !check_vector(sinks, "sink_attention")) return;
  const auto S = q.rows(), D = kv.cols(), H = q.cols() / D;
  const auto N = comp.shape().empty() ? 0 : comp.rows();
  assert(H * D == q.cols() && sinks.numel() == H && (N == 0 || comp.cols() == D));
  assert(picked == nullptr || (picked->dtype() == DType::kI32 && picked->rows() == S));
  if (!ensure(out, q.shape())) return;
  const float* z = sinks.f32();
  const auto top = picked != nullptr ? picked->cols() : 0;
  const auto* pk = picked != nullptr ? picked->data_as<std::int32_t>() : nullptr;
  cpu_parallel_ranges(
      S, 4.0 * static_cast<double>(S * H * D * (window + std::min<std::int64_t>(N, 64))),
      [&](std::int64_t s0, std::int64_t s1) {
        std::vector<const float*> keys;
        std::vector<float> logits;
        for (auto s = s0; s < s1; ++s) {
          const auto p = first + s;
          assert(p - kv_first < kv.rows());
          keys.clear();
          for (auto t = std::max(kv_first, p - window + 1); t <= p; ++t)
            keys.push_back(kv.row(t - kv_first));
          if (pk != nullptr) {
            for (std::int64_t j = 0; j < top; ++j) {
              const auto w = pk[s * top + j];
              if (w < 0) continue;
              assert(w < N);
              keys.push_back(comp.row(w));
            }
          } else if (ratio > 0) {
            for (std::int64_t w = 0; w < std::min(N, (p + 1) / ratio); ++w)
              keys.push_back(comp.row(w));
          }
          const auto n = static_cast<std::int64_t>(keys.size());
          logits.resize(static_cast<std::size_t>(n));
          for (std::int64_t h = 0; h < H; ++h) {
            const float* qh = q.row(s) + h * D;
            float m = z[h];
            for (std::int64_t j = 0; j < n; ++j) {
              const auto u = static_cast<std::size_t>(j);
              logits[u] = dot(qh, keys[u], D) * scale;
              m = std::max(m, logits[u]);
            }
            double sum = std::exp(static_cast<double>(z[h] - m));
            for (auto& v : logits) sum += (v = std::exp(v - m));
            float* o = out.row(s) + h * D;
            std::fill(o, o + D, 0.0f);
            for (std::int64_t j = 0; j < n; ++j) {
              const auto u = static_cast<std::size_t>(j);
              const auto pj = static_cast<float>(logits[u] / sum);
              for (std::int64_t c = 0; c < D; ++c) o[c] += pj * keys[u][c];
            }
          }
        }
      });
}

// One product per group on a contiguous copy of its columns (the weight's rows of a group are
// contiguous), written into the group's output columns.
void CpuBackend::grouped_linear(const Tensor& x, const Weight& w, std::int64_t groups, Tensor& y) {
  if (failed()) return;
  const auto S = x.rows(), in = x.cols() / groups, out = w.rows() / groups;
  assert(in * groups == x.cols() && w.cols() == in && out * groups == w.rows());
  if (!ensure(y, {S, groups * out})) return;
  Tensor xg, yg;
  for (std::int64_t g = 0; g < groups; ++g) {
    slice_cols(x, g * in, in, xg);
    // The group's rows in any storage (linear reads every format).
    auto wg = weight_rows(w, g * out, out);
    if (!wg.ok()) return fail(wg.status().with_context("cpu grouped_linear"));
    linear(xg, *wg, yg);
    if (failed()) return;
    for (std::int64_t s = 0; s < S; ++s) std::copy_n(yg.row(s), out, y.row(s) + g * out);
  }
}

}  // namespace fs
