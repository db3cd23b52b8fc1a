#include "model/common/mtp_head_base.h"

#include "model/common/logits.h"

namespace fs {

Status MtpHeadBase::set_draft_vocabulary(std::int64_t n) {
  if (n < 0 || n > vocab_size_)
    return invalid_argument("MTP draft vocabulary " + std::to_string(n) + " is outside [0, " +
                            std::to_string(vocab_size_) + "]");
  draft_vocab_ = n == vocab_size_ ? 0 : n;
  return {};
}

std::int64_t MtpHeadBase::draft_vocabulary() const {
  return draft_vocab_ > 0 ? draft_vocab_ : vocab_size_;
}

Weight MtpHeadBase::draft_head(const Weight& lm_head) const {
  return draft_vocab_ > 0 ? lm_head.first_rows(draft_vocab_) : lm_head;
}

Status MtpHeadBase::check_inputs(const ModelState& history, std::span<const float> hidden,
                                 std::span<const TokenId> tokens) const {
  const auto S = static_cast<std::int64_t>(tokens.size()), W = hidden_width();
  if (static_cast<std::int64_t>(hidden.size()) != S * W)
    return invalid_argument("MTP head: " + std::to_string(hidden.size()) + " hidden values for " +
                            std::to_string(S) + " rows of width " + std::to_string(W));
  if (Status s = check_token_ids(tokens, vocab_size_, "MTP head: "); !s.ok()) return s;
  if (history.cache_count() != 1) return invalid_argument("MTP history has the wrong shape");
  if (Status s = history.check_allocated(); !s.ok()) return s.with_context("MTP history");
  return {};
}

// Queued without a wait on a device backend (Backend::upload_rows): the head's first op is
// launched while the copy is in flight.
Tensor MtpHeadBase::upload_hidden(Backend& be, std::span<const float> hidden) const {
  Tensor h;
  be.upload_rows(hidden, hidden_width(), h);
  return h;
}

Status MtpHeadBase::finish(Backend& be, LogitsRows rows, const Tensor& x, Tensor logits,
                           const Tensor& ids, ForwardOutput& out) const {
  if (Status s = take_backend_status(be); !s.ok()) return s.with_context("MTP head");
  out.hidden_width = hidden_width();
  out.hidden = x.to_host_vector();
  if (Status s = logits_to_output(be, rows, std::move(logits), ids, out); !s.ok())
    return s.with_context("MTP head");
  return {};
}

}  // namespace fs
