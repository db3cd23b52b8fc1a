// The backend op interface (DESIGN principle 1). Model code is written once against these ops;
// a backend holds no model logic. Ops are named as the papers and the reference name them.
//
// Memory (DESIGN "On the GPU"): every activation and cache a backend computes on is a `Tensor`
// in the backend's `memory()`; an output tensor given to an op is (re)allocated there by the op,
// reusing its buffer when it is large enough. Weights are `Weight`s the backend `upload`ed once
// at load (the CPU computes on the mapped checkpoint in place). Nothing inside an op returns to
// the host: routing, top-k and block selection produce int32 index tensors in backend memory.
// The two host inputs are token-derived: `embedding` ids, and the PLE table rows, which stay in
// the mapped host file and are gathered there.
//
// Conventions: activations are float32 viewed as [rows, cols] (rows = tokens, or tokens x
// heads); weights are f32 or bf16, linear weights [out, in]; vectors (norm weights, biases,
// per-column scales) are f32 `Weight`s. Every op computes in fp32. An op may be given the same
// tensor as input and output where its comment says "in place" or where `x` and `y` are both
// passed as the same object (rms_norm).
//
// Failure (out of memory, a launch error, an op a backend does not implement) is recorded, not
// thrown: the first one is kept, later ops do nothing, and the caller checks `status()` once per
// forward. There is no silent fallback to another backend.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/entry_penalty.h"
#include "backend/weight.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace fs {

// kSqrtSoftplus: sqrt(softplus(x)), DeepSeek V4's router score.
enum class Activation { kIdentity, kSilu, kSigmoid, kSoftplus, kRelu, kSqrtSoftplus };

// The hyper-connection write of a sublayer's output y [S, W] (model/common/hyper_connection.h):
// stream k of h [S, streams * W] += inject[:, k] * y (add_scaled_streams). The *_into_streams ops
// write their output this way instead of returning y.
struct StreamsWrite {
  Tensor& h;
  const Tensor& inject;  // [S, streams]
};

