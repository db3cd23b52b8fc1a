// Norms, elementwise ops, layout moves, hyper-connection stream ops, RoPE, embeddings, and the
// indexer and routing ops (block means, scores, softmax, top-k, block selection).
#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "tensor/quant/block_scaled.h"

namespace fs {
namespace {

float apply_act(float v, Activation act) {
  switch (act) {
    case Activation::kIdentity:
      return v;
    case Activation::kSilu:
      return v / (1.0f + std::exp(-v));
    case Activation::kSigmoid:
      return 1.0f / (1.0f + std::exp(-v));
    case Activation::kSoftplus:
      // torch's default threshold: identity above 20.
      return v > 20.0f ? v : std::log1p(std::exp(v));
    case Activation::kRelu:
      return v > 0.0f ? v : 0.0f;
    case Activation::kSqrtSoftplus:
      return std::sqrt(v > 20.0f ? v : std::log1p(std::exp(v)));
  }
  return v;
}

// Rough FLOPs per element of a vector op, for the parallel-for's threshold.
constexpr double kElementWork = 4;

double elems(const Tensor& x) {
  return static_cast<double>(x.numel()) * kElementWork;
}

}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Weight& w, std::int64_t group, float eps,
                          bool unit_offset, Tensor& y) {
  if (failed() || !check_vector(w, "rms_norm")) return;
  const auto cols = x.cols(), wn = w.numel();
  // w spans the whole row, or one group (a per-head norm shared by every group).
  assert(cols % group == 0 && cols % wn == 0);
  if (&y != &x && !ensure(y, x.shape())) return;
  // The scale per column of a row: (1 + w) or w, repeated over the groups when w spans one.
  std::vector<float> scale(static_cast<std::size_t>(cols));
  for (std::int64_t c = 0; c < cols; ++c) {
    const float wc = w.f32()[c % wn];
    scale[static_cast<std::size_t>(c)] = unit_offset ? 1.0f + wc : wc;
  }
  const float* in0 = x.data();
  float* out0 = y.data();
  cpu_parallel_ranges(x.rows(), elems(x), [&](std::int64_t r0, std::int64_t r1) {
    for (auto r = r0; r < r1; ++r) {
      for (std::int64_t g0 = 0; g0 < cols; g0 += group) {
        const float* in = in0 + r * cols + g0;
        // Sum in double: the reference norms in fp32 of float64-accurate values.
        const double ss = cpu::sum_squares(in, group);
        const float inv =
            static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(group) + eps));
        cpu::scale_mul(in, inv, scale.data() + g0, out0 + r * cols + g0, group);
      }
    }
  });
}

void CpuBackend::rms_norm_gated(const Tensor& x, const Weight& w, const Tensor& gate, float eps,
                                Activation act, Tensor& y) {
  if (failed()) return;
  assert(gate.numel() == x.numel());
  rms_norm(x, w, w.numel(), eps, /*unit_offset=*/false, y);
  if (failed()) return;
  if (act == Activation::kSigmoid || act == Activation::kSilu) {
    cpu_parallel_ranges(y.numel(), elems(y), [&](std::int64_t b, std::int64_t e) {
      cpu::mul_gate(y.data() + b, gate.data() + b, e - b, act == Activation::kSilu);
    });
    return;
  }
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data()[i] *= apply_act(gate.data()[i], act);
}

void CpuBackend::layer_norm(const Tensor& x, const Weight& w, const Weight& b, float eps,
                            Tensor& y) {
  if (failed() || !check_vector(w, "layer_norm") || !check_vector(b, "layer_norm")) return;
  const auto cols = x.cols(), group = w.numel();
  assert(group > 0 && cols % group == 0 && b.numel() == group);
  if (&y != &x && !ensure(y, x.shape())) return;
  const float* in0 = x.data();
  float* out0 = y.data();
  cpu_parallel_ranges(x.rows(), elems(x), [&](std::int64_t r0, std::int64_t r1) {
    for (auto r = r0; r < r1; ++r) {
      for (std::int64_t g0 = 0; g0 < cols; g0 += group) {
        const float* in = in0 + r * cols + g0;
        float* out = out0 + r * cols + g0;
        // Mean and variance in double (two passes), as for rms_norm.
        double mean = 0;
        for (std::int64_t c = 0; c < group; ++c) mean += in[c];
        mean /= static_cast<double>(group);
        double var = 0;
        for (std::int64_t c = 0; c < group; ++c) var += (in[c] - mean) * (in[c] - mean);
        const double inv = 1.0 / std::sqrt(var / static_cast<double>(group) + eps);
        for (std::int64_t c = 0; c < group; ++c)
          out[c] = static_cast<float>((in[c] - mean) * inv) * w.f32()[c] + b.f32()[c];
      }
    }
  });
}

