#include "model/qwen_next/mtp.h"

#include "model/common/hyper_connection.h"
#include "model/common/logits.h"
#include "model/qwen_next/forward.h"

namespace fs {

QwenNextMtpHead::QwenNextMtpHead(QwenNextModel& model, const QwenMtpWeights& weights)
    : MtpHeadBase(model.config_.vocab_size), model_(model), w_(weights) {}

std::unique_ptr<ModelState> QwenNextMtpHead::new_history() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(std::make_unique<QsaCache>(model_.config_, model_.backend_->memory()));
  return std::make_unique<ModelState>(std::move(caches));
}

std::int64_t QwenNextMtpHead::hidden_width() const {
  return model_.config_.stream_width();
}

Backend& QwenNextMtpHead::head_backend() const {
  return *model_.backend_;
}

Status QwenNextMtpHead::forward_rows(ModelState& history, const Tensor& hidden,
                                     std::span<const TokenId> tokens, LogitsRows rows,
                                     ForwardOutput& out) {
  const auto& c = model_.config_;
  auto& be = *model_.backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), H = c.hidden_size, hc = c.hc_count;
  const auto W = c.stream_width();
  auto cache = checked_history<QsaCache>(history, hidden, tokens);
  if (!cache.ok()) return cache.status();
  out = ForwardOutput{};
  if (S == 0) return {};
  const Position first = (*cache)->covered_tokens();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // x = fc_hidden(norm(h)) per stream + fc_embedding(norm(embed(token))) broadcast to the streams.
  const Tensor& h = hidden;
  Tensor n, x, e, e_normed, e_projected, e_streams;
  be.rms_norm(h, w_.hidden_norm, H, eps, true, n);
  n.reshape({S * hc, H});
  be.linear(n, w_.fc_hidden, x);
  x.reshape({S, W});
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  be.embedding({&model_.weights_.embed_tokens, 1}, ids, e);
  be.rms_norm(e, w_.embed_norm, H, eps, true, e_normed);
  be.linear(e_normed, w_.fc_embedding, e_projected);
  be.repeat_cols(e_projected, hc, e_streams);
  be.add(x, e_streams);

  QwenNextModel::LayerCaches caches;
  caches.qsa = *cache;
  model_.decoder_layer(w_.layer, caches, first, tokens, x);

  Tensor mixed, logits, picked;
  if (rows != LogitsRows::kNone) {
    hyper_connection_read(be, w_.mixer, x, mixed, nullptr);
    lm_head_rows(be, mixed, rows, draft_head(model_.weights_.lm_head), logits, picked);
  }
  return finish(be, rows, x, std::move(logits), picked, out);
}

}  // namespace fs
