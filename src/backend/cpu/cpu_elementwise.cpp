// Norms, elementwise ops, layout moves, hyper-connection stream ops, RoPE, embeddings.
#include <algorithm>
#include <cassert>
#include <cmath>

#include "backend/cpu/cpu_backend.h"

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
  }
  return v;
}

void ensure_shape(Tensor& t, const Shape& s) {
  if (t.shape() != s) t.reset(s);
}

}  // namespace

void CpuBackend::rms_norm(const Tensor& x, std::span<const float> w, std::int64_t group, float eps,
                          bool unit_offset, Tensor& y) {
  const auto cols = x.cols();
  // w spans the whole row, or one group (a per-head norm shared by every head).
  assert(cols % group == 0 && cols % static_cast<std::int64_t>(w.size()) == 0);
  if (&y != &x) ensure_shape(y, x.shape());
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    const float* in = x.row(r);
    float* out = y.row(r);
    for (std::int64_t g0 = 0; g0 < cols; g0 += group) {
      // Sum in double: the reference norms in fp32 of float64-accurate values.
      double ss = 0;
      for (std::int64_t c = 0; c < group; ++c) ss += static_cast<double>(in[g0 + c]) * in[g0 + c];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(group) + eps));
      for (std::int64_t c = g0; c < g0 + group; ++c) {
        const float wc = w[static_cast<std::size_t>(c) % w.size()];
        out[c] = in[c] * inv * (unit_offset ? 1.0f + wc : wc);
      }
    }
  }
}

void CpuBackend::rms_norm_gated(const Tensor& x, std::span<const float> w, const Tensor& gate,
                                float eps, Activation act, Tensor& y) {
  const auto group = static_cast<std::int64_t>(w.size());
  rms_norm(x, w, group, eps, /*unit_offset=*/false, y);
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data()[i] *= apply_act(gate.data()[i], act);
}

void CpuBackend::l2_norm(Tensor& x, std::int64_t group, float eps) {
  const auto n = x.numel() / group;
  for (std::int64_t g = 0; g < n; ++g) {
    float* p = x.data() + g * group;
    double ss = 0;
    for (std::int64_t c = 0; c < group; ++c) ss += static_cast<double>(p[c]) * p[c];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss + eps));
    for (std::int64_t c = 0; c < group; ++c) p[c] *= inv;
  }
}

void CpuBackend::activate(Tensor& x, Activation act) {
  for (auto& v : x.span()) v = apply_act(v, act);
}
void CpuBackend::scale(Tensor& x, float s) {
  for (auto& v : x.span()) v *= s;
}
void CpuBackend::add(Tensor& x, const Tensor& y) {
  assert(x.numel() == y.numel());
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] += y.data()[i];
}
void CpuBackend::mul(Tensor& x, const Tensor& y) {
  assert(x.numel() == y.numel());
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] *= y.data()[i];
}
void CpuBackend::mul_cols(Tensor& x, std::span<const float> v) {
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t c = 0; c < x.cols(); ++c) x.row(r)[c] *= v[static_cast<std::size_t>(c)];
}
void CpuBackend::mul_rows(Tensor& x, const Tensor& s) {
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t c = 0; c < x.cols(); ++c) x.row(r)[c] *= s.data()[r];
}
void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  ensure_shape(out, gate.shape());
  for (std::int64_t i = 0; i < gate.numel(); ++i)
    out.data()[i] = apply_act(gate.data()[i], Activation::kSilu) * up.data()[i];
}
void CpuBackend::swiglu_packed(const Tensor& gu, Tensor& out) {
  const auto half = gu.cols() / 2;
  ensure_shape(out, {gu.rows(), half});
  for (std::int64_t r = 0; r < gu.rows(); ++r)
    for (std::int64_t c = 0; c < half; ++c)
      out.row(r)[c] = apply_act(gu.row(r)[c], Activation::kSilu) * gu.row(r)[half + c];
}
void CpuBackend::signed_sqrt(Tensor& x, float floor) {
  for (auto& v : x.span()) {
    const float s = v > 0 ? 1.0f : (v < 0 ? -1.0f : 0.0f);
    v = s * std::sqrt(std::max(std::fabs(v), floor));
  }
}