void CpuBackend::l2_norm(Tensor& x, std::int64_t group, float eps) {
  if (failed()) return;
  const auto n = x.numel() / group;
  float* base = x.data();
  cpu_parallel_ranges(n, elems(x), [&](std::int64_t g0, std::int64_t g1) {
    for (auto g = g0; g < g1; ++g) {
      float* p = base + g * group;
      const double ss = cpu::sum_squares(p, group);
      const float inv = static_cast<float>(1.0 / std::sqrt(ss + eps));
      for (std::int64_t c = 0; c < group; ++c) p[c] *= inv;
    }
  });
}

void CpuBackend::activate(Tensor& x, Activation act) {
  if (failed()) return;
  float* p = x.data();
  cpu_parallel_ranges(x.numel(), elems(x) * 4, [&](std::int64_t b, std::int64_t e) {
    switch (act) {
      case Activation::kSigmoid:
        return cpu::sigmoid(p + b, e - b);
      case Activation::kSilu:
        return cpu::silu(p + b, e - b);
      default:
        for (auto i = b; i < e; ++i) p[i] = apply_act(p[i], act);
    }
  });
}
void CpuBackend::scale(Tensor& x, float s) {
  if (failed()) return;
  float* p = x.data();
  cpu_parallel_ranges(x.numel(), elems(x), [&](std::int64_t b, std::int64_t e) {
    for (auto i = b; i < e; ++i) p[i] *= s;
  });
}
void CpuBackend::add(Tensor& x, const Tensor& y) {
  if (failed()) return;
  assert(x.numel() == y.numel());
  float* p = x.data();
  const float* q = y.data();
  cpu_parallel_ranges(x.numel(), elems(x), [&](std::int64_t b, std::int64_t e) {
    for (auto i = b; i < e; ++i) p[i] += q[i];
  });
}
void CpuBackend::mul(Tensor& x, const Tensor& y) {
  if (failed()) return;
  assert(x.numel() == y.numel());
  cpu_parallel_ranges(x.numel(), elems(x), [&](std::int64_t b, std::int64_t e) {
    cpu::mul(x.data() + b, y.data() + b, e - b);
  });
}
void CpuBackend::mul_cols(Tensor& x, const Weight& v) {
  if (failed() || !check_vector(v, "mul_cols")) return;
  assert(v.numel() == x.cols());
  const float* vv = v.f32();
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t c = 0; c < x.cols(); ++c) x.row(r)[c] *= vv[c];
}
void CpuBackend::mul_rows(Tensor& x, const Tensor& s) {
  if (failed()) return;
  assert(s.numel() == x.rows());
  const auto cols = x.cols();
  float* p = x.data();
  const float* sv = s.data();
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t c = 0; c < cols; ++c) p[r * cols + c] *= sv[r];
}
void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  if (failed()) return;
  assert(gate.numel() == up.numel());
  if (!ensure(out, gate.shape())) return;
  cpu_parallel_ranges(gate.numel(), elems(gate) * 4, [&](std::int64_t b, std::int64_t e) {
    cpu::swiglu(gate.data() + b, up.data() + b, out.data() + b, e - b);
  });
}
void CpuBackend::swiglu_packed(const Tensor& gu, Tensor& out) {
  if (failed()) return;
  const auto half = gu.cols() / 2;
  if (!ensure(out, {gu.rows(), half})) return;
  cpu_parallel_ranges(gu.rows(), elems(gu) * 2, [&](std::int64_t r0, std::int64_t r1) {
    for (auto r = r0; r < r1; ++r) cpu::swiglu(gu.row(r), gu.row(r) + half, out.row(r), half);
  });
}
void CpuBackend::signed_sqrt(Tensor& x, float floor) {
  if (failed()) return;
  for (auto& v : x.span()) {
    const float s = v > 0 ? 1.0f : (v < 0 ? -1.0f : 0.0f);
    v = s * std::sqrt(std::max(std::fabs(v), floor));
  }
}
void CpuBackend::normalize_rows(Tensor& x) {
  if (failed()) return;
  // fp32 sum in column order, then a division (the k-element step of Q4M 976).
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    float* p = x.row(r);
    float sum = 0;
    for (std::int64_t c = 0; c < x.cols(); ++c) sum += p[c];
    for (std::int64_t c = 0; c < x.cols(); ++c) p[c] /= sum;
  }
}

