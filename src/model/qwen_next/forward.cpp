#include "model/qwen_next/forward.h"

#include <cmath>
#include <cstdint>

#include "model/common/forward_inputs.h"
#include "model/common/hyper_connection.h"
#include "model/common/logits.h"
#include "model/common/moe.h"
#include "model/common/ngram_hash.h"
#include "model/qwen_next/mtp.h"
#include "model/qwen_next/step_graph.h"

namespace fs {
namespace {

Activation gate_activation(const std::string& name) {
  return name == "silu" ? Activation::kSilu : Activation::kSigmoid;
}

// A step graph's buffers in the state: every cache tensor a recorded kernel reads or writes, by
// address and capacity (two states, or a regrown cache, are other buffers: another key).
template <typename Bound>
std::vector<std::int64_t> cache_identity(const std::vector<Bound>& bound) {
  std::vector<std::int64_t> words;
  for (const auto& b : bound) {
    if (b.gdn != nullptr) {
      add_buffer_identity(b.gdn->recurrent, words);
      add_buffer_identity(b.gdn->conv_tail, words);
      add_buffer_identity(b.gdn->window.states, words);
      add_buffer_identity(b.gdn->window.history, words);
    }
    if (b.ple != nullptr) {
      add_buffer_identity(b.ple->conv_tail, words);
      add_buffer_identity(b.ple->window.history, words);
    }
    if (b.qsa != nullptr) add_buffer_identity(*b.qsa, words);
  }
  return words;
}

// Room in every appendable cache for a step of S tokens, so nothing is reallocated inside its
// graph (step_graph.h).
template <typename Bound>
bool reserve_step(const std::vector<Bound>& bound, std::int64_t S) {
  for (const auto& b : bound) {
    if (b.qsa != nullptr && !reserve_step(*b.qsa, S)) return false;
  }
  return true;
}

// The key of a step graph: what fixes its ops and their non-scalar arguments (backend.h). The
// token count and rows fix the shapes; per GDN layer whether the state is warm (recurrent or
// chunked kernel), per QSA layer how many indexer blocks the step completes (the block branch);
// per recurrent cache whether it keeps its positions (speculation_window.h); then the cache
// buffers. Positions and cache lengths are per-step scalars, not part of it.
template <typename Bound>
Backend::StepGraphKey step_graph_key(const std::vector<Bound>& bound, std::int64_t S,
                                     LogitsRows rows) {
  Backend::StepGraphKey key;
  key.words = {S, static_cast<std::int64_t>(rows)};
  for (const auto& b : bound) {
    // Whether a recurrent cache keeps its positions (an MTP verify: other ops write its window).
    const auto keeps = [&](const SpeculationWindow& w) { return w.requested >= S ? 1 : 0; };
    if (b.gdn != nullptr) {
      key.words.push_back(b.gdn->covered > 0 ? 1 : 0);
      key.words.push_back(keeps(b.gdn->window));
    }
    if (b.ple != nullptr) key.words.push_back(keeps(b.ple->window));
    if (b.qsa != nullptr) key.words.push_back(blocks_completed(*b.qsa, S));
  }
  const auto identity = cache_identity(bound);
  key.words.insert(key.words.end(), identity.begin(), identity.end());
  return key;
}

}  // namespace

QwenNextModel::QwenNextModel(QwenNextConfig config, QwenNextWeights weights,
                             std::unique_ptr<Backend> backend)
    : config_(std::move(config)), weights_(std::move(weights)), backend_(std::move(backend)) {
  info_.backend = backend_->name();
  info_.dtype = weights_.dtype;
  info_.family = Family::kQwenNext;
  info_.vocab_size = config_.vocab_size;
  info_.hidden_size = config_.hidden_size;
  for (const auto e : config_.eos_token_ids) info_.eos_token_ids.push_back(static_cast<TokenId>(e));
  if (weights_.mtp) mtp_ = std::make_unique<QwenNextMtpHead>(*this, *weights_.mtp);
  info_.has_mtp = mtp_ != nullptr;
}

QwenNextModel::~QwenNextModel() = default;

void QwenNextModel::decoder_layer(const QwenLayerWeights& lw, const LayerCaches& caches,
                                  Position first, std::span<const TokenId> tokens, Tensor& h) {
  auto& be = *backend_;
  Tensor x, inject;
  // Each sublayer's output y goes into the streams: h = h + concat_s(inject[:, s] * y).
  const StreamsWrite write{h, inject};
  if (lw.ple) ple_inject(*lw.ple, *caches.ple, tokens, h);
  hyper_connection_read(be, lw.attn_hc, h, x, &inject);
  if (lw.kind == QwenLayerKind::kLinearAttention) {
    gated_delta_net(*lw.gdn, *caches.gdn, x, write);
  } else {
    qsa_attention(*lw.qsa, *caches.qsa, first, x, write);
  }
  hyper_connection_read(be, lw.mlp_hc, h, x, &inject);
  moe(be, lw.moe, x, write);
}

// PLE (Q4M 1235-1255): hashed n-gram embeddings gate a shared value per stream; a dilated causal
// conv adds local context; the result is added to every stream before the attention read.
void QwenNextModel::ple_inject(const PleWeights& w, PleCache& cache,
                               std::span<const TokenId> tokens, Tensor& h) {
  auto& be = *backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), H = config_.hidden_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<std::int64_t> ids;
  auto context = cache.context_ids();
  const bool keep = cache.window.open(cache.covered, S);
  if (keep) {  // the context, then this call's tokens: the context after each of them
    cache.window.ids = context;
    cache.window.ids.insert(cache.window.ids.end(), tokens.begin(), tokens.end());
  }
  ngram_ids(w.hash, context, tokens, ids);
  cache.set_context_ids(context);
  Tensor emb, key, value, query, gate, gated, normed, conv;
  // The table stays in the host mapping; the backend gathers the touched rows and copies them.
  be.embedding(w.table_shards, ids, emb);   // [S*NH, de]
  emb.reshape({S, config_.ple_embed_dim});  // heads concatenated per token
  be.linear(emb, w.key_proj, key);
  be.rms_norm(key, w.norm_key, H, eps, true, key);
  be.linear(emb, w.value_proj, value);
  be.rms_norm(h, w.norm_query, H, eps, true, query);
  be.grouped_dot(key, query, H, gate);  // [S, hc]
  be.scale(gate, 1.0f / std::sqrt(static_cast<float>(H)));
  be.signed_sqrt(gate, 1e-6f);
  be.activate(gate, Activation::kSigmoid);
  gated = be.new_tensor({S, config_.stream_width()});
  be.add_scaled_streams(gated, value, gate);
  be.rms_norm(gated, w.norm_conv, H, eps, true, normed);
  if (keep) keep_conv_inputs(cache.conv_tail, normed, cache.window);
  be.causal_conv1d(normed, w.conv1d, config_.ngram_size, cache.conv_tail, conv);
  be.activate(conv, Activation::kSilu);
  be.add(gated, conv);
  be.add(h, gated);
  cache.covered += S;
}

