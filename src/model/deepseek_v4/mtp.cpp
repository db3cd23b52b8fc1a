#include "model/deepseek_v4/mtp.h"

#include "model/common/logits.h"
#include "model/common/mhc.h"
#include "model/deepseek_v4/forward.h"

namespace fs {

std::unique_ptr<ModelState> DeepseekV4MtpHead::new_history() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(std::make_unique<DsAttentionCache>(model_.config_, DsAttentionKind::kSliding,
                                                      model_.backend_->memory()));
  return std::make_unique<ModelState>(std::move(caches));
}

std::int64_t DeepseekV4MtpHead::hidden_width() const {
  return model_.config_.hc_mult * model_.config_.hidden_size;
}

Status DeepseekV4MtpHead::set_draft_vocabulary(std::int64_t n) {
  const auto vocab = model_.config_.vocab_size;
  if (n < 0 || n > vocab)
    return invalid_argument("MTP draft vocabulary " + std::to_string(n) + " is outside [0, " +
                            std::to_string(vocab) + "]");
  draft_vocab_ = n == vocab ? 0 : n;
  return {};
}

std::int64_t DeepseekV4MtpHead::draft_vocabulary() const {
  return draft_vocab_ > 0 ? draft_vocab_ : model_.config_.vocab_size;
}

Status DeepseekV4MtpHead::forward(ModelState& history, std::span<const float> hidden,
                                  std::span<const TokenId> tokens, LogitsRows rows,
                                  ForwardOutput& out) {
  const auto& c = model_.config_;
  auto& be = *model_.backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), H = c.hidden_size, hc = c.hc_mult;
  const auto W = hidden_width();
  if (static_cast<std::int64_t>(hidden.size()) != S * W)
    return invalid_argument("MTP head: " + std::to_string(hidden.size()) + " hidden values for " +
                            std::to_string(S) + " rows of width " + std::to_string(W));
  for (const auto t : tokens) {
    if (t < 0 || t >= c.vocab_size)
      return invalid_argument("MTP head: token id " + std::to_string(t) + " out of range");
  }
  if (history.cache_count() != 1) return invalid_argument("MTP history has the wrong shape");
  auto* cache = dynamic_cast<DsAttentionCache*>(&history.cache(0));
  if (cache == nullptr || cache->layer_kind != DsAttentionKind::kSliding)
    return invalid_argument("MTP history cache has the wrong type");
  if (Status s = history.check_allocated(); !s.ok()) return s.with_context("MTP history");
  out = ForwardOutput{};
  if (S == 0) return {};
  const Position first = cache->covered_tokens();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // x = h_proj(hnorm(h_s)) per stream + e_proj(enorm(embed(token))) broadcast to the streams.
  // The trunk's streams come back in from the host (the caller holds them).
  Tensor h = be.new_tensor({S, W});
  if (h.ok()) h.copy_from_host(hidden);
  Tensor n, x, e, e_normed, e_projected, e_streams;
  be.rms_norm(h, w_.hnorm, H, eps, false, n);
  n.reshape({S * hc, H});
  be.linear(n, w_.h_proj, x);
  x.reshape({S, W});
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  be.embedding({&model_.weights_.embed_tokens, 1}, ids, e);
  be.rms_norm(e, w_.enorm, H, eps, false, e_normed);
  be.linear(e_normed, w_.e_proj, e_projected);
  be.repeat_cols(e_projected, hc, e_streams);
  be.add(x, e_streams);

  const Tensor token_ids;  // score-routed: the router reads no token ids
  model_.decoder_layer(w_.layer, *cache, first, token_ids, x);

  Tensor collapsed, logits, picked;
  if (rows != LogitsRows::kNone) {
    mhc_head(be, w_.hc_head, x, collapsed);
    be.rms_norm(collapsed, w_.norm, H, eps, false, collapsed);
    const Weight head = draft_vocab_ > 0 ? model_.weights_.lm_head.first_rows(draft_vocab_)
                                         : model_.weights_.lm_head;
    lm_head_rows(be, collapsed, rows, head, logits, picked);
  }
  if (Status s = take_backend_status(be); !s.ok()) return s.with_context("MTP head");
  out.hidden_width = W;
  out.hidden = x.to_host_vector();
  if (Status s = logits_to_output(be, rows, std::move(logits), picked, out); !s.ok())
    return s.with_context("MTP head");
  return {};
}

}  // namespace fs
