#include "model/glm5/forward.h"

#include <cmath>

#include "model/common/forward_inputs.h"
#include "model/common/logits.h"
#include "model/common/mhc.h"
#include "model/common/moe.h"
#include "model/glm5/mtp.h"

namespace fs {
namespace {

float inv_sqrt(std::int64_t n) {
  return 1.0f / std::sqrt(static_cast<float>(n));
}

}  // namespace

Glm5Model::Glm5Model(Glm5Config config, Glm5Weights weights, std::unique_ptr<Backend> backend)
    : config_(std::move(config)), weights_(std::move(weights)), backend_(std::move(backend)) {
  info_.family = Family::kGlm5;
  info_.backend = backend_->name();
  info_.dtype = weights_.dtype;
  info_.vocab_size = config_.vocab_size;
  info_.hidden_size = config_.hidden_size;
  for (const auto e : config_.eos_token_ids) info_.eos_token_ids.push_back(static_cast<TokenId>(e));
  if (weights_.mtp) mtp_ = std::make_unique<Glm5MtpHead>(*this, *weights_.mtp);
  info_.has_mtp = mtp_ != nullptr;
}

Glm5Model::~Glm5Model() = default;

void Glm5Model::decoder_layer(const Glm5LayerWeights& lw, const LayerCaches& caches, Position first,
                              Tensor& h, Tensor& picked) {
  auto& be = *backend_;
  const auto H = config_.hidden_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  Tensor x, y;
  MhcMix mix;
  mhc_read(be, lw.attn_hc, h, x, mix);
  be.rms_norm(x, lw.input_layernorm, H, eps, /*unit_offset=*/false, x);
  if (lw.kind == GlmAttentionKind::kLinearAttention) {
    kimi_delta_attention(*lw.kda, *caches.kda, x, y);
  } else {
    dsa_attention(*lw.dsa, *caches.dsa, first, x, picked, y);
  }
  mhc_write(be, mix, y, h);
  mhc_read(be, lw.ffn_hc, h, x, mix);
  be.rms_norm(x, lw.post_attention_layernorm, H, eps, false, x);
  if (lw.mlp_kind == GlmMlpKind::kDense) {
    swiglu_mlp(be, lw.mlp, x, y);
  } else {
    clamped_moe(be, lw.moe, x, nullptr, y);
  }
  mhc_write(be, mix, y, h);
}

void Glm5Model::forget_gate(const KdaWeights& w, const Tensor& x, Tensor& g) {
  auto& be = *backend_;
  Tensor low;
  be.linear(x, w.f_a_proj, low);
  be.linear(low, w.f_b_proj, g);
  be.add_bias(g, w.dt_bias);  // u = f + dt_bias, fp32 (M:322)
  if (!std::isnan(config_.linear_lower_bound)) {
    // The safe gate: lb * sigmoid(A * u), in (lb, 0) (M:329-330).
    be.mul_cols(g, w.decay_rate);
    be.activate(g, Activation::kSigmoid);
    be.scale(g, static_cast<float>(config_.linear_lower_bound));
  } else {
    // -A * softplus(u) (M:333-336); decay_rate holds -A.
    be.activate(g, Activation::kSoftplus);
    be.mul_cols(g, w.decay_rate);
  }
}

// Kimi Delta Attention: q, k, v projections, each through its short causal conv + SiLU (fp32,
// M:661-686), q and k l2-normed per head with q scaled by dk^-0.5 (M:418-426, 451-454), the delta
// rule with a per-channel decay, then the sigmoid-gated RMSNorm and o_proj (M:731-735).
void Glm5Model::kimi_delta_attention(const KdaWeights& w, KdaCache& cache, const Tensor& x,
                                     Tensor& y) {
  auto& be = *backend_;
  const auto S = x.rows(), heads = config_.linear_num_heads, dk = config_.linear_head_dim;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  // An MTP verify keeps what truncate() needs to go back inside it: each conv tail before the
  // call followed by the call's conv inputs, and the state after every token.
  bool keep = false;
  for (auto* window : {&cache.window_q, &cache.window_k, &cache.window_v})
    keep = window->open(cache.covered, S);
  Tensor raw, q, k, v;
  auto conv = [&](const Weight& proj, const Weight& filter, Tensor& tail, SpeculationWindow& window,
                  Tensor& out) {
    be.linear(x, proj, raw);
    if (keep) {
      be.slice_rows(tail, 0, tail.rows(), window.history);
      be.append_rows(window.history, raw);
    }
    be.causal_conv1d(raw, filter, 1, tail, out);
  };
  conv(w.q_proj, w.conv_q, cache.conv_q, cache.window_q, q);
  conv(w.k_proj, w.conv_k, cache.conv_k, cache.window_k, k);
  conv(w.v_proj, w.conv_v, cache.conv_v, cache.window_v, v);
  for (auto* t : {&q, &k, &v}) be.activate(*t, Activation::kSilu);
  be.l2_norm(q, dk, 1e-6f);
  be.l2_norm(k, dk, 1e-6f);
  be.scale(q, inv_sqrt(dk));
  Tensor g, beta;
  forget_gate(w, x, g);
  be.linear(x, w.b_proj, beta);
  be.activate(beta, Activation::kSigmoid);
  Tensor core;
  // The reference's kernel choice (M:703-726): recurrent only for one token on a warm state.
  if (keep) {
    be.gated_delta_rule_positions(q, k, v, g, beta, heads, cache.recurrent, core,
                                  cache.window_q.states);
  } else if (S == 1 && cache.covered > 0) {
    be.gated_delta_rule_recurrent(q, k, v, g, beta, heads, cache.recurrent, core);
  } else {
    be.gated_delta_rule_chunked(q, k, v, g, beta, heads, cache.recurrent, core);
  }
  Tensor low, gate, normed;
  be.linear(x, w.g_a_proj, low);
  be.linear(low, w.g_b_proj, gate);
  core.reshape({S * heads, dk});
  gate.reshape({S * heads, dk});
  be.rms_norm_gated(core, w.o_norm, gate, eps, Activation::kSigmoid, normed);
  normed.reshape({S, heads * dk});
  be.linear(normed, w.o_proj, y);
  cache.covered += S;
}

void Glm5Model::dsa_indexer(const DsaIndexerWeights& w, DsaCache& cache, Position first,
                            const Tensor& x, const Tensor& q_resid, Tensor& picked) {
  auto& be = *backend_;
  const auto S = x.rows(), nI = config_.index_n_heads, dI = config_.index_head_dim;
  const auto kp = cache.kpool;
  Tensor qi, ki, gates;
  be.linear(q_resid, w.wq_b, qi);  // [S, nI*dI], no RoPE
  be.linear(x, w.wk, ki);
  be.layer_norm(ki, w.k_norm, w.k_norm_bias, 1e-6f, ki);
  be.linear(x, w.compress_gate, gates);
  be.append_rows(cache.index_keys, ki);
  be.append_rows(cache.index_gates, gates);
  // Pools completed by this call (M:902-975); a pool's compressed key depends only on its own
  // rows, so it is computed once and kept.
  const auto done = cache.pools.rows(), total = cache.index_keys.rows() / kp;
  if (total > done) {
    Tensor pooled;
    be.kpool_compress(cache.index_keys, cache.index_gates, w.compress_ape, kp, done * kp,
                      total - done, pooled);
    be.append_rows(cache.pools, pooled);
  }
  // I[s, p] = sum_h wt[s, h] * relu(qi_h . K~_p * dI^-0.5), wt = weights_proj(x) * nI^-0.5
  // (M:828-833). The head weights may be negative, so each head is scored apart.
  Tensor wt, scores;
  be.linear(x, w.weights_proj, wt);
  be.scale(wt, inv_sqrt(nI));
  scores = be.new_tensor({S, cache.pools.rows()});
  if (cache.pools.rows() > 0) {
    Tensor qh, sh, wh;
    for (std::int64_t h = 0; h < nI; ++h) {
      be.slice_cols(qi, h * dI, dI, qh);
      be.index_scores(qh, cache.pools, 1, inv_sqrt(dI), sh);
      be.slice_cols(wt, h, 1, wh);
      be.mul_rows(sh, wh);
      be.add(scores, sh);
    }
  }
  // The top index_topk/kpool complete pools whose last token the query sees (M:835-867); the
  // attention adds the query's unfinished pool (the tail, M:977-1027).
  be.select_blocks(scores, first, kp, config_.index_topk / kp, picked);
}

// MLA with low-rank q and kv and NoPE: every head's K and V come from the normed kv latent
// through kv_b_proj (M:1139-1156), cached expanded as HF caches them; softmax attention over the
// indexer's pools plus the tail, scaled by qk_head_dim^-0.5 (M:1131). No causal mask beyond the
// selection (the indexer only picks visible pools, the tail is causal).
void Glm5Model::dsa_attention(const DsaWeights& w, DsaCache& cache, Position first, const Tensor& x,
                              Tensor& picked, Tensor& y) {
  auto& be = *backend_;
  const auto heads = config_.num_attention_heads, D = config_.qk_head_dim();
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  Tensor q_resid, q, latent, kv, k, v;
  be.linear(x, w.q_a_proj, q_resid);
  if (!w.q_a_bias.empty()) be.add_bias(q_resid, w.q_a_bias);
  be.rms_norm(q_resid, w.q_a_layernorm, config_.q_lora_rank, eps, false, q_resid);
  be.linear(q_resid, w.q_b_proj, q);
  be.linear(x, w.kv_a_proj_with_mqa, latent);
  if (!w.kv_a_bias.empty()) be.add_bias(latent, w.kv_a_bias);
  be.rms_norm(latent, w.kv_a_layernorm, config_.kv_lora_rank, eps, false, latent);
  be.linear(latent, w.kv_b_proj, kv);
  be.split_interleaved(kv, heads, D, k, v);  // per head [K_nope | V]
  be.append_rows(cache.keys, k);
  be.append_rows(cache.values, v);
  if (w.indexer) dsa_indexer(*w.indexer, cache, first, x, q_resid, picked);
  Tensor o;
  be.block_sparse_attention(q, cache.keys, cache.values, heads, heads, picked, cache.kpool, first,
                            inv_sqrt(D), o);
  be.linear(o, w.o_proj, y);
  if (!w.o_bias.empty()) be.add_bias(y, w.o_bias);
}

Status Glm5Model::forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                          ForwardOutput& out, HiddenRows where) {
  auto& be = *backend_;
  const auto S = static_cast<std::int64_t>(tokens.size());
  if (Status s = check_token_ids(tokens, config_.vocab_size); !s.ok()) return s;
  auto covered = state.covered_tokens();
  if (!covered.ok()) return covered.status();
  const Position first = *covered;
  out = ForwardOutput{};
  if (S == 0) return {};
  // Bind every layer to its cache before touching any, so a foreign state changes nothing.
  std::vector<LayerCaches> bound(weights_.layers.size());
  if (Status s = check_cache_count(state, weights_.layers.size()); !s.ok()) return s;
  for (std::size_t i = 0; i < weights_.layers.size(); ++i) {
    if (weights_.layers[i].kind == GlmAttentionKind::kLinearAttention) {
      auto c = typed_cache<KdaCache>(state, i);
      if (!c.ok()) return c.status();
      bound[i].kda = *c;
    } else {
      auto c = typed_cache<DsaCache>(state, i);
      if (!c.ok()) return c.status();
      if ((*c)->full_indexer != weights_.layers[i].dsa->indexer.has_value())
        return invalid_argument("state cache " + std::to_string(i) + " has the wrong indexer kind");
      bound[i].dsa = *c;
    }
  }
  if (Status s = state.check_allocated(); !s.ok()) return s;

  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  Tensor e, h, picked;
  be.embedding({&weights_.embed_tokens, 1}, ids, e);
  be.repeat_cols(e, config_.hc_mult, h);  // every stream starts as the embedding (M:1477)
  for (std::size_t i = 0; i < weights_.layers.size(); ++i)
    decoder_layer(weights_.layers[i], bound[i], first, h, picked);
  // The final collapse is the plain mean over the streams (M:299-303), then the final norm.
  Tensor final;
  be.stream_mean(h, config_.hc_mult, final);
  be.rms_norm(final, weights_.norm, config_.hidden_size, static_cast<float>(config_.rms_norm_eps),
              false, final);
  Tensor logits, argmax;
  lm_head_rows(be, final, rows, weights_.lm_head, logits, argmax);
  if (Status s = take_backend_status(be); !s.ok()) return s;
  hidden_to_output(be, final, config_.hidden_size, where, false, out);
  return logits_to_output(be, rows, std::move(logits), argmax, out);
}

}  // namespace fs