// A verify's window keeps the conv tail before the call followed by the call's conv inputs, so
// the tail after any of its tokens is a slice (speculation_window.h). Buffers were reserved by
// keep_positions, so nothing here allocates.
void QwenNextModel::keep_conv_inputs(const Tensor& tail, const Tensor& inputs,
                                     SpeculationWindow& window) {
  backend_->slice_rows(tail, 0, tail.rows(), window.history);
  backend_->append_rows(window.history, inputs);
}

// GatedDeltaNet (Q4M 510-625).
void QwenNextModel::gated_delta_net(const GatedDeltaNetWeights& w, GatedDeltaNetCache& cache,
                                    const Tensor& x, const StreamsWrite& out) {
  auto& be = *backend_;
  const auto S = x.rows(), Hk = config_.linear_num_key_heads, Hv = config_.linear_num_value_heads;
  const auto dk = config_.linear_key_head_dim, dv = config_.linear_value_head_dim;
  const auto key_dim = config_.gdn_key_dim(), value_dim = config_.gdn_value_dim();
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  const auto act = gate_activation(config_.output_gate_type);
  Tensor qkv, z, b, a, q, k, v;
  const bool keep = cache.window.open(cache.covered, S);
  // A decode step (one token, warm state, nothing kept for a rollback): the same math as below
  // in two ops, one kernel each on a GPU (backend.h).
  if (!keep && S == 1 && cache.covered > 0) {
    Tensor mixed, normed;
    be.gated_delta_net_in_proj_conv(x, w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a,
                                    w.dt_bias, w.decay_rate, w.conv1d, cache.conv_tail, mixed, z, b,
                                    a);
    be.gated_delta_net_core(mixed, z, b, a, Hk, dk, w.norm, eps, act, cache.recurrent, normed);
    project_into_streams(be, normed, w.out_proj, out);
    cache.covered += S;
    return;
  }
  // beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias), the log decay (Q4M 579-581).
  be.gated_delta_net_in_proj(x, w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a, w.dt_bias,
                             w.decay_rate, qkv, z, b, a);
  if (keep) keep_conv_inputs(cache.conv_tail, qkv, cache.window);
  // silu(conv(qkv)) split into q, k, v; l2norm of q and k (eps 1e-6, FLA's convention), then
  // q * dk^-0.5 (Q4M 300-310).
  be.gated_delta_net_conv(qkv, w.conv1d, cache.conv_tail, key_dim, dk, q, k, v);
  Tensor core;
  // The reference's kernel choice (Q4M 586-612): recurrent only for one token on a warm state
  // (the decode step above). An MTP verify keeps the state after each token (rollback by a copy,
  // no second forward).
  if (keep) {
    be.gated_delta_rule_positions(q, k, v, a, b, Hk, cache.recurrent, core, cache.window.states);
  } else {
    be.gated_delta_rule_chunked(q, k, v, a, b, Hk, cache.recurrent, core);
  }
  core.reshape({S * Hv, dv});
  z.reshape({S * Hv, dv});
  Tensor normed;
  be.rms_norm_gated(core, w.norm, z, eps, act, normed);
  normed.reshape({S, value_dim});
  project_into_streams(be, normed, w.out_proj, out);
  cache.covered += S;
}

