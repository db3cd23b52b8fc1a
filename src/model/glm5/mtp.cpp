#include "model/glm5/mtp.h"

#include "model/common/logits.h"
#include "model/common/moe.h"
#include "model/glm5/forward.h"

namespace fs {

Glm5MtpHead::Glm5MtpHead(Glm5Model& model, const Glm5MtpWeights& weights)
    : MtpHeadBase(model.config_.vocab_size), model_(model), w_(weights) {}

std::unique_ptr<ModelState> Glm5MtpHead::new_history() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(
      std::make_unique<DsaCache>(model_.config_, /*full=*/true, model_.backend_->memory()));
  return std::make_unique<ModelState>(std::move(caches));
}

std::int64_t Glm5MtpHead::hidden_width() const {
  return model_.config_.hidden_size;
}

Backend& Glm5MtpHead::head_backend() const {
  return *model_.backend_;
}

Status Glm5MtpHead::forward_rows(ModelState& history, const Tensor& hidden,
                                 std::span<const TokenId> tokens, LogitsRows rows,
                                 ForwardOutput& out) {
  const auto& c = model_.config_;
  auto& be = *model_.backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), D = c.hidden_size;
  auto cache = checked_history<DsaCache>(history, hidden, tokens);
  if (!cache.ok()) return cache.status();
  if (!(*cache)->full_indexer) return invalid_argument("MTP history cache has the wrong type");
  out = ForwardOutput{};
  if (S == 0) return {};
  const Position first = (*cache)->covered_tokens();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // x = eh_proj([enorm(embed(x_t)) | hnorm(h)]) as the sum of the two halves' products.
  Tensor h;
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  Tensor e, x, xh;
  be.embedding({&model_.weights_.embed_tokens, 1}, ids, e);
  be.rms_norm(e, w_.enorm, D, eps, false, e);
  be.rms_norm(hidden, w_.hnorm, D, eps, false, h);
  be.linear(e, w_.eh_embed, x);
  be.linear(h, w_.eh_hidden, xh);
  be.add(x, xh);

  Tensor a, y, picked;
  be.rms_norm(x, w_.input_layernorm, D, eps, false, a);
  model_.dsa_attention(w_.attn, **cache, first, a, picked, y);
  be.add(x, y);
  be.rms_norm(x, w_.post_attention_layernorm, D, eps, false, a);
  clamped_moe(be, w_.moe, a, nullptr, y);
  be.add(x, y);

  Tensor normed, logits, argmax;
  if (rows != LogitsRows::kNone) {
    be.rms_norm(x, w_.shared_head_norm, D, eps, false, normed);
    lm_head_rows(be, normed, rows, draft_head(model_.weights_.lm_head), logits, argmax);
  }
  return finish(be, rows, x, std::move(logits), argmax, out);
}

}  // namespace fs
