// Compiled with -ffp-contract=fast (CMakeLists.txt): a*b+c becomes one FMA where the CPU has it.
#include "backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace fs::cpu {
namespace {

// Every kernel below exists in three versions; the loader picks the best the CPU runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FS_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FS_CPU_CLONES
#endif

// 16 floats / 8 doubles: one AVX-512 register (two AVX2 ones, four SSE ones). The *_u types
// read and write unaligned float arrays in place (no helper functions: a vector passed by value
// outside the cloned functions would change the ABI with the instruction set).
using f16v = float __attribute__((vector_size(64)));
using d8v = double __attribute__((vector_size(64)));
using f16u = float __attribute__((vector_size(64), aligned(4), may_alias));
using f8u = float __attribute__((vector_size(32), aligned(4), may_alias));

// expf with Cephes' range reduction and polynomial: exp(x) = 2^n exp(r), n = round(x log2 e),
// r = x - n ln 2 in two parts, exp(r) by a degree-6 polynomial on |r| <= ln2/2; 2^n is applied as
// two factors, each a normal float, so results down to the subnormals are right. Inputs are
// clamped to [-104, 88.72] (below, the result is 0 in float; above, it would overflow).
// Within 1 ulp of the correctly rounded exp over [-103, 88.72] (cpu_kernels.h).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -104.0f), 88.72283f);
  // Round to nearest by the 1.5 * 2^23 trick (|x log2 e| < 2^22).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni / 2;
  const std::int32_t b1 = (half + 127) << 23, b2 = (ni - half + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  return y * s1 * s2;
}

}  // namespace

FS_CPU_CLONES double sum_squares(const float* x, std::int64_t n) {
  d8v a0 = {}, a1 = {};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto lo = __builtin_convertvector(*reinterpret_cast<const f8u*>(x + i), d8v);
    const auto hi = __builtin_convertvector(*reinterpret_cast<const f8u*>(x + i + 8), d8v);
    a0 += lo * lo;
    a1 += hi * hi;
  }
  double s = 0;
  for (int l = 0; l < 8; ++l) s += a0[l];
  for (int l = 0; l < 8; ++l) s += a1[l];
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

FS_CPU_CLONES void scale_mul(const float* x, float s, const float* w, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * s * w[i];
}

FS_CPU_CLONES void sigmoid(float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + exp_approx(-x[i]));
}

FS_CPU_CLONES void silu(float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + exp_approx(-x[i]));
}

FS_CPU_CLONES void swiglu(const float* gate, const float* up, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
}

FS_CPU_CLONES void mul(float* x, const float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= y[i];
}

FS_CPU_CLONES void mul_gate(float* x, const float* gate, std::int64_t n, bool silu) {
  if (silu) {
    for (std::int64_t i = 0; i < n; ++i) x[i] *= gate[i] / (1.0f + exp_approx(-gate[i]));
  } else {
    for (std::int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + exp_approx(-gate[i]));
  }
}

FS_CPU_CLONES void axpy(float* x, float a, const float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] += a * y[i];
}