void QwenNextModel::qsa_indexer(const QsaWeights& w, QsaCache& cache, Position first,
                                const Tensor& qk, Tensor& picked) {
  auto& be = *backend_;
  const auto nI = config_.indexer_n_heads, dI = config_.indexer_head_dim, c = cache.block;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  Tensor q, raw;
  be.slice_cols(qk, 0, nI * dI, q);
  be.slice_cols(qk, nI * dI, dI, raw);
  be.head_norm_rope(q, w.index_q_norm, nullptr, {}, dI, eps, config_.rotary_dim(), first,
                    config_.rope_theta);
  be.append_rows(cache.index_keys, raw);
  // Blocks completed by this call: mean of raw keys (fp32), k_layernorm, RoPE at the block's
  // first position (Q4M 741-752). They never change afterwards, so they are cached.
  const auto done = cache.blocks.rows(), total = cache.index_keys.rows() / c;
  if (total > done) {
    Tensor pooled;
    be.block_mean(cache.index_keys, done * c, total - done, c, pooled);
    be.rms_norm(pooled, w.index_k_norm, dI, eps, true, pooled);
    be.rope(pooled, dI, config_.rotary_dim(), done * c, c, config_.rope_theta);
    be.append_rows(cache.blocks, pooled);
  }
  Tensor scores;
  be.index_scores(q, cache.blocks, nI, 1.0f / std::sqrt(static_cast<float>(dI)), scores);
  // Each query keeps its best complete visible blocks; the attention adds the unfinished tail.
  // With a budget covering every complete block this is dense causal attention.
  be.select_blocks(scores, first, c, config_.indexer_budget / c, picked);
}

// QSA attention (Q4M 847-901): gated GQA attention over the indexer's selection.
void QwenNextModel::qsa_attention(const QsaWeights& w, QsaCache& cache, Position first,
                                  const Tensor& x, const StreamsWrite& out) {
  auto& be = *backend_;
  const auto Hq = config_.num_attention_heads, Hkv = config_.num_key_value_heads,
             D = config_.head_dim;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  // The four products over x in one op (one kernel on a GPU at decode sizes).
  Tensor qg, k, v, index_qk;
  be.qsa_projections(x, w.q_proj, w.k_proj, w.v_proj, w.index_qk_proj, w.q_bias, w.k_bias, w.v_bias,
                     qg, k, v, index_qk);
  Tensor picked;
  qsa_indexer(w, cache, first, index_qk, picked);
  Tensor q, gate, o;
  be.split_interleaved(qg, Hq, D, q, gate);  // per head [query | output gate]
  // Per-head norms and RoPE of q and k (one kernel on a GPU).
  be.head_norm_rope(q, w.q_norm, &k, w.k_norm, D, eps, config_.rotary_dim(), first,
                    config_.rope_theta);
  be.append_rows(cache.keys, k);
  be.append_rows(cache.values, v);
  // The output gate, o * sigmoid(gate), in the attention's op.
  be.gated_block_sparse_attention(q, cache.keys, cache.values, Hq, Hkv, picked, cache.block, first,
                                  1.0f / std::sqrt(static_cast<float>(D)), gate,
                                  Activation::kSigmoid, o);
  if (w.o_bias.empty()) return project_into_streams(be, o, w.o_proj, out);
  Tensor y;
  be.linear(o, w.o_proj, y);
  be.add_bias(y, w.o_bias);
  be.add_scaled_streams(out.h, y, out.inject);
}