void CpuBackend::slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width, Tensor& out) {
  ensure_shape(out, {x.rows(), width});
  for (std::int64_t r = 0; r < x.rows(); ++r) std::copy_n(x.row(r) + begin, width, out.row(r));
}
void CpuBackend::split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim, Tensor& a,
                                   Tensor& b) {
  ensure_shape(a, {x.rows(), heads * dim});
  ensure_shape(b, {x.rows(), heads * dim});
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t h = 0; h < heads; ++h) {
      std::copy_n(x.row(r) + 2 * h * dim, dim, a.row(r) + h * dim);
      std::copy_n(x.row(r) + (2 * h + 1) * dim, dim, b.row(r) + h * dim);
    }
}
void CpuBackend::repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) {
  ensure_shape(out, {x.rows(), x.cols() * times});
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t s = 0; s < times; ++s)
      std::copy_n(x.row(r), x.cols(), out.row(r) + s * x.cols());
}
void CpuBackend::gather_rows(const Tensor& x, std::span<const std::int32_t> idx, Tensor& out) {
  ensure_shape(out, {static_cast<std::int64_t>(idx.size()), x.cols()});
  for (std::size_t i = 0; i < idx.size(); ++i)
    std::copy_n(x.row(idx[i]), x.cols(), out.row(static_cast<std::int64_t>(i)));
}
void CpuBackend::scatter_add_rows(Tensor& out, std::span<const std::int32_t> idx, const Tensor& y,
                                  std::span<const float> w) {
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const float* src = y.row(static_cast<std::int64_t>(i));
    float* dst = out.row(idx[i]);
    for (std::int64_t c = 0; c < out.cols(); ++c) dst[c] += w[i] * src[c];
  }
}
void CpuBackend::append_rows(Tensor& cache, const Tensor& x) {
  const auto cols = x.cols();
  const auto rows = cache.shape().empty() ? 0 : cache.rows();
  cache.storage().insert(cache.storage().end(), x.span().begin(), x.span().end());
  cache.reshape({rows + x.rows(), cols});
}

void CpuBackend::embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                           Tensor& out) {
  const auto cols = shards.front().cols();
  ensure_shape(out, {static_cast<std::int64_t>(ids.size()), cols});
  const auto per_shard = shards.front().rows();  // row shards are equal (split along dim 0)
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& w = shards[static_cast<std::size_t>(ids[i] / per_shard)];
    const auto row = ids[i] % per_shard;
    const auto esize = dtype_size(w.dtype);
    convert_to_f32(w.dtype, w.data + static_cast<std::size_t>(row * cols) * esize,
                   out.row(static_cast<std::int64_t>(i)), static_cast<std::size_t>(cols));
  }
}

void CpuBackend::stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) {
  const auto W = x.cols() / streams;
  ensure_shape(out, {x.rows(), W});
  for (std::int64_t r = 0; r < x.rows(); ++r)
    for (std::int64_t c = 0; c < W; ++c) {
      float s = 0;
      for (std::int64_t k = 0; k < streams; ++k) s += x.row(r)[k * W + c];
      out.row(r)[c] = s / static_cast<float>(streams);
    }
}
void CpuBackend::add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) {
  const auto W = y.cols(), streams = w.cols();
  for (std::int64_t r = 0; r < h.rows(); ++r)
    for (std::int64_t s = 0; s < streams; ++s) {
      const float ws = w.row(r)[s];
      for (std::int64_t c = 0; c < W; ++c) h.row(r)[s * W + c] += ws * y.row(r)[c];
    }
}
void CpuBackend::grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) {
  const auto groups = a.cols() / group;
  ensure_shape(out, {a.rows(), groups});
  for (std::int64_t r = 0; r < a.rows(); ++r)
    for (std::int64_t g = 0; g < groups; ++g) {
      double s = 0;
      for (std::int64_t c = g * group; c < (g + 1) * group; ++c)
        s += static_cast<double>(a.row(r)[c]) * b.row(r)[c];
      out.row(r)[g] = static_cast<float>(s);
    }
}