void CpuBackend::clamp(Tensor& x, float lo, float hi) {
  if (failed()) return;
  float* p = x.data();
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = std::min(std::max(p[i], lo), hi);
}

void CpuBackend::slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width, Tensor& out) {
  if (failed()) return;
  assert(begin >= 0 && begin + width <= x.cols());
  if (!ensure(out, {x.rows(), width})) return;
  for (std::int64_t r = 0; r < x.rows(); ++r) std::copy_n(x.row(r) + begin, width, out.row(r));
}
void CpuBackend::slice_rows(const Tensor& x, std::int64_t begin, std::int64_t count, Tensor& out) {
  if (failed()) return;
  assert(begin >= 0 && count >= 0 && begin + count <= x.rows());
  if (!ensure(out, {count, x.cols()})) return;
  std::copy_n(x.row(begin), count * x.cols(), out.data());
}
void CpuBackend::split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim, Tensor& a,
                                   Tensor& b) {
  if (failed()) return;
  assert(x.cols() == 2 * heads * dim);
  if (!ensure(a, {x.rows(), heads * dim}) || !ensure(b, {x.rows(), heads * dim})) return;
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t h = 0; h < heads; ++h) {
      std::copy_n(x.row(r) + 2 * h * dim, dim, a.row(r) + h * dim);
      std::copy_n(x.row(r) + (2 * h + 1) * dim, dim, b.row(r) + h * dim);
    }
}
void CpuBackend::repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) {
  if (failed()) return;
  if (!ensure(out, {x.rows(), x.cols() * times})) return;
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t s = 0; s < times; ++s)
      std::copy_n(x.row(r), x.cols(), out.row(r) + s * x.cols());
}
void CpuBackend::append_rows(Tensor& cache, const Tensor& x) {
  if (failed()) return;
  const auto cols = x.cols();
  // An empty cache takes x's width (keeping its buffer).
  if ((cache.shape().empty() || cache.rows() == 0) && !ensure(cache, {0, cols})) return;
  assert(cache.cols() == cols && cache.dtype() == DType::kF32 && cache.device() == Device::kHost);
  const auto rows = cache.rows();
  if (!cache.grow_rows(rows + x.rows())) {
    fail(out_of_range("cpu backend: out of memory growing a cache to " +
                      std::to_string(rows + x.rows()) + " rows of " + std::to_string(cols)));
    return;
  }
  std::copy_n(x.data(), x.numel(), cache.row(rows));
}

void CpuBackend::embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                           Tensor& out) {
  if (failed()) return;
  const auto cols = shards.front().cols();
  if (!ensure(out, {static_cast<std::int64_t>(ids.size()), cols})) return;
  const auto per_shard = shards.front().rows();  // row shards are equal (split along dim 0)
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& w = shards[static_cast<std::size_t>(ids[i] / per_shard)];
    const auto row = ids[i] % per_shard;
    // Every format through the quant module's row dequantiser (plain rows are a conversion).
    auto st = w.dequantize_row(
        row, {out.row(static_cast<std::int64_t>(i)), static_cast<std::size_t>(cols)});
    if (!st.ok()) return fail(st.with_context("cpu embedding"));
  }
}

