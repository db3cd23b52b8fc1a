#include "model/glm5/mtp.h"

#include "model/common/logits.h"
#include "model/common/moe.h"
#include "model/glm5/forward.h"

namespace fs {

std::unique_ptr<ModelState> Glm5MtpHead::new_history() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(
      std::make_unique<DsaCache>(model_.config_, /*full=*/true, model_.backend_->memory()));
  return std::make_unique<ModelState>(std::move(caches));
}

std::int64_t Glm5MtpHead::hidden_width() const {
  return model_.config_.hidden_size;
}

Status Glm5MtpHead::set_draft_vocabulary(std::int64_t n) {
  const auto vocab = model_.config_.vocab_size;
  if (n < 0 || n > vocab)
    return invalid_argument("MTP draft vocabulary " + std::to_string(n) + " is outside [0, " +
                            std::to_string(vocab) + "]");
  draft_vocab_ = n == vocab ? 0 : n;
  return {};
}

std::int64_t Glm5MtpHead::draft_vocabulary() const {
  return draft_vocab_ > 0 ? draft_vocab_ : model_.config_.vocab_size;
}

Status Glm5MtpHead::forward(ModelState& history, std::span<const float> hidden,
                            std::span<const TokenId> tokens, LogitsRows rows, ForwardOutput& out) {
  const auto& c = model_.config_;
  auto& be = *model_.backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), D = c.hidden_size;
  if (static_cast<std::int64_t>(hidden.size()) != S * D) {
    return invalid_argument("MTP head: " + std::to_string(hidden.size()) + " hidden values for " +
                            std::to_string(S) + " rows of width " + std::to_string(D));
  }
  for (const auto t : tokens) {
    if (t < 0 || t >= c.vocab_size)
      return invalid_argument("MTP head: token id " + std::to_string(t) + " out of range");
  }
  if (history.cache_count() != 1) return invalid_argument("MTP history has the wrong shape");
  auto* cache = dynamic_cast<DsaCache*>(&history.cache(0));
  if (cache == nullptr || !cache->full_indexer)
    return invalid_argument("MTP history cache has the wrong type");
  if (Status s = history.check_allocated(); !s.ok()) return s.with_context("MTP history");
  out = ForwardOutput{};
  if (S == 0) return {};
  const Position first = cache->covered_tokens();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // x = eh_proj([enorm(embed(x_t)) | hnorm(h)]) as the sum of the two halves' products. The
  // trunk's hidden rows come back in from the host (the caller holds them).
  Tensor h = be.new_tensor({S, D});
  if (h.ok()) h.copy_from_host(hidden);
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  Tensor e, x, xh;
  be.embedding({&model_.weights_.embed_tokens, 1}, ids, e);
  be.rms_norm(e, w_.enorm, D, eps, false, e);
  be.rms_norm(h, w_.hnorm, D, eps, false, h);
  be.linear(e, w_.eh_embed, x);
  be.linear(h, w_.eh_hidden, xh);
  be.add(x, xh);

  Tensor a, y, picked;
  be.rms_norm(x, w_.input_layernorm, D, eps, false, a);
  model_.dsa_attention(w_.attn, *cache, first, a, picked, y);
  be.add(x, y);
  be.rms_norm(x, w_.post_attention_layernorm, D, eps, false, a);
  clamped_moe(be, w_.moe, a, nullptr, y);
  be.add(x, y);

  Tensor normed, logits, argmax;
  if (rows != LogitsRows::kNone) {
    be.rms_norm(x, w_.shared_head_norm, D, eps, false, normed);
    const Weight head = draft_vocab_ > 0 ? model_.weights_.lm_head.first_rows(draft_vocab_)
                                         : model_.weights_.lm_head;
    lm_head_rows(be, normed, rows, head, logits, argmax);
  }
  if (Status s = take_backend_status(be); !s.ok()) return s.with_context("MTP head");
  out.hidden_width = D;
  out.hidden = x.to_host_vector();
  if (Status s = logits_to_output(be, rows, std::move(logits), argmax, out); !s.ok())
    return s.with_context("MTP head");
  return {};
}

}  // namespace fs