// Up to four rows at once, m in chunks of 64 columns (4 rows x 4 vectors accumulated over the
// rank in registers), so the up weight (rank x streams*W, larger than L1) is read once per four
// rows; then the sigmoid, product and stream sum per row in L1.
FS_CPU_CLONES void stream_mix_rows(const float* const* xn, const float* const* u, std::int64_t rows,
                                   const float* upT, std::int64_t rank, std::int64_t W,
                                   std::int64_t streams, float* m, float* const* out) {
  const auto SW = streams * W;
  const float* ur[4];
  for (int r = 0; r < 4; ++r) ur[r] = u[r < rows ? r : 0];
  std::int64_t c0 = 0;
  for (; c0 + 64 <= SW; c0 += 64) {
    f16v a[4][4] = {};
    for (std::int64_t k = 0; k < rank; ++k) {
      const float* row = upT + k * SW + c0;
      f16v w[4];
      for (int v = 0; v < 4; ++v) w[v] = *reinterpret_cast<const f16u*>(row + 16 * v);
      for (int r = 0; r < 4; ++r) {
        const float uk = ur[r][k];
        for (int v = 0; v < 4; ++v) a[r][v] += uk * w[v];
      }
    }
    for (std::int64_t r = 0; r < rows; ++r)
      for (int v = 0; v < 4; ++v) *reinterpret_cast<f16u*>(m + r * SW + c0 + 16 * v) = a[r][v];
  }
  for (; c0 < SW; ++c0)
    for (std::int64_t r = 0; r < rows; ++r) {
      float a = 0;
      for (std::int64_t k = 0; k < rank; ++k) a += ur[r][k] * upT[k * SW + c0];
      m[r * SW + c0] = a;
    }
  const float n = static_cast<float>(streams);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* mr = m + r * SW;
    const float* x = xn[r];
    for (std::int64_t j = 0; j < SW; ++j) mr[j] = 1.0f / (1.0f + exp_approx(-mr[j])) * x[j];
    float* o = out[r];
    std::copy_n(mr, W, o);
    for (std::int64_t s = 1; s < streams; ++s)
      for (std::int64_t c = 0; c < W; ++c) o[c] += mr[s * W + c];
    for (std::int64_t c = 0; c < W; ++c) o[c] /= n;
  }
}