Status QwenNextModel::forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                              ForwardOutput& out, HiddenRows where) {
  auto& be = *backend_;
  const auto S = static_cast<std::int64_t>(tokens.size());
  if (Status s = check_token_ids(tokens, config_.vocab_size); !s.ok()) return s;
  auto covered = state.covered_tokens();
  if (!covered.ok()) return covered.status();
  const Position first = *covered;

  out = ForwardOutput{};
  if (S == 0) return {};
  // Bind every layer to its caches before touching any, so a foreign state changes nothing.
  std::vector<LayerCaches> bound(weights_.layers.size());
  std::size_t ci = 0;
  for (std::size_t i = 0; i < weights_.layers.size(); ++i) {
    const auto& lw = weights_.layers[i];
    if (lw.kind == QwenLayerKind::kLinearAttention) {
      auto gdn = typed_cache<GatedDeltaNetCache>(state, ci++);
      if (!gdn.ok()) return gdn.status();
      bound[i].gdn = *gdn;
      if (lw.ple) {
        auto ple = typed_cache<PleCache>(state, ci++);
        if (!ple.ok()) return ple.status();
        bound[i].ple = *ple;
      }
    } else {
      auto qsa = typed_cache<QsaCache>(state, ci++);
      if (!qsa.ok()) return qsa.status();
      bound[i].qsa = *qsa;
    }
  }
  if (ci != state.cache_count()) return invalid_argument("state has more caches than this model");
  if (Status s = state.check_allocated(); !s.ok()) return s;

  // A decode step (the autoregressive step, or an MTP verify of up to 4 rows; greedy picks on the
  // device, so only ids and hidden rows cross back) runs as one graph where the backend has them
  // (DESIGN "On the GPU" rule 5, docs/GPU.md): the first step of a key is recorded, later ones
  // replay it, the ops below doing only their host work (the PLE n-gram ids, the embedding
  // descriptors, shapes, per-step positions) while the kept graph does the rest. Nothing between
  // begin and launch returns early or reads device memory.
  constexpr std::int64_t kMaxGraphTokens = 4;  // the verify of MTP depth 3
  const bool graph = S <= kMaxGraphTokens && logits_stay_on_backend(rows) && be.step_graphs();
  std::vector<std::int64_t> identity;
  if (graph) {
    if (!reserve_step(bound, S))
      return out_of_range("out of " + device_name(be.memory()->device()) +
                          " memory reserving the caches for a step");
    const auto key = step_graph_key(bound, S, rows);
    identity = cache_identity(bound);
    be.begin_step_graph(key);
  }
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  Tensor e, h;
  be.embedding({&weights_.embed_tokens, 1}, ids, e);
  be.repeat_cols(e, config_.hc_count, h);  // every stream starts as the embedding (Q4M 1480)
  for (std::size_t i = 0; i < weights_.layers.size(); ++i) {
    decoder_layer(weights_.layers[i], bound[i], first, tokens, h);
  }
  // No final RMSNorm: the mixer's grouped hc_norm is the last normalisation (Q4M 1493).
  Tensor mixed;
  hyper_connection_read(be, weights_.final_mixer, h, mixed, nullptr);
  // The MTP head reads the widened stream (all hc streams), before the mixer.
  Tensor logits, picked;
  lm_head_rows(be, mixed, rows, weights_.lm_head, logits, picked);
  if (graph) be.launch_step_graph();
  // The one check of the step: any op that failed (out of memory, a launch error, an op the
  // backend lacks) makes the whole forward fail, and the state must not be used.
  if (Status s = take_backend_status(be); !s.ok()) return s;
  if (graph) {
    // The key named these buffers: one reallocated inside the step would be the graph's.
    if (cache_identity(bound) != identity)
      return internal_error("a state cache was reallocated inside a step graph");
    // The step's tensors are the graph's blocks, which its next replay overwrites: the logits
    // the caller keeps move to a pooled copy (one device copy; h and the ids are read below).
    if (!logits.shape().empty()) {
      Tensor kept = logits;
      logits = std::move(kept);
    }
  }
  // The requested rows cross to the host: the logits (or only their argmax ids), and the widened
  // stream (all hc streams, before the mixer), which the MTP head reads.
  hidden_to_output(be, h, config_.stream_width(), where, graph, out);
  return logits_to_output(be, rows, std::move(logits), picked, out);
}

}  // namespace fs