void CpuBackend::stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) {
  if (failed()) return;
  const auto W = x.cols() / streams, cols = x.cols();
  if (!ensure(out, {x.rows(), W})) return;
  const float* in = x.data();
  float* o = out.data();
  const float inv = static_cast<float>(streams);
  cpu_parallel_ranges(x.rows(), elems(x), [&](std::int64_t r0, std::int64_t r1) {
    for (auto r = r0; r < r1; ++r) {
      float* dst = o + r * W;
      const float* src = in + r * cols;
      std::copy_n(src, W, dst);
      for (std::int64_t k = 1; k < streams; ++k)
        for (std::int64_t c = 0; c < W; ++c) dst[c] += src[k * W + c];
      for (std::int64_t c = 0; c < W; ++c) dst[c] /= inv;
    }
  });
}
void CpuBackend::add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) {
  if (failed()) return;
  const auto W = y.cols(), streams = w.cols();
  assert(h.cols() == W * streams && y.rows() == h.rows() && w.rows() == h.rows());
  cpu_parallel_ranges(h.rows(), elems(h), [&](std::int64_t r0, std::int64_t r1) {
    for (auto r = r0; r < r1; ++r) {
      float* hr = h.data() + r * W * streams;
      const float* yr = y.data() + r * W;
      const float* wr = w.data() + r * streams;
      for (std::int64_t s = 0; s < streams; ++s) cpu::axpy(hr + s * W, wr[s], yr, W);
    }
  });
}
void CpuBackend::stream_mix(const Tensor& xn, const Tensor& u, const Weight& up,
                            std::int64_t streams, Tensor& out) {
  if (failed() || !check_elements(up, "stream_mix")) return;
  const auto SW = xn.cols(), rank = u.cols(), W = SW / streams;
  assert(up.rows() == SW && up.cols() == rank && u.rows() == xn.rows() &&
         up.device == Device::kHost);
  if (!ensure(out, {xn.rows(), W})) return;
  // The up weight widened and transposed to [rank][SW], so each rank term is a row update.
  std::vector<float> wide(static_cast<std::size_t>(SW * rank)), upT(wide.size());
  convert_to_f32(up.dtype, up.data, wide.data(), wide.size());
  for (std::int64_t j = 0; j < SW; ++j)
    for (std::int64_t k = 0; k < rank; ++k)
      upT[static_cast<std::size_t>(k * SW + j)] = wide[static_cast<std::size_t>(j * rank + k)];
  const double work = static_cast<double>(xn.rows() * SW) * static_cast<double>(2 * rank + 8);
  cpu_parallel_ranges(xn.rows(), work, [&](std::int64_t r0, std::int64_t r1) {
    thread_local std::vector<float> m;
    m.resize(static_cast<std::size_t>(4 * SW));
    const float* xr[4];
    const float* ur[4];
    float* orow[4];
    for (auto r = r0; r < r1; r += 4) {
      const auto n = std::min<std::int64_t>(4, r1 - r);
      for (std::int64_t i = 0; i < n; ++i) {
        xr[i] = xn.row(r + i);
        ur[i] = u.row(r + i);
        orow[i] = out.row(r + i);
      }
      cpu::stream_mix_rows(xr, ur, n, upT.data(), rank, W, streams, m.data(), orow);
    }
  });
}
void CpuBackend::grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) {
  if (failed()) return;
  assert(a.shape() == b.shape());
  const auto groups = a.cols() / group;
  if (!ensure(out, {a.rows(), groups})) return;
  for (std::int64_t r = 0; r < a.rows(); ++r)
    for (std::int64_t g = 0; g < groups; ++g) {
      double s = 0;
      for (std::int64_t c = g * group; c < (g + 1) * group; ++c)
        s += static_cast<double>(a.row(r)[c]) * b.row(r)[c];
      out.row(r)[g] = static_cast<float>(s);
    }
}

void CpuBackend::rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim, std::int64_t first,
                      std::int64_t stride, double theta) {
  if (failed()) return;
  const auto half = rotary_dim / 2;
  const auto heads = x.cols() / head_dim, cols = x.cols();
  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    // inv_freq in fp32 as the reference builds it, the angle in double.
    inv_freq[static_cast<std::size_t>(i)] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rotary_dim)));
  }
  float* base = x.data();
  cpu_parallel_ranges(x.rows(), elems(x) * 4, [&](std::int64_t r0, std::int64_t r1) {
    std::vector<float> cosv(static_cast<std::size_t>(half)), sinv(static_cast<std::size_t>(half));
    for (auto r = r0; r < r1; ++r) {
      const auto position = first + r * stride;
      for (std::int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(position) * inv_freq[static_cast<std::size_t>(i)];
        cosv[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(angle));
        sinv[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(angle));
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        float* p = base + r * cols + h * head_dim;
        for (std::int64_t i = 0; i < half; ++i) {
          const float a = p[i], b = p[i + half];
          const float c = cosv[static_cast<std::size_t>(i)], s = sinv[static_cast<std::size_t>(i)];
          p[i] = a * c - b * s;
          p[i + half] = b * c + a * s;
        }
      }
    }
  });
}