void CpuBackend::rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim,
                      std::span<const std::int64_t> positions, double theta) {
  const auto half = rotary_dim / 2;
  const auto heads = x.cols() / head_dim;
  std::vector<float> cosv(static_cast<std::size_t>(half)), sinv(static_cast<std::size_t>(half));
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    for (std::int64_t i = 0; i < half; ++i) {
      // inv_freq in fp32 as the reference builds it, the angle in double.
      const float inv_freq = static_cast<float>(
          1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rotary_dim)));
      const double angle = static_cast<double>(positions[static_cast<std::size_t>(r)]) * inv_freq;
      cosv[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(angle));
      sinv[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(angle));
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      float* p = x.row(r) + h * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = p[i], b = p[i + half];
        const float c = cosv[static_cast<std::size_t>(i)], s = sinv[static_cast<std::size_t>(i)];
        p[i] = a * c - b * s;
        p[i + half] = b * c + a * s;
      }
    }
  }
}

void CpuBackend::softmax(Tensor& x) {
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    float* p = x.row(r);
    const float m = *std::max_element(p, p + x.cols());
    double s = 0;
    for (std::int64_t c = 0; c < x.cols(); ++c) s += (p[c] = std::exp(p[c] - m));
    for (std::int64_t c = 0; c < x.cols(); ++c) p[c] = static_cast<float>(p[c] / s);
  }
}

void CpuBackend::topk(const Tensor& x, std::int64_t k, std::span<const std::int64_t> counts,
                      std::vector<std::int32_t>& idx, std::vector<float>& val) {
  idx.assign(static_cast<std::size_t>(x.rows() * k), -1);
  val.assign(static_cast<std::size_t>(x.rows() * k), 0.0f);
  std::vector<std::int32_t> order;
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    const auto n = counts.empty() ? x.cols() : counts[static_cast<std::size_t>(r)];
    const float* p = x.row(r);
    order.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      order[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    const auto take = std::min(k, n);
    std::partial_sort(order.begin(), order.begin() + take, order.end(),
                      [&](auto a, auto b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (std::int64_t i = 0; i < take; ++i) {
      idx[static_cast<std::size_t>(r * k + i)] = order[static_cast<std::size_t>(i)];
      val[static_cast<std::size_t>(r * k + i)] = p[order[static_cast<std::size_t>(i)]];
    }
  }
}

void CpuBackend::block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks,
                            std::int64_t group, Tensor& out) {
  ensure_shape(out, {blocks, x.cols()});
  for (std::int64_t b = 0; b < blocks; ++b)
    for (std::int64_t c = 0; c < x.cols(); ++c) {
      float s = 0;  // fp32 mean, as the reference (.float().mean())
      for (std::int64_t j = 0; j < group; ++j) s += x.row(first_row + b * group + j)[c];
      out.row(b)[c] = s / static_cast<float>(group);
    }
}

void CpuBackend::index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                              Tensor& out) {
  const auto dim = keys.cols(), B = keys.shape().empty() ? 0 : keys.rows();
  ensure_shape(out, {q.rows(), B});
  for (std::int64_t s = 0; s < q.rows(); ++s)
    for (std::int64_t b = 0; b < B; ++b) {
      float total = 0;
      for (std::int64_t h = 0; h < heads; ++h) {
        float d = 0;
        for (std::int64_t c = 0; c < dim; ++c) d += q.row(s)[h * dim + c] * keys.row(b)[c];
        total += d > 0 ? d : 0;
      }
      out.row(s)[b] = total * scale;
    }
}

}  // namespace fs
