// The CPU backend's inner loops that are not products OpenBLAS does (cpu_kernels.cpp): plain
// functions on pointers and sizes, each compiled for AVX-512, AVX2+FMA and baseline x86-64 and
// picked at load time by the CPU (GCC function multi-versioning), so one binary runs anywhere
// and uses the vector units it finds. Loops are written so that the vectorised dimension is
// never a reduction: every element's sum runs in the same order in every version.
#pragma once

#include <cstdint>

namespace fs::cpu {

// Sum of x[i]^2 in double (16 interleaved partial sums, then added in order).
double sum_squares(const float* x, std::int64_t n);
// y[i] = x[i] * s * w[i]  (x and y may be the same).
void scale_mul(const float* x, float s, const float* w, float* y, std::int64_t n);

// In place: sigmoid and silu (x * sigmoid(x)), through a vectorised expf that is within 1 ulp
// of the correctly rounded exp over [-103, 88.72] (CpuOps.VectorExpIsWithinOneUlp).
void sigmoid(float* x, std::int64_t n);
void silu(float* x, std::int64_t n);
// out[i] = silu(gate[i]) * up[i].
void swiglu(const float* gate, const float* up, float* out, std::int64_t n);
// x[i] *= y[i].
void mul(float* x, const float* y, std::int64_t n);
// x[i] *= sigmoid(gate[i]), or silu(gate[i]) when `silu`.
void mul_gate(float* x, const float* gate, std::int64_t n, bool silu);
// x[i] += a * y[i].
void axpy(float* x, float a, const float* y, std::int64_t n);

// Up to four rows (xn[r], u[r], out[r], r < rows <= 4) of the hyper-connection stream mix
// (backend.h stream_mix): with upT [rank][streams*W] (the up weight transposed),
// out[c] = (sum over s, in order, of sigmoid(m[s*W + c]) * xn[s*W + c]) / streams,
// m[j] = sum over k, in order, of u[k] * upT[k][j]. `m` is scratch of 4*streams*W floats.
void stream_mix_rows(const float* const* xn, const float* const* u, std::int64_t rows,
                     const float* upT, std::int64_t rank, std::int64_t W, std::int64_t streams,
                     float* m, float* const* out);

// QSA indexer scores for nq <= 4 queries q[r] against one tile of kIndexTile block keys:
// o[r][b] = scale * sum over heads h of relu(q[r][h*dim : (h+1)*dim] . key_b), with the tile's
// keys transposed, kt[c * kIndexTile + b].
inline constexpr std::int64_t kIndexTile = 64;
void index_scores_tile(const float* const* q, std::int64_t nq, std::int64_t heads, std::int64_t dim,
                       const float* kt, float scale, float* const* o);

// Softmax attention of `rep` query heads (q + r*D, r < rep) that share one kv head, over the n
// keys k + idx[i]*ld (values v + idx[i]*ld) in the order given; out + r*D. Scores are summed
// over D in order, the softmax normaliser in double, the values in key order.
void attention_heads(const float* q, std::int64_t rep, std::int64_t D, const float* k,
                     const float* v, std::int64_t ld, const std::int32_t* idx, std::int64_t n,
                     float scale, float* out);

// y[t, c] = sum_j wt[j*C + c] * x[(t + j*dilation)*C + c] for t < rows, j < K: a causal
// depthwise conv over a window x that starts (K-1)*dilation rows before the first output.
void causal_conv_rows(const float* x, const float* wt, std::int64_t C, std::int64_t K,
                      std::int64_t dilation, std::int64_t rows, float* y);

// out[j] = exp(a - x[j]) for j < n (the vectorised expf above).
void exp_diff(float a, const float* x, float* out, std::int64_t n);
// out[j] = x[j] * exp(a[j] - b[j]) for j < n (b null: x[j] * exp(a[j])).
void mul_exp_diff(const float* x, const float* a, const float* b, float* out, std::int64_t n);

// T = (I + A)^-1 for the unit lower-triangular I + A, A strictly lower in the first n <= 64 rows
// of a [64][64] row-major matrix (its diagonal and upper part are not read); T is written as a
// full [64][64] block (zero above the diagonal, and outside n x n). Row i of T is
// e_i - sum_{j<i} A[i][j] T[j], summed over j in increasing order.
void unit_lower_inverse64(const float* A, std::int64_t n, float* T);

// One value head of the gated delta rule, token by token (Yang et al.; backend.h): per token t,
// S *= diag(exp(g_t)); delta = beta_t (v_t - S^T k_t); S += k_t delta^T; o_t = S^T q_t. Token
// t's vectors are q + t*ldq, k + t*ldk, v + t*ldv, its beta beta[t*ldb], its output goes to
// out + t*ldo. The log decay of state row i is g[t*ldg + i*gstep]: gstep 0 is GDN's one decay
// per head, gstep 1 KDA's decay per key channel. state is [dk, dv] row-major, updated. The value
// columns are independent, so they are computed 16 at a time; the sums over dk run in 4
// interleaved parts.
struct DeltaRuleHead {
  const float *q, *k, *v, *g, *beta;
  std::int64_t ldq, ldk, ldv, ldg, ldb;
  float* out;
  std::int64_t ldo;
  std::int64_t tokens, dk, dv;
  std::int64_t gstep = 0;
};
void delta_rule_recurrent_head(const DeltaRuleHead& h, float* state);

// The k largest of p[0, n), descending, ties to the lower index, into idx/val[0, min(k, n))
// (val may be null); the entries past that are left as they were. Which entries a row with NaNs
// yields is unspecified (as it was with std::partial_sort).
void topk_row(const float* p, std::int64_t n, std::int64_t k, std::int32_t* idx, float* val);

}  // namespace fs::cpu
