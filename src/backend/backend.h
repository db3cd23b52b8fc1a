// The backend op interface (DESIGN principle 1). Model code is written once against these ops;
// a backend holds no model logic. Ops are named as the papers and the reference name them.
//
// Conventions: activations are float32 `Tensor`s viewed as [rows, cols] (rows = tokens, or
// tokens x heads); weights are `Weight`s in the checkpoint's dtype (f32 or bf16), linear weights
// [out, in]. Outputs are resized by the op unless stated otherwise. Every op computes in fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "tensor/tensor.h"

namespace fs {

enum class Activation { kIdentity, kSilu, kSigmoid, kSoftplus, kRelu };

// Keys each query attends to, in CSR form: query i uses keys[offsets[i] .. offsets[i+1]).
struct KeySelection {
  std::vector<std::int64_t> offsets{0};
  std::vector<std::int32_t> keys;
  void add_query(std::span<const std::int32_t> k) {
    keys.insert(keys.end(), k.begin(), k.end());
    offsets.push_back(static_cast<std::int64_t>(keys.size()));
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // --- dense algebra -------------------------------------------------------------------------
  // y[S, out] = x[S, in] · W[out, in]^T  (nn.Linear without bias).
  virtual void linear(const Tensor& x, const Weight& w, Tensor& y) = 0;
  // y[rows, cols] += bias[cols].
  virtual void add_bias(Tensor& y, std::span<const float> bias) = 0;

  // --- normalisation --------------------------------------------------------------------------
  // RMSNorm over consecutive groups of `group` columns: y = x * rsqrt(mean(x^2) + eps) * scale,
  // scale = (1 + w) when `unit_offset` (Qwen's zero-initialised norm) else w. `w` spans the full
  // row width (grouped norms carry one weight per column) or one group (shared by every group).
  virtual void rms_norm(const Tensor& x, std::span<const float> w, std::int64_t group, float eps,
                        bool unit_offset, Tensor& y) = 0;
  // Gated RMSNorm (FLA's RMSNormGated, norm before gate): per group of `w.size()` columns,
  // y = w * rmsnorm(x) * act(gate).
  virtual void rms_norm_gated(const Tensor& x, std::span<const float> w, const Tensor& gate,
                              float eps, Activation act, Tensor& y) = 0;
  // x / sqrt(sum(x^2) + eps) over groups of `group` columns, in place (FLA's l2norm: sum, not
  // mean).
  virtual void l2_norm(Tensor& x, std::int64_t group, float eps) = 0;

  // --- elementwise ---------------------------------------------------------------------------
  virtual void activate(Tensor& x, Activation act) = 0;  // in place
  virtual void scale(Tensor& x, float s) = 0;            // in place
  virtual void add(Tensor& x, const Tensor& y) = 0;      // x += y
  virtual void mul(Tensor& x, const Tensor& y) = 0;      // x *= y
  // x[r, c] *= v[c] (a per-column vector broadcast over rows).
  virtual void mul_cols(Tensor& x, std::span<const float> v) = 0;
  // x[r, c] *= s[r] (a per-row scalar, s is [rows, 1]).
  virtual void mul_rows(Tensor& x, const Tensor& s) = 0;
  // out = act(gate) * up (SwiGLU with silu); `packed` takes gate and up as the two halves of gu.
  virtual void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  virtual void swiglu_packed(const Tensor& gu, Tensor& out) = 0;
  // sign(x) * sqrt(max(|x|, floor)), in place (PLE gate, sign(0) = 0).
  virtual void signed_sqrt(Tensor& x, float floor) = 0;

  // --- layout --------------------------------------------------------------------------------
  // out[r, :] = x[r, begin : begin + width].
  virtual void slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width, Tensor& out) = 0;
  // Splits each row of x viewed as [heads, 2*dim] into a = [heads, :dim], b = [heads, dim:].
  virtual void split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim, Tensor& a,
                                 Tensor& b) = 0;
  // out[r, s*W : (s+1)*W] = x[r, :] for s in [0, times).
  virtual void repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) = 0;
  // out[i, :] = x[idx[i], :].
  virtual void gather_rows(const Tensor& x, std::span<const std::int32_t> idx, Tensor& out) = 0;
  // out[idx[i], :] += w[i] * y[i, :]  (index_add with a per-row weight).
  virtual void scatter_add_rows(Tensor& out, std::span<const std::int32_t> idx, const Tensor& y,
                                std::span<const float> w) = 0;
  // Appends the rows of x to `cache` ([n, cols] grows to [n + rows, cols]).
  virtual void append_rows(Tensor& cache, const Tensor& x) = 0;

  // --- embeddings ----------------------------------------------------------------------------
  // out[i, :] = table[ids[i], :], the table being the row-wise concatenation of `shards` (a
  // sharded table is never materialised; only the touched rows are read).
  virtual void embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                         Tensor& out) = 0;

  // --- hyper-connections -----------------------------------------------------------------------
  // out[r, :] = mean over s of x[r, s*W : (s+1)*W]  (W = x.cols / streams).
  virtual void stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) = 0;
  // h[r, s*W : (s+1)*W] += w[r, s] * y[r, :]  (w is [rows, streams], y is [rows, W]).
  virtual void add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) = 0;
  // out[r, s] = sum over the s-th group of W columns of a*b.
  virtual void grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) = 0;

  // --- positional ----------------------------------------------------------------------------
  // Rotate-half RoPE on the first `rotary_dim` columns of every `head_dim`-wide head of each row,
  // in place; row r of x is at positions[r]; inv_freq[i] = theta^(-2i/rotary_dim).
  virtual void rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim,
                    std::span<const std::int64_t> positions, double theta) = 0;

  // --- sequence mixing -----------------------------------------------------------------------
  // Causal depthwise conv over time, per channel: y_t = sum_j w[c, j] * x_{t - (K-1-j)*dilation},
  // x before the call taken from `tail` ([(K-1)*dilation, C], oldest first), which is then
  // replaced by the last (K-1)*dilation inputs. No activation.
  virtual void causal_conv1d(const Tensor& x, const Tensor& w, std::int64_t dilation, Tensor& tail,
                             Tensor& y) = 0;
  // Gated delta rule (Yang et al., "Gated Delta Networks"). q, k: [S, Hk*dk] (already l2-normed,
  // q scaled), v: [S, Hv*dv], g (log decay) and beta: [S, Hv], value head j reads key head
  // j / (Hv/Hk). state: [Hv, dk, dv], updated. out: [S, Hv*dv]. The chunked form (chunk 64,
  // WY representation) and the token-by-token recurrent form compute the same function.
  virtual void gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& g, const Tensor& beta, std::int64_t key_heads,
                                        Tensor& state, Tensor& out) = 0;
  virtual void gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& g, const Tensor& beta,
                                          std::int64_t key_heads, Tensor& state, Tensor& out) = 0;
  // Softmax attention of q [S, Hq*D] over the selected rows of k, v [T, Hkv*D] (GQA: query head h
  // reads kv head h / (Hq/Hkv)), out [S, Hq*D]; probabilities in fp32.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                         std::int64_t kv_heads, const KeySelection& sel, float scale,
                         Tensor& out) = 0;

  // --- indexers and routing --------------------------------------------------------------------
  // Mean of each complete group of `group` consecutive rows of x[first_row ...]: out [n, cols].
  virtual void block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks,
                          std::int64_t group, Tensor& out) = 0;
  // QSA block scores: out[s, b] = sum_h relu(q[s, h] . keys[b]) * scale, q [S, heads*dim],
  // keys [B, dim].
  virtual void index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                            Tensor& out) = 0;
  virtual void softmax(Tensor& x) = 0;  // per row, in place
  // The k largest entries of each row of x[:, :n] (n <= cols), descending; ties keep the lower
  // index first. Per row n may differ (counts[r]); missing picks are -1.
  virtual void topk(const Tensor& x, std::int64_t k, std::span<const std::int64_t> counts,
                    std::vector<std::int32_t>& idx, std::vector<float>& val) = 0;
};

// The fp32 CPU reference backend (OpenBLAS for large products).
std::unique_ptr<Backend> make_cpu_backend();

}  // namespace fs