void CpuBackend::softmax(Tensor& x) {
  if (failed()) return;
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    float* p = x.row(r);
    const float m = *std::max_element(p, p + x.cols());
    double s = 0;
    for (std::int64_t c = 0; c < x.cols(); ++c) s += (p[c] = std::exp(p[c] - m));
    for (std::int64_t c = 0; c < x.cols(); ++c) p[c] = static_cast<float>(p[c] / s);
  }
}

void CpuBackend::topk(const Tensor& x, std::int64_t k, Tensor& idx, Tensor& val) {
  if (failed()) return;
  const auto rows = x.rows();
  if (!ensure(idx, {rows, k}, DType::kI32) || !ensure(val, {rows, k})) return;
  auto* ip = idx.data_as<std::int32_t>();
  float* vp = val.data();
  std::fill(ip, ip + rows * k, -1);
  std::fill(vp, vp + rows * k, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    cpu::topk_row(x.row(r), x.cols(), k, ip + r * k, vp + r * k);
}

namespace {
// A row's largest logit as decode/sampler.cpp target_distribution takes it (std::max in double,
// which passes over NaN).
double max_logit_of(const float* p, std::int64_t cols) {
  double m = -INFINITY;
  for (std::int64_t c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(p[c]));
  return m;
}

// decode/sampler.cpp's target_distribution of a row with no prefix rule, the same expressions in
// the same order: p[c] = exp((l_c - max) / T) / total for every id, and the mass of the ids it
// keeps (those with p > 0), each kept id's probability being p[c] / mass.
double whole_row_distribution(const float* row, std::int64_t cols, double temperature,
                              std::vector<double>& p) {
  p.resize(static_cast<std::size_t>(cols));
  const double max_logit = max_logit_of(row, cols);
  double total = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    p[c] = std::exp((static_cast<double>(row[c]) - max_logit) / temperature);
    total += p[c];
  }
  for (auto& v : p) v /= total;
  double mass = 0;
  for (const double v : p) mass += v > 0.0 ? v : 0.0;
  return mass;
}

// decode/sampler.cpp sample_with over the ids c with terms[c] > 0 (ascending), each with
// probability terms[c] / mass: the same expressions in the same order.
std::int32_t draw_kept(const std::vector<double>& terms, double mass, double u) {
  const auto cols = static_cast<std::int64_t>(terms.size());
  double kept = 0;
  for (const double v : terms)
    if (v > 0.0) kept += v / mass;
  const double target = u * kept;
  double cum = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    if (!(terms[c] > 0.0)) continue;
    cum += terms[c] / mass;
    if (target < cum) return static_cast<std::int32_t>(c);
  }
  // u * mass rounded up to the whole: the last kept id with mass (sample_with's fallback),
  // else the last kept id, else 0 (a row of NaN keeps none).
  for (std::int64_t c = cols; c-- > 0;)
    if (terms[c] > 0.0 && terms[c] / mass > 0) return static_cast<std::int32_t>(c);
  for (std::int64_t c = cols; c-- > 0;)
    if (terms[c] > 0.0) return static_cast<std::int32_t>(c);
  return 0;
}
}  // namespace

void CpuBackend::softmax_denominators(const Tensor& x, double temperature, Tensor& totals) {
  if (failed()) return;
  if (!check(temperature > 0, "softmax_denominators", "temperature must be > 0")) return;
  const auto rows = x.rows(), cols = x.cols();
  if (!ensure(totals, {rows, 1}, DType::kI64)) return;
  auto* out = totals.data_as<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* p = x.row(r);
    const double max_logit = max_logit_of(p, cols);
    // The expression and the order of decode/sampler.cpp target_distribution.
    double total = 0;
    for (std::int64_t c = 0; c < cols; ++c)
      total += std::exp((static_cast<double>(p[c]) - max_logit) / temperature);
    out[r] = std::bit_cast<std::int64_t>(total);
  }
}

void CpuBackend::sample_rows(const Tensor& x, double temperature, std::span<const double> u,
                             Tensor& ids) {
  constexpr const char* kOp = "sample_rows";
  if (failed()) return;
  if (!check(temperature > 0 && x.cols() > 0, kOp, "temperature must be > 0, rows non-empty"))
    return;
  const auto rows = x.rows(), cols = x.cols();
  if (!check(static_cast<std::int64_t>(u.size()) == rows, kOp, "one uniform a row")) return;
  if (!ensure(ids, {rows, 1}, DType::kI32)) return;
  auto* out = ids.data_as<std::int32_t>();
  std::vector<double> p;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double mass = whole_row_distribution(x.row(r), cols, temperature, p);
    out[r] = draw_kept(p, mass, u[static_cast<std::size_t>(r)]);
  }
}

