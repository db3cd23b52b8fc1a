#include "model/deepseek_v4/mtp.h"

#include "model/common/logits.h"
#include "model/common/mhc.h"
#include "model/deepseek_v4/forward.h"

namespace fs {

DeepseekV4MtpHead::DeepseekV4MtpHead(DeepseekV4Model& model, const DsMtpWeights& weights)
    : MtpHeadBase(model.config_.vocab_size), model_(model), w_(weights) {}

std::unique_ptr<ModelState> DeepseekV4MtpHead::new_history() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(std::make_unique<DsAttentionCache>(model_.config_, DsAttentionKind::kSliding,
                                                      model_.backend_->memory()));
  return std::make_unique<ModelState>(std::move(caches));
}

std::int64_t DeepseekV4MtpHead::hidden_width() const {
  return model_.config_.hc_mult * model_.config_.hidden_size;
}

Backend& DeepseekV4MtpHead::head_backend() const {
  return *model_.backend_;
}

Status DeepseekV4MtpHead::forward_rows(ModelState& history, const Tensor& hidden,
                                       std::span<const TokenId> tokens, LogitsRows rows,
                                       ForwardOutput& out) {
  const auto& c = model_.config_;
  auto& be = *model_.backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), H = c.hidden_size, hc = c.hc_mult;
  const auto W = hidden_width();
  auto cache = checked_history<DsAttentionCache>(history, hidden, tokens);
  if (!cache.ok()) return cache.status();
  if ((*cache)->layer_kind != DsAttentionKind::kSliding)
    return invalid_argument("MTP history cache has the wrong type");
  out = ForwardOutput{};
  if (S == 0) return {};
  const Position first = (*cache)->covered_tokens();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // x = h_proj(hnorm(h_s)) per stream + e_proj(enorm(embed(token))) broadcast to the streams.
  const Tensor& h = hidden;
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
  model_.decoder_layer(w_.layer, **cache, first, token_ids, x);

  Tensor collapsed, logits, picked;
  if (rows != LogitsRows::kNone) {
    mhc_head(be, w_.hc_head, x, collapsed);
    be.rms_norm(collapsed, w_.norm, H, eps, false, collapsed);
    lm_head_rows(be, collapsed, rows, draft_head(model_.weights_.lm_head), logits, picked);
  }
  return finish(be, rows, x, std::move(logits), picked, out);
}

}  // namespace fs