// Whether every entry names an element of the 2-D tensor x.
bool entries_inside(const Tensor& x, std::span<const EntryPenalty> entries);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Where this backend's tensors live.
  virtual const std::shared_ptr<Memory>& memory() const = 0;
  // A zero-filled tensor in this backend's memory (a failed allocation is recorded).
  Tensor new_tensor(Shape shape, DType dtype = DType::kF32);

  // A weight this backend computes with. Matrices (rank >= 2) are stored as `matrix_dtype`
  // (f32 or bf16); vectors stay f32. The CPU returns the view itself when no conversion is
  // needed; a device copies it into memory the backend owns for its whole life.
  virtual Expected<Weight> upload(const Weight& w, DType matrix_dtype) = 0;
  // Blocks until queued work is done (device backends run ops asynchronously).
  virtual void synchronize() {}
  // Free and total bytes of the device memory this backend computes in; nullopt for host memory
  // (the loader checks that a model's weights fit before it uploads any).
  struct DeviceMemoryInfo {
    std::uint64_t free = 0;
    std::uint64_t total = 0;
  };
  virtual std::optional<DeviceMemoryInfo> device_memory() const { return std::nullopt; }

  // The first failure since the last clear_status(); ok when none.
  const Status& status() const { return status_; }
  void clear_status() { status_ = Status{}; }

  // --- dense algebra -------------------------------------------------------------------------
  // y[S, out] = x[S, in] · W[out, in]^T  (nn.Linear without bias).
  virtual void linear(const Tensor& x, const Weight& w, Tensor& y);
  // y[rows, cols] += bias[cols].
  virtual void add_bias(Tensor& y, const Weight& bias);

  // --- normalisation --------------------------------------------------------------------------
  // RMSNorm over consecutive groups of `group` columns: y = x * rsqrt(mean(x^2) + eps) * scale,
  // scale = (1 + w) when `unit_offset` (Qwen's zero-initialised norm) else w. `w` spans the full
  // row width (grouped norms carry one weight per column) or one group (shared by every group).
  // x and y may be the same tensor.
  virtual void rms_norm(const Tensor& x, const Weight& w, std::int64_t group, float eps,
                        bool unit_offset, Tensor& y);
  // Gated RMSNorm (FLA's RMSNormGated, norm before gate): per group of `w.numel()` columns,
  // y = w * rmsnorm(x) * act(gate).
  virtual void rms_norm_gated(const Tensor& x, const Weight& w, const Tensor& gate, float eps,
                              Activation act, Tensor& y);
  // LayerNorm (torch's nn.LayerNorm, biased variance) over groups of w.numel() columns, w and b
  // [group] shared by every group: y = (x - mean) / sqrt(var + eps) * w + b. x and y may be the
  // same tensor.
  virtual void layer_norm(const Tensor& x, const Weight& w, const Weight& b, float eps, Tensor& y);
  // x / sqrt(sum(x^2) + eps) over groups of `group` columns, in place (FLA's l2norm: sum, not
  // mean).
  virtual void l2_norm(Tensor& x, std::int64_t group, float eps);

  // --- elementwise ---------------------------------------------------------------------------
  virtual void activate(Tensor& x, Activation act);  // in place
  virtual void scale(Tensor& x, float s);            // in place
  virtual void add(Tensor& x, const Tensor& y);      // x += y
  virtual void mul(Tensor& x, const Tensor& y);      // x *= y
  // x *= act(gate): the sequence activate(gate), mul(x, gate) as one op, bit for bit (QSA's
  // output gate). gate is scratch: the default body activates it in place, a backend's own may
  // leave it as it was.
  virtual void mul_activated(Tensor& x, Tensor& gate, Activation act);
  // x[r, c] *= v[c] (a per-column vector broadcast over rows).
  virtual void mul_cols(Tensor& x, const Weight& v);
  // x[r, c] *= s[r] (a per-row scalar, s is [rows, 1]).
  virtual void mul_rows(Tensor& x, const Tensor& s);
  // out = silu(gate) * up; `packed` takes gate and up as the two halves of each row of gu.
  virtual void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
  virtual void swiglu_packed(const Tensor& gu, Tensor& out);
  // sign(x) * sqrt(max(|x|, floor)), in place (PLE gate, sign(0) = 0).
  virtual void signed_sqrt(Tensor& x, float floor);
  // Each row divided by its sum, in place (top-k renormalisation).
  virtual void normalize_rows(Tensor& x);
  // x = min(max(x, lo), hi), in place (the clamped SwiGLU of DeepSeek V4 and GLM 5.3).
  virtual void clamp(Tensor& x, float lo, float hi);

  // --- layout --------------------------------------------------------------------------------
  // out[r, :] = x[r, begin : begin + width].
  virtual void slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width, Tensor& out);
  // out[i, :] = x[begin + i, :] for i in [0, count).
  virtual void slice_rows(const Tensor& x, std::int64_t begin, std::int64_t count, Tensor& out);
  // Splits each row of x viewed as [heads, 2*dim] into a = [heads, :dim], b = [heads, dim:].
  virtual void split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim, Tensor& a,
                                 Tensor& b);
  // out[r, s*W : (s+1)*W] = x[r, :] for s in [0, times).
  virtual void repeat_cols(const Tensor& x, std::int64_t times, Tensor& out);
  // Appends the rows of x to `cache` ([n, cols] grows to [n + rows, cols]; the cache's capacity
  // grows geometrically, so a warm cache is appended to without allocating).
  virtual void append_rows(Tensor& cache, const Tensor& x);

  // --- embeddings ----------------------------------------------------------------------------
  // out[i, :] = table[ids[i], :] as f32, the table being the row-wise concatenation of `shards`
  // (never materialised; only the touched rows are read). The ids are host values derived from
  // the token ids. Shards may be device weights, or host weights (the memory-mapped PLE table),
  // whose rows are gathered on the host and copied in.
  virtual void embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                         Tensor& out);
  // out[values.size() / cols, cols] = values, rows the host holds (the trunk's hidden rows an MTP
  // head reads). A device queues the copy without waiting, through pinned staging (the CUDA
  // backend also stages into a step graph's own buffers; no graph in main uploads rows yet, the
  // branch experiments/mtp-head-graphs does and tests it: docs/GPU.md "Step 10"). The default
  // body is the memory's synchronous copy, right for host memory.
  virtual void upload_rows(std::span<const float> values, std::int64_t cols, Tensor& out);

  // --- hyper-connections -----------------------------------------------------------------------
  // out[r, :] = mean over s of x[r, s*W : (s+1)*W]  (W = x.cols / streams).
  virtual void stream_mean(const Tensor& x, std::int64_t streams, Tensor& out);
  // h[r, s*W : (s+1)*W] += w[r, s] * y[r, :]  (w is [rows, streams], y is [rows, W]).
  virtual void add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w);
  // Manifold-constrained hyper-connections (mHC; DeepSeek V4 M:867-963, GLM 5.3 M:220-303), H =
  // streams, h [S, H*D]. From the raw mix logits m = h · fn^T, [S, (2+H)*H] (or [S, H] for the
  // final head, post and comb null), with r = rsqrt(mean(h^2) + norm_eps) over the whole row (the
  // unweighted RMSNorm taken after the product: a per-row scalar commutes with it):
  //   pre  = sigmoid(r*m[:H]*scale[0] + base[:H]) + hc_eps                [S, H]
  //   post = 2*sigmoid(r*m[H:2H]*scale[1] + base[H:2H])                    [S, H]
  //   comb = Sinkhorn(softmax_row(r*m[2H:]*scale[2] + base[2H:]) + hc_eps) [S, H*H], comb[j*H+k]
  // Sinkhorn: a column normalisation, then (iters-1) row+column pairs, each dividing by
  // (sum + hc_eps).
  virtual void mhc_weights(const Tensor& h, const Tensor& m, const Weight& base,
                           const Weight& scale, std::int64_t streams, float norm_eps, float hc_eps,
                           std::int64_t sinkhorn_iters, Tensor& pre, Tensor* post, Tensor* comb);
  // out[r, :] = sum over s of w[r, s] * x[r, s*W : (s+1)*W]  (w [rows, streams]).
  virtual void weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out);
  // The mHC write, in place: h[r, k] <- post[r, k] * y[r] + sum_j comb[r, j*H+k] * h[r, j]
  // (each W-wide stream; post [rows, H], comb [rows, H*H], y [rows, W]).
  virtual void mhc_expand(Tensor& h, const Tensor& y, const Tensor& post, const Tensor& comb);
  // out[r, s] = sum over the s-th group of W columns of a*b.
  virtual void grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out);
  // The read's stream mix: out[r, c] = mean over s of sigmoid(m[r, s*W + c]) * xn[r, s*W + c],
  // m = u · up^T (u [rows, rank], up [streams*W, rank], xn [rows, streams*W], out [rows, W]).
  // A fused op: its default body is the unfused sequence (linear, sigmoid, mul, stream_mean),
  // so a backend without its own computes exactly what that sequence does.
  virtual void stream_mix(const Tensor& xn, const Tensor& u, const Weight& up, std::int64_t streams,
                          Tensor& out);

  // --- positional ----------------------------------------------------------------------------
  // Rotate-half RoPE on the first `rotary_dim` columns of every `head_dim`-wide head of each row,
  // in place; row r is at position first + r * stride; inv_freq[i] = theta^(-2i/rotary_dim).
  virtual void rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim, std::int64_t first,
                    std::int64_t stride, double theta);

  // --- sequence mixing -----------------------------------------------------------------------
  // Causal depthwise conv over time, per channel: y_t = sum_j w[c, j] * x_{t - (K-1-j)*dilation},
  // w [C, K]; x before the call taken from `tail` ([(K-1)*dilation, C], oldest first), which is
  // then replaced by the last (K-1)*dilation inputs. No activation.
  virtual void causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation, Tensor& tail,
                             Tensor& y);
  // Gated delta rule (Yang et al., "Gated Delta Networks"), written once for GDN and KDA. q, k:
  // [S, Hk*dk] (already l2-normed, q scaled), v: [S, Hv*dv], beta: [S, Hv], value head j reads
  // key head j / (Hv/Hk). The log decay g is [S, Hv], one scalar per head (GDN: S *= exp(g_t)),
  // or [S, Hv*dk], one per key channel (Kimi Delta Attention: row i of head j's state is scaled
  // by exp(g_t[j*dk + i])). state: [Hv, dk, dv], updated. out: [S, Hv*dv]. The chunked form
  // (chunk 64, WY representation) and the token-by-token recurrent form compute the same
  // function.
  virtual void gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& g, const Tensor& beta, std::int64_t key_heads,
                                        Tensor& state, Tensor& out);
  virtual void gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& g, const Tensor& beta,
                                          std::int64_t key_heads, Tensor& state, Tensor& out);
  // The recurrent form that also keeps the state after every token: states [S, Hv*dk*dv], row t
  // the state after token t (row S-1 equals `state` afterwards). An MTP verify runs it so that a
  // partial acceptance goes back to any of its positions by a copy, without a second forward.
  // The default body runs the recurrent form one token at a time and copies each state out.
  virtual void gated_delta_rule_positions(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& g, const Tensor& beta,
                                          std::int64_t key_heads, Tensor& state, Tensor& out,
                                          Tensor& states);
  // Softmax attention of q [S, Hq*D] over a block selection of k, v [T, Hkv*D] (GQA: query head
  // h reads kv head h / (Hq/Hkv)), out [S, Hq*D], probabilities in fp32. Query s is at position
  // first + s; it reads every key of the blocks picked[s, :] (block b = keys b*block ..
  // b*block+block-1; -1 entries are skipped, in the order given) and then the unfinished tail,
  // keys ((first+s+1)/block)*block .. first+s.
  virtual void block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      std::int64_t heads, std::int64_t kv_heads,
                                      const Tensor& picked, std::int64_t block, std::int64_t first,
                                      float scale, Tensor& out);
  // block_sparse_attention, then out *= act(gate) as mul_activated multiplies (QSA's output gate)
  // in one op, bit for bit the two (the default body). gate [S, Hq*D] is scratch as in
  // mul_activated. A GPU applies the gate where the attention writes its output: one kernel fewer
  // in a QSA layer's chain.
  virtual void gated_block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                            std::int64_t heads, std::int64_t kv_heads,
                                            const Tensor& picked, std::int64_t block,
                                            std::int64_t first, float scale, Tensor& gate,
                                            Activation act, Tensor& out);

  // --- compressed attention (DeepSeek V4: arch-dsv4.md 2.4-2.10) -------------------------------
  // Interleaved (GPT-J) RoPE on the LAST 2 * inv_freq.numel() columns of every `head_dim`-wide
  // head of each row, in place (HF DeepseekV4 apply_rotary_pos_emb): pair j is the columns
  // (head_dim - rotary + 2j, head_dim - rotary + 2j + 1), rotated by the angle pos * inv_freq[j];
  // row r is at position first + r * stride. `inverse` rotates by -angle (the attention output's
  // de-rotation). inv_freq is an f32 vector (plain or YaRN frequencies, computed at load).
  virtual void rope_interleaved(Tensor& x, std::int64_t head_dim, const Weight& inv_freq,
                                std::int64_t first, std::int64_t stride, bool inverse);
  // The compressor's softmax-gated pooling (HF DeepseekV4HCACompressor / CSACompressor). kv and
  // gate [n, width] hold the per-token projections of positions src_first .. src_first + n - 1;
  // the gate of the token at position t gets bias[t % ratio] (bias [ratio, width]). Window w
  // covers positions w*ratio .. w*ratio + ratio - 1. out [windows, D] holds windows
  // first_window ... first_window + windows - 1; per channel i, a softmax over the window's slots:
  //   plain (D = width):         slots (kv_t[i], gate_t[i]) for t in window w;
  //   overlap (D = width / 2):   slots (kv_t[i], gate_t[i]) for t in window w-1 (none for w = 0)
  //                              and (kv_t[D+i], gate_t[D+i]) for t in window w.
  virtual void compressor_pool(const Tensor& kv, const Tensor& gate, std::int64_t src_first,
                               const Weight& bias, std::int64_t first_window, std::int64_t windows,
                               bool overlap, Tensor& out);
  // The lightning indexer's scores (HF DeepseekV4IndexerScorer): q [S, heads*dim], keys [N, dim],
  // weights [S, heads]; out[s, w] = scale * sum_h weights[s, h] * relu(q[s, h] . keys[w]).
  virtual void weighted_index_scores(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                     float scale, Tensor& out);
  // Shared-KV attention with a learned sink per head (HF DeepseekV4Attention, eager with sinks).
  // q [S, H*D]; one K=V head: kv [n, D] holds the raw rows of positions kv_first .. kv_first+n-1,
  // comp [N, D] the compressed rows. Query s (position p = first + s) reads the raw rows of
  // positions max(kv_first, p - window + 1) .. p, then the compressed rows picked[s, :] (int32,
  // -1 skipped) when `picked` is given, else every row w < (p + 1) / ratio (none when ratio is
  // 0). P = softmax over their logits (q . k * scale) and the sink logit sinks[h];
  // out = sum_j P_j k_j (the sink takes probability and adds no value).
  virtual void sink_attention(const Tensor& q, const Tensor& kv, std::int64_t kv_first,
                              std::int64_t window, const Tensor& comp, std::int64_t ratio,
                              const Tensor* picked, const Weight& sinks, std::int64_t first,
                              float scale, Tensor& out);
  // Block-diagonal linear (HF DeepseekV4GroupedLinear, the o_a projection): x [S, G*In],
  // w [G*Out, In]; y[s, g*Out + o] = x[s, g*In : (g+1)*In] . w[g*Out + o, :].
  virtual void grouped_linear(const Tensor& x, const Weight& w, std::int64_t groups, Tensor& y);

  // --- the official graph's numerics (DeepSeek V4, arch-dsv4.md 7; backend/quant_simulation.h)
  // Both are in place, row by row, and give the same bits on every backend.
  // FP8 E4M3 simulation of the columns [0, cols) of each row of x (the KV rows' non-RoPE dims),
  // in blocks of `block` columns from column 0 (the last block is shorter when `block` does not
  // divide cols, so a narrower span is one block): per block amax = max(max |x|, 1e-4), scale
  // 2^ceil(log2(amax / 448)), x <- E4M3(x / scale) * scale, round to nearest, ties to even.
  // Columns from `cols` on are untouched.
  virtual void fp8_e4m3_simulate(Tensor& x, std::int64_t cols, std::int64_t block);
  // The indexer's rotation and FP4 simulation: each row of x is cut into `block`-wide groups
  // (block a power of two dividing the row), each multiplied by the orthonormal Walsh-Hadamard
  // matrix H_block / sqrt(block) (Sylvester order: the butterflies of strides 1, 2, 4 ...); then,
  // unless fp4_block is 0, each group's columns in blocks of fp4_block from the group's start (the
  // last shorter when fp4_block does not divide block) get FP4 E2M1: scale 2^ceil(log2(amax/6)),
  // x <- E2M1(x / scale) * scale (values 0, .5, 1, 1.5, 2, 3, 4, 6, signed; ties to even).
  virtual void hadamard_fp4_simulate(Tensor& x, std::int64_t block, std::int64_t fp4_block);

  // --- indexers and routing --------------------------------------------------------------------
  // Mean of each complete group of `group` consecutive rows of x[first_row ...]: out [n, cols].
  virtual void block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks,
                          std::int64_t group, Tensor& out);
  // The k-pool compression of the DSA indexer (GLM 5.3, M:902-975): pools of `pool` consecutive
  // rows starting at first_row, each a softmax-gated mean per channel,
  //   out[p, c] = sum_j softmax_j(gate[r_j, c] + ape[j*dim + c]) * keys[r_j, c],
  //   r_j = first_row + p*pool + j,  j < pool,  p < pools,
  // keys and gate [T, dim], ape an f32 vector [pool*dim] (the learned position bias), out
  // [pools, dim]. The softmax is over the pool's slots, in fp32.
  virtual void kpool_compress(const Tensor& keys, const Tensor& gate, const Weight& ape,
                              std::int64_t pool, std::int64_t first_row, std::int64_t pools,
                              Tensor& out);
  // QSA block scores: out[s, b] = sum_h relu(q[s, h] . keys[b]) * scale, q [S, heads*dim],
  // keys [B, dim].
  virtual void index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                            Tensor& out);
  virtual void softmax(Tensor& x);  // per row, in place
  // The k largest entries of each row, descending; ties keep the lower index first.
  // idx [rows, k] int32, val [rows, k] f32.
  virtual void topk(const Tensor& x, std::int64_t k, Tensor& idx, Tensor& val);
  // QSA block selection: row s of scores [S, B] is the query at position first + s, which sees
  // the (first+s+1)/block complete blocks; picked [S, top] int32 holds the `top` best visible
  // blocks, descending, ties to the lower index, -1 where fewer are visible.
  virtual void select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block,
                             std::int64_t top, Tensor& picked);
  // The routed experts of a sparse MoE: y[s] = sum_j weights[s, j] *
  //   down[e] · swiglu_packed(gate_up[e] · x[s]),  e = experts[s, j],
  // gate_up [E, 2I, H] (gate rows then up rows), down [E, H, I], experts/weights [S, k]. Only the
  // routed experts' weights are read. y [S, H] is overwritten. swiglu_limit L > 0 clamps before
  // the activation (gate <= L, up in [-L, L]; DeepSeek V4 and GLM 5.3); 0 leaves it plain.
  virtual void moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                           const Tensor& experts, const Tensor& weights, float swiglu_limit,
                           Tensor& y);
  // Expert selection from router scores [S, E] (already activated: softmax, sigmoid or
  // sqrt-softplus), as DeepSeek V3/V4 and GLM route:
  //  - chosen by top-k of scores + bias (bias [E] f32, may be empty), restricted when groups > 1
  //    to the top_groups groups of E/groups consecutive experts ranked by the sum of each group's
  //    two best biased scores; or, when `table` is set (DeepSeek V4's hash layers: tid2eid
  //    [vocab, k], int32 or int64), the table row of token_ids[s] (int32 [S, 1]);
  //  - weighted by the unbiased scores of the chosen experts, divided by (their sum + 1e-20)
  //    when `normalize`, times `scaling`.
  // experts [S, k] int32 in descending biased score (the table's order for hash layers; ties to
  // the lower id), weights [S, k] f32.
  virtual void select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                              const Tensor* token_ids, std::int64_t groups, std::int64_t top_groups,
                              std::int64_t k, bool normalize, float scaling, Tensor& experts,
                              Tensor& weights);

  // --- fused decode ops ---------------------------------------------------------------------
  // Each is a short sequence of the ops above that a decode step runs once per layer. The default
  // body is exactly that sequence (so a backend without its own computes what the sequence does,
  // bit for bit); a device backend overrides it with fewer kernels, each reading its inputs once.

  // The hyper-connection read (model/common/hyper_connection.h; Q4M 1003-1031):
  //   xn = rms_norm(h) (groups of `width`, unit offset), u = silu((xn · mix_down^T) / streams),
  //   mixed = stream_mix(xn, u, mix_up, streams),
  //   inject_out = 2 * sigmoid((xn · inject^T) / streams) when inject_out is not null.
  virtual void hyper_connection_read(const Tensor& h, const Weight& norm, const Weight& mix_down,
                                     const Weight& mix_up, const Weight& inject,
                                     std::int64_t streams, std::int64_t width, float eps,
                                     Tensor& mixed, Tensor* inject_out);
  // The GatedDeltaNet's input projections over the same x (Q4M 510-581):
  //   qkv = x · w_qkv^T, z = x · w_z^T, beta = sigmoid(x · w_b^T),
  //   g = decay_rate * softplus(x · w_a^T + dt_bias)   (the log decay, per value head).
  virtual void gated_delta_net_in_proj(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                       const Weight& w_b, const Weight& w_a, const Weight& dt_bias,
                                       const Weight& decay_rate, Tensor& qkv, Tensor& z,
                                       Tensor& beta, Tensor& g);
  // The GatedDeltaNet's short conv and q/k/v (Q4M 560-581, 300-310): mixed = silu(causal_conv1d(
  // qkv, conv, dilation 1, tail)), split into q | k | v (key_dim, key_dim, the rest), q and k
  // l2-normed per head of `head_dim` (eps 1e-6), q scaled by head_dim^-0.5. `tail` is updated.
  virtual void gated_delta_net_conv(const Tensor& qkv, const Weight& conv, Tensor& tail,
                                    std::int64_t key_dim, std::int64_t head_dim, Tensor& q,
                                    Tensor& k, Tensor& v);
  // A GatedDeltaNet decode step in two ops (one token on a warm state, no MTP window): the input
  // projections with the short conv,
  //   gated_delta_net_in_proj(x, ...) -> qkv, z, beta, g; mixed = silu(causal_conv1d(qkv, conv,
  //   dilation 1, tail)), tail updated,
  // and the core,
  //   q | k | v split from mixed (key_heads * head_dim, the same, the rest), q and k l2-normed per
  //   head (eps 1e-6), q scaled by head_dim^-0.5, gated_delta_rule_recurrent(q, k, v, g, beta,
  //   key_heads, state) -> core [S, Hv*dv] (Hv = beta.cols()), normed = rms_norm_gated(core per
  //   value head of dv, norm, z, eps, act) [S, Hv*dv].
  // The split moves the q/k norms from the conv to the core, where a GPU block holding a value
  // head's state can compute its key head's norms from the conv output it reads anyway; the two
  // ops then compute, bit for bit, what in_proj, conv, the recurrence and the gated norm do.
  virtual void gated_delta_net_in_proj_conv(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                            const Weight& w_b, const Weight& w_a,
                                            const Weight& dt_bias, const Weight& decay_rate,
                                            const Weight& conv, Tensor& tail, Tensor& mixed,
                                            Tensor& z, Tensor& beta, Tensor& g);
  virtual void gated_delta_net_core(const Tensor& mixed, const Tensor& z, const Tensor& beta,
                                    const Tensor& g, std::int64_t key_heads, std::int64_t head_dim,
                                    const Weight& norm, float eps, Activation act, Tensor& state,
                                    Tensor& normed);
  // QSA's projections over the same x (Q4M 847-901 and the indexer's query/key projection):
  //   index_qk = x · index_w^T, qg = x · q_w^T (+ q_bias), k = x · k_w^T (+ k_bias),
  //   v = x · v_w^T (+ v_bias); an empty bias weight is no bias.
  virtual void qsa_projections(const Tensor& x, const Weight& q_w, const Weight& k_w,
                               const Weight& v_w, const Weight& index_w, const Weight& q_bias,
                               const Weight& k_bias, const Weight& v_bias, Tensor& qg, Tensor& k,
                               Tensor& v, Tensor& index_qk);
  // Per-head RMSNorm (unit offset, Qwen's q/k norms) then rotate-half RoPE, in place, of a and of
  // b when not null, all rows at positions first, first + 1, ... (a QSA layer's queries and keys;
  // the indexer's queries alone):
  //   rms_norm(t, w_t, head_dim, eps, true, t); rope(t, head_dim, rotary_dim, first, 1, theta).
  virtual void head_norm_rope(Tensor& a, const Weight& wa, Tensor* b, const Weight& wb,
                              std::int64_t head_dim, float eps, std::int64_t rotary_dim,
                              std::int64_t first, double theta);
  // The MoE router (Q4M 904-976): softmax over x · router^T in fp32, the top_k best experts
  // (experts [S, top_k] int32, weights [S, top_k] f32), renormalised to sum 1 when `normalize`.
  virtual void route_experts(const Tensor& x, const Weight& router, std::int64_t top_k,
                             bool normalize, Tensor& experts, Tensor& weights);
  // The gated shared expert added into y [S, H] (Q4M 990-1000):
  //   y += sigmoid(x · expert_gate^T) * (down · (silu(x · gate^T) * (x · up^T))).
  virtual void shared_expert(const Tensor& x, const Weight& gate, const Weight& up,
                             const Weight& down, const Weight& expert_gate, Tensor& y);
  // Qwen's whole MoE block (model/common/moe.h `moe`): the routing, the routed experts written to
  // y [S, H], the gated shared expert added into it:
  //   route_experts(x, router, top_k, normalize, experts, weights);
  //   moe_experts(x, gate_up, down, experts, weights, 0, y);
  //   shared_expert(x, shared_gate, shared_up, shared_down, shared_expert_gate, y).
  virtual void moe_block(const Tensor& x, const Weight& router, std::int64_t top_k, bool normalize,
                         const Weight& gate_up, const Weight& down, const Weight& shared_gate,
                         const Weight& shared_up, const Weight& shared_down,
                         const Weight& shared_expert_gate, Tensor& experts, Tensor& weights,
                         Tensor& y);
  // A sublayer's last op fused with the hyper-connection write after it (the default bodies are
  // these two steps; a device backend writes each output column into the streams from the kernel
  // that computes it, one kernel fewer a write):
  //   linear(x, w, y); add_scaled_streams(out.h, y, out.inject)
  //   moe_block(..., y); add_scaled_streams(out.h, y, out.inject)
  // The CUDA kernels read out.h and out.inject before they wait for the kernel before them
  // (cuda_common.h), so neither may be written by the op right before this one; in the decoder
  // both come from the hyper-connection read at the start of the sublayer, several ops earlier.
  virtual void linear_into_streams(const Tensor& x, const Weight& w, const StreamsWrite& out);
  virtual void moe_block_into_streams(const Tensor& x, const Weight& router, std::int64_t top_k,
                                      bool normalize, const Weight& gate_up, const Weight& down,
                                      const Weight& shared_gate, const Weight& shared_up,
                                      const Weight& shared_down, const Weight& shared_expert_gate,
                                      Tensor& experts, Tensor& weights, const StreamsWrite& out);

  // --- sampling ------------------------------------------------------------------------------
  // ids[r, 0] = the index of the largest entry of row r of x, ties to the lower index (the CPU
  // sampler's argmax), int32 [rows, 1]. Greedy decoding reads only these ids back, so the
  // logits stay where they were computed. NaN entries never win.
  virtual void argmax_rows(const Tensor& x, Tensor& ids);
  // totals[r] = sum over c of exp((x[r, c] - max_c x[r, c]) / temperature), in double: the
  // softmax denominator the sampler needs beside a row's top (decode/sampler.h RankedTop), so
  // that only the top and this cross to the host. Carried as the bits of a double in an int64
  // tensor [rows, 1] (read them with std::bit_cast<double>). The CPU sums in column order, as
  // the host sampler does, so its totals equal the sampler's bit for bit.
  virtual void softmax_denominators(const Tensor& x, double temperature, Tensor& totals);
  // ids[r] ([rows, 1] i32) = the token a draw with the uniform u[r] in [0, 1) takes from
  // softmax(x[r] / temperature) over every token: the inverse CDF over ids ascending, which is
  // decode/sampler.h sample_with of target_distribution with no top-k, top-p or min-p. A sampled
  // row with no prefix rule then sends one id to the host, not the row. The CPU computes the
  // sampler's doubles in its order (the same ids, bit for bit); a GPU sums in slices of the row,
  // so its id differs only where u lies within double rounding of a boundary between two ids.
  virtual void sample_rows(const Tensor& x, double temperature, std::span<const double> u,
                           Tensor& ids);
  // probs[r] ([rows, 1], the bits of a double in i64) = the probability of id ids[r] under
  // softmax(x[r] / temperature) over every token (decode/sampler.h target_distribution with no
  // prefix rule, then prob): what an MTP draft's acceptance test reads of its verify row when
  // no top can decide the row. The CPU computes the sampler's doubles in its order (bit for
  // bit); a GPU divides by a total summed in slices (double rounding).
  virtual void token_probs(const Tensor& x, double temperature, std::span<const std::int32_t> ids,
                           Tensor& probs);
  // ids[r] ([rows, 1] i32) = the token a draw with the uniform u[r] takes from the residual of
  // row r of p against row r of q, both softmax(x / temperature) over every token: normalise(
  // max(P - Q, 0)), or P itself where that has no mass (P == Q). What an MTP draft's rejection
  // draws its correction from (decode/sampler.h sample_with of residual_distribution of the two
  // target_distributions with no prefix rule), so that neither row comes to the host. q may be
  // narrower than p (a draft vocabulary): Q is 0 past its columns. The CPU computes the
  // sampler's doubles in its order (bit for bit); a GPU sums in slices (double rounding).
  virtual void sample_residual_rows(const Tensor& p, const Tensor& q, double temperature,
                                    std::span<const double> u, Tensor& ids);
  // x[e.row, e.col] = e.apply(x[e.row, e.col]) for each entry, in place: the sampler's
  // repetition, presence and frequency penalties (decode/sampler.h apply_penalties, which applies
  // the same entries) on logits rows that stay on the backend, so that a penalised row need not
  // come to the host. The entries name distinct (row, col) pairs of x.
  virtual void penalise_entries(Tensor& x, std::span<const EntryPenalty> entries);

  // --- step graphs (DESIGN "On the GPU" rule 5, docs/GPU.md) ----------------------------------
  // A device backend may run the ops of one decode step as one graph. The first step of a key
  // records them (the same kernels with the same arguments as eagerly); a later step of the same
  // key is a replay: the ops between begin and launch do only their host work (shapes, pooled
  // outputs served from the graph's own blocks, per-step scalars and staging bytes written where
  // the recorded graph reads them) and launch nothing, then launch_step_graph() runs the kept
  // executable. Either way the result is bit-identical to running the ops eagerly.
  // Between begin_step_graph() and launch_step_graph() nothing may synchronise or read device
  // memory on the host; an op that would is recorded as a failure naming it.
  //
  // What a key must fix (the caller computes it): every op of the step, in order, with the same
  // shapes, and every kernel argument that is not a per-step scalar (buffers: the state's cache
  // tensors by address and capacity; the token count; which branches the step takes). Scalars
  // that vary per step (positions, cache lengths) go through the ops' own arguments as usual:
  // the backend routes them through device memory when recording.
  struct StepGraphKey {
    std::vector<std::int64_t> words;  // compared exactly
    bool operator==(const StepGraphKey&) const = default;
  };
  // Dry ops (a measurement, never a computation): while on, every op does its host work and
  // ensures its outputs but queues no device work, so their contents are whatever the memory
  // held. `flashserve bench --marginal` times a decode step with one op group dry, which gives
  // that group's share of the overlapped step. False: this backend cannot (the CPU).
  virtual bool set_dry_ops(bool /*on*/) { return false; }
  // Whether this backend runs decode steps as graphs (the CUDA backend with
  // FLASHSERVE_CUDA_GRAPHS=1, or after set_step_graphs(true); never the CPU).
  virtual bool step_graphs() const { return false; }
  // Turns graphs on or off for later steps (tests compare both on one backend); a backend
  // without graphs records a failure when asked to turn them on.
  virtual void set_step_graphs(bool on);
  // Starts a step of `key`: recording it (first use) or replaying its kept graph; a failure is
  // recorded (status()).
  virtual void begin_step_graph(const StepGraphKey& key);
  // Ends the step and launches its graph. It always ends a step begun, also after a failed op
  // (then nothing runs and the failure stands).
  virtual void launch_step_graph();
  // Ends a step begun without running any of it (a wrapper whose own ops failed); nothing when
  // none is open.
  virtual void discard_step_graph() {}
  struct StepGraphStats {
    std::int64_t launches = 0;           // steps run as a graph
    std::int64_t captures = 0;           // of those, recorded (first use of their key)
    std::int64_t replays = 0;            // of those, a kept executable launched unchanged
    std::int64_t evictions = 0;          // executables dropped to keep at most the bound
    std::int64_t walk_ns = 0;            // host time of the replays' walks (begin to launch)
    std::int64_t walk_leaked_nodes = 0;  // work an op queued during a walk (should be 0)
  };
  virtual StepGraphStats step_graph_stats() const { return {}; }

 protected:
  // Records the first failure; ops check `failed()` and return early after one.
  void fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  bool failed() const { return !status_.ok(); }
  // Allocates `t` in this backend's memory, recording an out-of-memory failure.
  bool ensure(Tensor& t, Shape shape, DType dtype = DType::kF32);
  void unimplemented(const char* op);

 private:
  Status status_;
};

// The fp32 CPU reference backend (OpenBLAS for large products).
std::unique_ptr<Backend> make_cpu_backend();

// The CUDA backend on device `device`; an error when flashserve was built without CUDA or no
// GPU is present.
Expected<std::unique_ptr<Backend>> make_cuda_backend(int device = 0);
// Whether a CUDA device is usable (false in a build without CUDA).
bool cuda_available();

// "cpu" or "cuda" -> a backend; "auto" picks cuda when a GPU is present.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name);

}  // namespace fs