void CpuBackend::sample_residual_rows(const Tensor& p, const Tensor& q, double temperature,
                                      std::span<const double> u, Tensor& ids) {
  constexpr const char* kOp = "sample_residual_rows";
  if (failed()) return;
  if (!check(temperature > 0 && p.cols() > 0 && q.cols() > 0, kOp,
             "temperature must be > 0, rows non-empty"))
    return;
  const auto rows = p.rows(), cols = p.cols(), q_cols = q.cols();
  if (!check(q.rows() == rows && q_cols <= cols && static_cast<std::int64_t>(u.size()) == rows, kOp,
             "rows of p and q in pairs, q no wider than p, one uniform a row"))
    return;
  if (!ensure(ids, {rows, 1}, DType::kI32)) return;
  auto* out = ids.data_as<std::int32_t>();
  std::vector<double> pp, qq, residual;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double p_mass = whole_row_distribution(p.row(r), cols, temperature, pp);
    const double q_mass = whole_row_distribution(q.row(r), q_cols, temperature, qq);
    // decode/sampler.cpp residual_distribution over p's kept ids (ascending): P - Q where it is
    // positive, Q being 0 for an id q does not keep.
    residual.assign(static_cast<std::size_t>(cols), 0.0);
    double mass = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      if (!(pp[c] > 0.0)) continue;
      const double qv = c < q_cols && qq[c] > 0.0 ? qq[c] / q_mass : 0.0;
      const double v = pp[c] / p_mass - qv;
      if (v > 0) {
        residual[c] = v;
        mass += v;
      }
    }
    const double ur = u[static_cast<std::size_t>(r)];
    out[r] =
        mass > 0 && std::isfinite(mass) ? draw_kept(residual, mass, ur) : draw_kept(pp, p_mass, ur);
  }
}

void CpuBackend::token_probs(const Tensor& x, double temperature, std::span<const std::int32_t> ids,
                             Tensor& probs) {
  constexpr const char* kOp = "token_probs";
  if (failed()) return;
  if (!check(temperature > 0 && x.cols() > 0, kOp, "temperature must be > 0, rows non-empty"))
    return;
  const auto rows = x.rows(), cols = x.cols();
  if (!check(static_cast<std::int64_t>(ids.size()) == rows &&
                 std::all_of(ids.begin(), ids.end(),
                             [&](std::int32_t id) { return id >= 0 && id < cols; }),
             kOp, "one id a row, inside the row"))
    return;
  if (!ensure(probs, {rows, 1}, DType::kI64)) return;
  auto* out = probs.data_as<std::int64_t>();
  std::vector<double> p;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double mass = whole_row_distribution(x.row(r), cols, temperature, p);
    const double v = p[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)])];
    out[r] = std::bit_cast<std::int64_t>(v > 0.0 ? v / mass : 0.0);
  }
}

void CpuBackend::penalise_entries(Tensor& x, std::span<const EntryPenalty> entries) {
  if (failed()) return;
  if (!check(entries_inside(x, entries), "penalise_entries", "an entry lies outside x")) return;
  for (const auto& e : entries) {
    float& v = x.row(e.row)[e.col];
    v = e.apply(v);
  }
}

void CpuBackend::argmax_rows(const Tensor& x, Tensor& ids) {
  if (failed()) return;
  const auto rows = x.rows(), cols = x.cols();
  if (!ensure(ids, {rows, 1}, DType::kI32)) return;
  auto* out = ids.data_as<std::int32_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* p = x.row(r);
    std::int64_t best = -1;
    for (std::int64_t c = 0; c < cols; ++c) {
      if (std::isnan(p[c])) continue;
      if (best < 0 || p[c] > p[best]) best = c;  // strict: the lowest index of equals wins
    }
    out[r] = static_cast<std::int32_t>(std::max<std::int64_t>(best, 0));
  }
}