// Four queries x four vectors of 16 blocks: 16 accumulators, each key vector loaded once per
// dimension for the four queries; the heads' relu'd sums are added, in head order, into totals
// kept beside (one load and store per head and vector).
FS_CPU_CLONES void index_scores_tile(const float* const* q, std::int64_t nq, std::int64_t heads,
                                     std::int64_t dim, const float* kt, float scale,
                                     float* const* o) {
  static_assert(kIndexTile == 64);
  const float* qs[4];
  for (int r = 0; r < 4; ++r) qs[r] = q[r < nq ? r : 0];
  alignas(64) float tot[4][kIndexTile] = {};
  const f16v zero = {};
  for (std::int64_t h = 0; h < heads; ++h) {
    f16v a[4][4] = {};
    const float* q0 = qs[0] + h * dim;
    const float* q1 = qs[1] + h * dim;
    const float* q2 = qs[2] + h * dim;
    const float* q3 = qs[3] + h * dim;
    for (std::int64_t c = 0; c < dim; ++c) {
      const float* row = kt + c * kIndexTile;
      f16v kv[4];
      for (int j = 0; j < 4; ++j) kv[j] = *reinterpret_cast<const f16u*>(row + 16 * j);
      const float x0 = q0[c], x1 = q1[c], x2 = q2[c], x3 = q3[c];
      for (int j = 0; j < 4; ++j) {
        a[0][j] += x0 * kv[j];
        a[1][j] += x1 * kv[j];
        a[2][j] += x2 * kv[j];
        a[3][j] += x3 * kv[j];
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 4; ++j) {
        auto* t = reinterpret_cast<f16v*>(tot[r] + 16 * j);
        *t += a[r][j] > zero ? a[r][j] : zero;
      }
  }
  for (std::int64_t r = 0; r < nq; ++r)
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<f16u*>(o[r] + 16 * j) =
          *reinterpret_cast<const f16v*>(tot[r] + 16 * j) * scale;
}

FS_CPU_CLONES void attention_heads(const float* q, std::int64_t rep, std::int64_t D, const float* k,
                                   const float* v, std::int64_t ld, const std::int32_t* idx,
                                   std::int64_t n, float scale, float* out) {
  thread_local std::vector<float> scratch;
  const auto need = static_cast<std::size_t>(D * n + rep * n);
  if (scratch.size() < need) scratch.resize(need);
  float* KT = scratch.data();  // [D][n]: the keys transposed
  float* P = KT + D * n;       // [rep][n]
  // The rows are scattered over a long cache: ask for all of them before the first is needed.
  for (std::int64_t i = 0; i < n; ++i) {
    const auto at = static_cast<std::int64_t>(idx[i]) * ld;
    for (std::int64_t x = 0; x < D; x += 16) {
      __builtin_prefetch(k + at + x);
      __builtin_prefetch(v + at + x);
    }
  }
  // Transposed by columns: each is a gather over the keys' rows (vector gathers where the CPU
  // version has them).
  thread_local std::vector<std::int32_t> offsets;
  offsets.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    offsets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(idx[i] * ld);
  const std::int32_t* off = offsets.data();
  for (std::int64_t x = 0; x < D; ++x) {
    const float* kx = k + x;
    float* row = KT + x * n;
    for (std::int64_t i = 0; i < n; ++i) row[i] = kx[off[i]];
  }
  for (std::int64_t r = 0; r < rep; ++r) {
    float* p = P + r * n;
    const float* qr = q + r * D;
    std::fill(p, p + n, 0.0f);
    for (std::int64_t x = 0; x < D; ++x) {
      const float a = qr[x];
      const float* kt = KT + x * n;
      for (std::int64_t i = 0; i < n; ++i) p[i] += a * kt[i];
    }
    float m = -INFINITY;
    for (std::int64_t i = 0; i < n; ++i) {
      p[i] *= scale;
      m = std::max(m, p[i]);
    }
    for (std::int64_t i = 0; i < n; ++i) p[i] = exp_approx(p[i] - m);
    double z = 0;
    for (std::int64_t i = 0; i < n; ++i) z += p[i];
    float* o = out + r * D;
    std::fill(o, o + D, 0.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      const float w = static_cast<float>(p[i] / z);
      const float* vi = v + static_cast<std::int64_t>(idx[i]) * ld;
      for (std::int64_t x = 0; x < D; ++x) o[x] += w * vi[x];
    }
  }
}

FS_CPU_CLONES void causal_conv_rows(const float* x, const float* wt, std::int64_t C, std::int64_t K,
                                    std::int64_t dilation, std::int64_t rows, float* y) {
  for (std::int64_t t = 0; t < rows; ++t) {
    float* out = y + t * C;
    std::fill(out, out + C, 0.0f);
    for (std::int64_t j = 0; j < K; ++j) {
      const float* w = wt + j * C;
      const float* in = x + (t + j * dilation) * C;
      for (std::int64_t c = 0; c < C; ++c) out[c] += w[c] * in[c];
    }
  }
}

FS_CPU_CLONES void exp_diff(float a, const float* x, float* out, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = exp_approx(a - x[j]);
}

FS_CPU_CLONES void mul_exp_diff(const float* x, const float* a, const float* b, float* out,
                                std::int64_t n) {
  if (b == nullptr) {
    for (std::int64_t j = 0; j < n; ++j) out[j] = x[j] * exp_approx(a[j]);
  } else {
    for (std::int64_t j = 0; j < n; ++j) out[j] = x[j] * exp_approx(a[j] - b[j]);
  }
}

FS_CPU_CLONES void unit_lower_inverse64(const float* A, std::int64_t n, float* T) {
  constexpr int L = 64, V = 4;  // 4 vectors of 16 per row
  for (std::int64_t i = 0; i < L; ++i) {
    f16v acc[V] = {};
    if (i < n) {
      for (std::int64_t j = 0; j < i; ++j) {
        const float a = A[i * L + j];
        const float* tj = T + j * L;
        for (int x = 0; x < V; ++x) acc[x] -= a * *reinterpret_cast<const f16u*>(tj + 16 * x);
      }
      acc[i / 16][i % 16] += 1.0f;
    }
    for (int x = 0; x < V; ++x) *reinterpret_cast<f16u*>(T + i * L + 16 * x) = acc[x];
  }
}

// A tile of 32 value columns (two vectors) is carried through all the tokens: the state's rows
// for it, [dk][32], stay in L1, and the two vectors with four partial sums each give eight
// independent FMA chains.
FS_CPU_CLONES void delta_rule_recurrent_head(const DeltaRuleHead& h, float* state) {
  constexpr std::int64_t TW = 32;
  const auto dk = h.dk, dv = h.dv;
  thread_local std::vector<float> tile_buf, decay_buf;
  tile_buf.resize(static_cast<std::size_t>(dk * TW));
  decay_buf.resize(static_cast<std::size_t>(dk));
  float* tile = tile_buf.data();
  float* decay = decay_buf.data();
  auto row = [&](std::int64_t i, int half) {
    return reinterpret_cast<f16u*>(tile + i * TW + 16 * half);
  };
  for (std::int64_t x0 = 0; x0 < dv; x0 += TW) {
    const auto w = std::min(TW, dv - x0);
    std::fill(tile, tile + dk * TW, 0.0f);
    for (std::int64_t i = 0; i < dk; ++i) std::copy_n(state + i * dv + x0, w, tile + i * TW);
    for (std::int64_t t = 0; t < h.tokens; ++t) {
      const float* kt = h.k + t * h.ldk;
      const float* qt = h.q + t * h.ldq;
      const float* vt = h.v + t * h.ldv + x0;
      const float* gt = h.g + t * h.ldg;
      if (h.gstep == 0) {
        // One decay for every row: the same product per row as a per-channel decay of equal
        // values, so both forms are one loop.
        std::fill(decay, decay + dk, std::exp(gt[0]));
      } else {
        for (std::int64_t r = 0; r < dk; ++r) decay[r] = std::exp(gt[r * h.gstep]);
      }
      const float b = h.beta[t * h.ldb];
      // S *= diag(decay); mem = S^T k, in four partial sums per vector (rows i mod 4).
      f16v m0[4] = {}, m1[4] = {};
      std::int64_t i = 0;
      for (; i + 4 <= dk; i += 4) {
        for (int p = 0; p < 4; ++p) {
          const f16v s0 = *row(i + p, 0) * decay[i + p], s1 = *row(i + p, 1) * decay[i + p];
          *row(i + p, 0) = s0;
          *row(i + p, 1) = s1;
          m0[p] += kt[i + p] * s0;
          m1[p] += kt[i + p] * s1;
        }
      }
      for (; i < dk; ++i) {
        const f16v s0 = *row(i, 0) * decay[i], s1 = *row(i, 1) * decay[i];
        *row(i, 0) = s0;
        *row(i, 1) = s1;
        m0[0] += kt[i] * s0;
        m1[0] += kt[i] * s1;
      }
      float vbuf[TW] = {};
      std::copy_n(vt, w, vbuf);
      const f16v d0 =
          (*reinterpret_cast<const f16u*>(vbuf) - ((m0[0] + m0[1]) + (m0[2] + m0[3]))) * b;
      const f16v d1 =
          (*reinterpret_cast<const f16u*>(vbuf + 16) - ((m1[0] + m1[1]) + (m1[2] + m1[3]))) * b;
      // S += k delta^T; o = S^T q.
      f16v o0[4] = {}, o1[4] = {};
      for (i = 0; i + 4 <= dk; i += 4) {
        for (int p = 0; p < 4; ++p) {
          const f16v s0 = *row(i + p, 0) + kt[i + p] * d0, s1 = *row(i + p, 1) + kt[i + p] * d1;
          *row(i + p, 0) = s0;
          *row(i + p, 1) = s1;
          o0[p] += qt[i + p] * s0;
          o1[p] += qt[i + p] * s1;
        }
      }
      for (; i < dk; ++i) {
        const f16v s0 = *row(i, 0) + kt[i] * d0, s1 = *row(i, 1) + kt[i] * d1;
        *row(i, 0) = s0;
        *row(i, 1) = s1;
        o0[0] += qt[i] * s0;
        o1[0] += qt[i] * s1;
      }
      float obuf[TW];
      *reinterpret_cast<f16u*>(obuf) = (o0[0] + o0[1]) + (o0[2] + o0[3]);
      *reinterpret_cast<f16u*>(obuf + 16) = (o1[0] + o1[1]) + (o1[2] + o1[3]);
      std::copy_n(obuf, w, h.out + t * h.ldo + x0);
    }
    for (std::int64_t i = 0; i < dk; ++i) std::copy_n(tile + i * TW, w, state + i * dv + x0);
  }
}

namespace {

// The largest lane of v (by reference: a vector passed by value outside the cloned functions
// would change the ABI with the instruction set; inlined, it takes the caller's).
__attribute__((always_inline)) inline float hmax(const f16v& v) {
  const f16v a =
      __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  const f16v m1 = v > a ? v : a;
  const f16v b = __builtin_shufflevector(m1, m1, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  const f16v m2 = m1 > b ? m1 : b;
  return std::max(std::max(m2[0], m2[1]), std::max(m2[2], m2[3]));
}

// Offers p[i] to the sorted best list idx[0, have) (values in vals) of capacity take (value
// descending, index ascending). Entries are offered in increasing index order, so an entry equal to
// the list's last loses (its index is higher): only a strictly larger value enters a full list.
inline void topk_offer(const float* p, std::int64_t i, std::int64_t take, std::int64_t& have,
                       std::int32_t* idx, float* vals) {
  const float x = p[i];
  if (have == take && !(x > vals[take - 1])) return;
  auto at = have < take ? have++ : take - 1;
  while (at > 0 && x > vals[at - 1]) {
    idx[at] = idx[at - 1];
    vals[at] = vals[at - 1];
    --at;
  }
  idx[at] = static_cast<std::int32_t>(i);
  vals[at] = x;
}

}  // namespace

// One pass in index order, after a floor below which no entry can be picked; only a few per cent
// of a long row reach it, and the vector compares below find those.
FS_CPU_CLONES void topk_row(const float* p, std::int64_t n, std::int64_t k, std::int32_t* idx,
                            float* val) {
  const auto take = std::min(k, n);
  if (take <= 0) return;
  // A floor: the row viewed as 16 interleaved lanes (entry j in lane j % 16), the k-th largest
  // of the lanes' maxima. k different entries reach it (one per lane), so an entry below it can
  // never be picked; on a long row only a few per cent reach it. One vector max per 16 entries.
  float floor = -INFINITY;
  if (take <= 16 && n >= 16) {
    f16v lanes = *reinterpret_cast<const f16u*>(p);
    for (std::int64_t j = 16; j + 16 <= n; j += 16) {
      const f16v v = *reinterpret_cast<const f16u*>(p + j);
      lanes = v > lanes ? v : lanes;
    }
    float m[16];
    for (int l = 0; l < 16; ++l) m[l] = lanes[l];
    std::partial_sort(m, m + take, m + 16, [](float x, float y) { return x > y; });
    // A NaN lane (what a row with NaNs yields is unspecified) must not stop every entry.
    floor = m[take - 1] == m[take - 1] ? m[take - 1] : -INFINITY;
  }
  // The list's values beside its indices (no indirect loads while inserting).
  thread_local std::vector<float> kept;
  kept.resize(static_cast<std::size_t>(take));
  float* vals = kept.data();
  std::int64_t have = 0, i = 0;
  auto offer = [&](std::int64_t j) {
    if (p[j] >= floor) topk_offer(p, j, take, have, idx, vals);
  };
  // 16 entries at a time: a vector whose largest entry (a horizontal max; a NaN may hide a lane,
  // which is allowed: what a row with NaNs yields is unspecified) cannot enter is skipped, that
  // is one below the floor while the list fills and one not above its last value once it is
  // full; the entries of the rest are offered one by one (each checked against the list as it is
  // then).
  for (; i + 16 <= n; i += 16) {
    const f16v v = *reinterpret_cast<const f16u*>(p + i);
    const float top = hmax(v);
    if (have == take ? !(top > vals[take - 1]) : !(top >= floor)) continue;
    for (auto j = i; j < i + 16; ++j) offer(j);
  }
  for (; i < n; ++i) offer(i);
  if (val != nullptr) std::copy_n(vals, have, val);
}

}  // namespace fs::cpu
