#include "model/deepseek_v4/forward.h"

#include <cmath>

#include "model/common/forward_inputs.h"
#include "model/common/logits.h"
#include "model/common/mhc.h"
#include "model/common/moe.h"
#include "model/deepseek_v4/mtp.h"
#include "model/deepseek_v4/numerics.h"

namespace fs {

DeepseekV4Model::DeepseekV4Model(DeepseekV4Config config, DeepseekV4Weights weights,
                                 std::unique_ptr<Backend> backend, Numerics numerics)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(std::move(backend)),
      official_numerics_(numerics == Numerics::kOfficial) {
  info_.family = Family::kDeepseekV4;
  info_.backend = backend_->name();
  info_.dtype = weights_.dtype;
  info_.vocab_size = config_.vocab_size;
  info_.hidden_size = config_.hidden_size;
  info_.numerics = numerics;
  for (const auto e : config_.eos_token_ids) info_.eos_token_ids.push_back(static_cast<TokenId>(e));
  if (weights_.mtp) mtp_ = std::make_unique<DeepseekV4MtpHead>(*this, *weights_.mtp);
  info_.has_mtp = mtp_ != nullptr;
}

DeepseekV4Model::~DeepseekV4Model() = default;

const Weight& DeepseekV4Model::inv_freq(DsAttentionKind kind) const {
  // Sliding layers rotate with the main rope, compressed ones with the compress rope (HF 766).
  return kind == DsAttentionKind::kSliding ? weights_.main_inv_freq : weights_.compress_inv_freq;
}

void DeepseekV4Model::decoder_layer(const DsLayerWeights& lw, DsAttentionCache& cache,
                                    Position first, const Tensor& token_ids, Tensor& h) {
  auto& be = *backend_;
  const auto H = config_.hidden_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  Tensor u, x, y;
  MhcMix mix;
  mhc_read(be, lw.attn_hc, h, u, mix);
  be.rms_norm(u, lw.input_layernorm, H, eps, false, x);
  attention(lw, cache, first, x, y);
  mhc_write(be, mix, y, h);
  mhc_read(be, lw.ffn_hc, h, u, mix);
  be.rms_norm(u, lw.post_attention_layernorm, H, eps, false, x);
  clamped_moe(be, lw.moe, x, &token_ids, y);
  mhc_write(be, mix, y, h);
}

// HF DeepseekV4Attention (HF 794-863): q through the q LoRA with an unweighted per-head norm,
// one K=V head, partial interleaved RoPE on the tails, sink attention over the sliding window
// (and the compressed rows of CSA/HCA layers), the inverse RoPE on the output, the grouped output
// projection.
void DeepseekV4Model::attention(const DsLayerWeights& lw, DsAttentionCache& cache, Position first,
                                const Tensor& x, Tensor& y) {
  auto& be = *backend_;
  const auto& a = lw.attn;
  const auto D = config_.head_dim, S = x.rows();
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  const Weight& f = inv_freq(lw.kind);
  Tensor qa, q_latent, q, kv;
  be.linear(x, a.q_a_proj, qa);
  be.rms_norm(qa, a.q_a_norm, config_.q_lora_rank, eps, false, q_latent);
  be.linear(q_latent, a.q_b_proj, q);
  be.rms_norm(q, weights_.unit_head, D, eps, false, q);
  be.rope_interleaved(q, D, f, first, 1, false);
  be.linear(x, a.kv_proj, kv);
  be.rms_norm(kv, a.kv_norm, D, eps, false, kv);
  be.rope_interleaved(kv, D, f, first, 1, false);
  if (official_numerics_) simulate_kv_fp8(be, config_, kv);
  const auto kv_first = cache.raw_first();
  be.append_rows(cache.raw, kv);

  Tensor picked;
  const Tensor* picks = nullptr;
  if (a.compressor) compressor(*a.compressor, *cache.compressor, first, x, CompressedRows::kKv);
  if (a.indexer) {
    indexer(*a.indexer, *cache.indexer, first, x, q_latent, picked);
    // Before the first window closes there is nothing to pick (and no compressed row).
    if (cache.indexer->rows.rows() > 0) picks = &picked;
  }
  const Tensor none;
  Tensor o;
  be.sink_attention(q, cache.raw, kv_first, config_.sliding_window,
                    a.compressor ? cache.compressor->rows : none, config_.compress_rate(lw.kind),
                    picks, a.sinks, first, 1.0f / std::sqrt(static_cast<float>(D)), o);
  // V carried RoPE on its tail: the conjugate rotation at the query's position removes it.
  be.rope_interleaved(o, D, f, first, 1, true);
  Tensor z;
  be.grouped_linear(o, a.o_a_proj, config_.o_groups, z);
  be.linear(z, a.o_b_proj, y);
  cache.covered += S;
  cache.trim(be);
}

// HF DeepseekV4{HCA,CSA}Compressor (HF 375-436, 617-690): gate-softmax pooling of every closed
// window, kv_norm, RoPE at the window's first position (compress rope).
void DeepseekV4Model::compressor(const DsCompressorWeights& w, DsCompressorState& state,
                                 Position first, const Tensor& x, CompressedRows kind) {
  auto& be = *backend_;
  Tensor kv, gate;
  be.linear(x, w.kv_proj, kv);
  be.linear(x, w.gate_proj, gate);
  const auto src_first = first - state.kv.rows();
  be.append_rows(state.kv, kv);
  be.append_rows(state.gate, gate);
  const auto done = state.rows.rows(), total = (first + x.rows()) / w.ratio;
  if (total <= done) return;
  Tensor pooled;
  be.compressor_pool(state.kv, state.gate, src_first, w.position_bias, done, total - done,
                     w.overlap, pooled);
  const auto width = pooled.cols();
  be.rms_norm(pooled, w.kv_norm, width, static_cast<float>(config_.rms_norm_eps), false, pooled);
  be.rope_interleaved(pooled, width, weights_.compress_inv_freq, done * w.ratio, w.ratio, false);
  if (official_numerics_) {
    if (kind == CompressedRows::kKv)
      simulate_kv_fp8(be, config_, pooled);
    else
      simulate_indexer_fp4(be, config_, pooled);
  }
  be.append_rows(state.rows, pooled);
}

// HF DeepseekV4Indexer (HF 508-577): its own compressor at index_head_dim, queries from the q
// latent, scores sum_h w_h relu(q_h . k) with w = weights_proj(x) / sqrt(Hi) and the ReLU'd dots
// / sqrt(di), then the top index_topk among the rows each query may see.
void DeepseekV4Model::indexer(const DsIndexerWeights& w, DsCompressorState& state, Position first,
                              const Tensor& x, const Tensor& q_latent, Tensor& picked) {
  auto& be = *backend_;
  compressor(w.compressor, state, first, x, CompressedRows::kIndexer);
  if (state.rows.rows() == 0) return;
  const auto di = config_.index_head_dim, Hi = config_.index_n_heads;
  Tensor q, weights, scores;
  be.linear(q_latent, w.q_b_proj, q);
  be.rope_interleaved(q, di, weights_.compress_inv_freq, first, 1, false);
  if (official_numerics_) simulate_indexer_fp4(be, config_, q);
  be.linear(x, w.weights_proj, weights);
  be.weighted_index_scores(q, state.rows, weights, 1.0f / std::sqrt(static_cast<float>(di * Hi)),
                           scores);
  be.select_blocks(scores, first, w.compressor.ratio, config_.index_topk, picked);
}

Status DeepseekV4Model::forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
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
  if (Status s = check_cache_count(state, weights_.layers.size()); !s.ok()) return s;
  std::vector<DsAttentionCache*> caches;
  for (std::size_t i = 0; i < weights_.layers.size(); ++i) {
    auto c = typed_cache<DsAttentionCache>(state, i);
    if (!c.ok()) return c.status();
    if ((*c)->layer_kind != weights_.layers[i].kind)
      return invalid_argument("state cache " + std::to_string(i) + " has the wrong type");
    caches.push_back(*c);
  }
  if (Status s = state.check_allocated(); !s.ok()) return s;

  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  // The hash-routed layers read the token ids on the backend.
  Tensor host_ids(host_memory(), {S, 1}, DType::kI32);
  for (std::int64_t i = 0; i < S; ++i)
    host_ids.data_as<std::int32_t>()[i] =
        static_cast<std::int32_t>(tokens[static_cast<std::size_t>(i)]);
  const Tensor token_ids = host_ids.to(be.memory());
  Tensor e, h;
  be.embedding({&weights_.embed_tokens, 1}, ids, e);
  be.repeat_cols(e, config_.hc_mult, h);  // every stream starts as the embedding (HF 1310)
  for (std::size_t i = 0; i < weights_.layers.size(); ++i)
    decoder_layer(weights_.layers[i], *caches[i], first, token_ids, h);
  Tensor collapsed, logits, picked;
  mhc_head(be, weights_.hc_head, h, collapsed);
  be.rms_norm(collapsed, weights_.norm, config_.hidden_size,
              static_cast<float>(config_.rms_norm_eps), false, collapsed);
  lm_head_rows(be, collapsed, rows, weights_.lm_head, logits, picked);
  if (Status s = take_backend_status(be); !s.ok()) return s;
  // The MTP head reads the streams before the hyper head.
  if (mtp_) hidden_to_output(be, h, config_.hc_mult * config_.hidden_size, where, false, out);
  return logits_to_output(be, rows, std::move(logits), picked, out);
}

}  // namespace fs