void CpuBackend::select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block,
                               std::int64_t top, Tensor& picked) {
  if (failed()) return;
  const auto S = scores.rows();
  if (!ensure(picked, {S, top}, DType::kI32)) return;
  auto* ip = picked.data_as<std::int32_t>();
  std::fill(ip, ip + S * top, -1);
  cpu_parallel_ranges(S, elems(scores), [&](std::int64_t s0, std::int64_t s1) {
    for (auto s = s0; s < s1; ++s) {
      const auto visible = std::min((first + s + 1) / block, scores.cols());
      cpu::topk_row(scores.row(s), visible, top, ip + s * top, nullptr);
    }
  });
}

void CpuBackend::block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks,
                            std::int64_t group, Tensor& out) {
  if (failed()) return;
  assert(first_row + blocks * group <= x.rows());
  if (!ensure(out, {blocks, x.cols()})) return;
  for (std::int64_t b = 0; b < blocks; ++b)
    for (std::int64_t c = 0; c < x.cols(); ++c) {
      float s = 0;  // fp32 mean, as the reference (.float().mean())
      for (std::int64_t j = 0; j < group; ++j) s += x.row(first_row + b * group + j)[c];
      out.row(b)[c] = s / static_cast<float>(group);
    }
}

void CpuBackend::kpool_compress(const Tensor& keys, const Tensor& gate, const Weight& ape,
                                std::int64_t pool, std::int64_t first_row, std::int64_t pools,
                                Tensor& out) {
  if (failed() || !check_vector(ape, "kpool_compress")) return;
  const auto dim = keys.cols();
  assert(gate.cols() == dim && ape.numel() == pool * dim &&
         first_row + pools * pool <= keys.rows());
  if (!ensure(out, {pools, dim})) return;
  const float* a = ape.f32();
  std::vector<float> logit(static_cast<std::size_t>(pool));
  for (std::int64_t p = 0; p < pools; ++p) {
    const auto r0 = first_row + p * pool;
    for (std::int64_t c = 0; c < dim; ++c) {
      float mx = -INFINITY;
      for (std::int64_t j = 0; j < pool; ++j) {
        logit[static_cast<std::size_t>(j)] = gate.row(r0 + j)[c] + a[j * dim + c];
        mx = std::max(mx, logit[static_cast<std::size_t>(j)]);
      }
      double sum = 0, acc = 0;
      for (std::int64_t j = 0; j < pool; ++j) {
        const double e = std::exp(static_cast<double>(logit[static_cast<std::size_t>(j)]) - mx);
        sum += e;
        acc += e * keys.row(r0 + j)[c];
      }
      out.row(p)[c] = static_cast<float>(acc / sum);
    }
  }
}

// The block keys are transposed into tiles of kIndexTile (zero-padded), then each thread
// scores every query against its share of the tiles, four queries at a time.
void CpuBackend::index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                              Tensor& out) {
  if (failed()) return;
  const auto dim = keys.cols(), B = keys.shape().empty() ? 0 : keys.rows(), S = q.rows();
  assert(q.cols() == heads * dim);
  if (!ensure(out, {S, B})) return;
  if (B == 0 || S == 0) return;
  constexpr auto T = cpu::kIndexTile;
  const auto tiles = (B + T - 1) / T;
  std::vector<float> kt(static_cast<std::size_t>(tiles * dim * T), 0.0f);
  for (std::int64_t b = 0; b < B; ++b) {
    const float* key = keys.row(b);
    float* tile = kt.data() + (b / T) * dim * T + b % T;
    for (std::int64_t c = 0; c < dim; ++c) tile[c * T] = key[c];
  }
  const double work = 2.0 * static_cast<double>(S * B) * static_cast<double>(heads * dim);
  cpu_parallel_ranges(tiles, work, [&](std::int64_t t0, std::int64_t t1) {
    float o[4][T];
    float* op[4] = {o[0], o[1], o[2], o[3]};
    const float* qp[4];
    for (auto t = t0; t < t1; ++t) {
      const auto b0 = t * T, valid = std::min(T, B - b0);
      for (std::int64_t s = 0; s < S; s += 4) {
        const auto nq = std::min<std::int64_t>(4, S - s);
        for (std::int64_t r = 0; r < nq; ++r) qp[r] = q.row(s + r);
        cpu::index_scores_tile(qp, nq, heads, dim, kt.data() + t * dim * T, scale, op);
        for (std::int64_t r = 0; r < nq; ++r) std::copy_n(o[r], valid, out.row(s + r) + b0);
      }
    }
  });
}

}  // namespace fs
