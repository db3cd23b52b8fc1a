#include "model/qwen_next/mtp.h"

#include "model/common/hyper_connection.h"
#include "model/qwen_next/forward.h"

namespace fs {

std::unique_ptr<ModelState> QwenNextMtpHead::new_history() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(std::make_unique<QsaCache>(model_.config_, model_.backend_->memory()));
  return std::make_unique<ModelState>(std::move(caches));
}

std::int64_t QwenNextMtpHead::hidden_width() const {
  return model_.config_.stream_width();
}

Status QwenNextMtpHead::set_draft_vocabulary(std::int64_t n) {
  const auto vocab = model_.config_.vocab_size;
  if (n < 0 || n > vocab)
    return invalid_argument("MTP draft vocabulary " + std::to_string(n) + " is outside [0, " +
                            std::to_string(vocab) + "]");
  draft_vocab_ = n == vocab ? 0 : n;
  return {};
}

std::int64_t QwenNextMtpHead::draft_vocabulary() const {
  return draft_vocab_ > 0 ? draft_vocab_ : model_.config_.vocab_size;
}

Status QwenNextMtpHead::forward(ModelState& history, std::span<const float> hidden,
                                std::span<const TokenId> tokens, LogitsRows rows,
                                ForwardOutput& out) {
  const auto& c = model_.config_;
  auto& be = *model_.backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), H = c.hidden_size, hc = c.hc_count;
  const auto W = c.stream_width();
  if (static_cast<std::int64_t>(hidden.size()) != S * W) {
    return invalid_argument("MTP head: " + std::to_string(hidden.size()) + " hidden values for " +
                            std::to_string(S) + " rows of width " + std::to_string(W));
  }
  for (const auto t : tokens) {
    if (t < 0 || t >= c.vocab_size)
      return invalid_argument("MTP head: token id " + std::to_string(t) + " out of range");
  }
  if (history.cache_count() != 1) return invalid_argument("MTP history has the wrong shape");
  auto* cache = dynamic_cast<QsaCache*>(&history.cache(0));
  if (cache == nullptr) return invalid_argument("MTP history cache has the wrong type");
  if (Status s = history.check_allocated(); !s.ok()) return s.with_context("MTP history");
  out = ForwardOutput{};
  if (S == 0) return {};
  const Position first = cache->covered_tokens();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // x = fc_hidden(norm(h)) per stream + fc_embedding(norm(embed(token))) broadcast to the streams.
  // The trunk's hidden rows come back in from the host (the caller holds them).
  Tensor h = be.new_tensor({S, W});
  if (h.ok()) h.copy_from_host(hidden);
  Tensor n, projected, e, e_normed, e_projected, e_streams;
  be.rms_norm(h, w_.hidden_norm, H, eps, true, n);
  n.reshape({S * hc, H});
  be.linear(n, w_.fc_hidden, projected);
  projected.reshape({S, W});
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  be.embedding({&model_.weights_.embed_tokens, 1}, ids, e);
  be.rms_norm(e, w_.embed_norm, H, eps, true, e_normed);
  be.linear(e_normed, w_.fc_embedding, e_projected);
  be.repeat_cols(e_projected, hc, e_streams);
  be.add(projected, e_streams);

  QwenNextModel::LayerCaches caches;
  caches.qsa = cache;
  model_.decoder_layer(w_.layer, caches, first, tokens, projected);

  Tensor mixed, logits, picked;
  if (rows != LogitsRows::kNone) {
    hyper_connection_read(be, w_.mixer, projected, mixed, nullptr);
    const Weight head = draft_vocab_ > 0 ? model_.weights_.lm_head.first_rows(draft_vocab_)
                                         : model_.weights_.lm_head;
    model_.lm_head_rows(mixed, rows, logits, picked, head);
  }
  if (Status s = model_.take_backend_status(); !s.ok()) return s.with_context("MTP head");
  out.hidden_width = W;
  out.hidden = projected.to_host_vector();
  if (Status s = model_.logits_to_output(rows, std::move(logits), picked, out); !s.ok())
    return s.with_context("MTP head");
  return {};
}

}  // namespace fs
