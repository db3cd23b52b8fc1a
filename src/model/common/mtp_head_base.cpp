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

Status MtpHeadBase::forward(ModelState& history, std::span<const float> hidden,
                            std::span<const TokenId> tokens, LogitsRows rows, ForwardOutput& out) {
  const auto S = static_cast<std::int64_t>(tokens.size()), W = hidden_width();
  if (static_cast<std::int64_t>(hidden.size()) != S * W)
    return invalid_argument("MTP head: " + std::to_string(hidden.size()) + " hidden values for " +
                            std::to_string(S) + " rows of width " + std::to_string(W));
  // Queued without a wait on a device backend (Backend::upload_rows): the head's first op is
  // launched while the copy is in flight.
  Tensor h;
  if (S > 0) head_backend().upload_rows(hidden, W, h);
  return forward_rows(history, h, tokens, rows, out);
}

Status MtpHeadBase::absorb_rows(ModelState& history, std::span<const float> before,
                                const Tensor& rows, std::span<const TokenId> tokens) {
  const auto n = static_cast<std::int64_t>(tokens.size()), W = hidden_width();
  if (!before.empty() && static_cast<std::int64_t>(before.size()) != W)
    return invalid_argument("MTP head: a previous hidden row of " + std::to_string(before.size()) +
                            " values for width " + std::to_string(W));
  if (n > 0 && (rows.shape().size() != 2 || rows.rows() != n || rows.cols() != W))
    return invalid_argument("MTP head: hidden rows " + shape_to_string(rows.shape()) + " for " +
                            std::to_string(n) + " tokens of width " + std::to_string(W));
  Backend& be = head_backend();
  Tensor pairs, body;
  if (!before.empty()) be.upload_rows(before, W, pairs);
  if (n > 1) {
    be.slice_rows(rows, 0, n - 1, before.empty() ? pairs : body);
    if (!before.empty()) be.append_rows(pairs, body);
  }
  const auto skip = before.empty() ? 1 : 0;
  if (n - skip <= 0) return {};
  ForwardOutput ignored;
  return forward_rows(history, pairs, tokens.subspan(static_cast<std::size_t>(skip)),
                      LogitsRows::kNone, ignored);
}

Status MtpHeadBase::check_inputs(const ModelState& history, const Tensor& hidden,
                                 std::span<const TokenId> tokens) const {
  const auto S = static_cast<std::int64_t>(tokens.size()), W = hidden_width();
  if (S > 0 && (hidden.dtype() != DType::kF32 || hidden.shape().size() != 2 || hidden.rows() != S ||
                hidden.cols() != W))
    return invalid_argument("MTP head: hidden rows " + shape_to_string(hidden.shape()) + " for " +
                            std::to_string(S) + " rows of width " + std::to_string(W));
  if (S > 0 && hidden.device() != head_backend().memory()->device())
    return invalid_argument("MTP head: hidden rows outside the head's backend memory");
  if (Status s = check_token_ids(tokens, vocab_size_, "MTP head: "); !s.ok()) return s;
  if (history.cache_count() != 1) return invalid_argument("MTP history has the wrong shape");
  if (Status s = history.check_allocated(); !s.ok()) return s.with_context("MTP history");
  return {};
}

Status MtpHeadBase::finish(Backend& be, LogitsRows rows, const Tensor& x, Tensor logits,
                           const Tensor& ids, ForwardOutput& out) const {
  if (Status s = take_backend_status(be); !s.ok()) return s.with_context("MTP head");
  out.hidden_width = hidden_width();
  // Appending to the history only (kNone, a prefill's rows): nothing to return.
  if (rows != LogitsRows::kNone) out.hidden = x.to_host_vector();
  if (Status s = logits_to_output(be, rows, std::move(logits), ids, out); !s.ok())
    return s.with_context("MTP head");
  return {};
}

}  // namespace fs
