// What every family's MTP head (model/mtp.h) shares: the draft vocabulary, the checks of a
// forward's inputs, the trunk's hidden rows back onto the backend, and the output tail. A family's
// head keeps only its own math (how it mixes h_{t-1} with embed(x_t), its decoder block, its
// collapse before the shared lm_head).
#pragma once

#include <span>

#include "backend/backend.h"
#include "model/common/forward_inputs.h"
#include "model/mtp.h"

namespace fs {

class MtpHeadBase : public MtpHead {
 public:
  Status set_draft_vocabulary(std::int64_t n) final;
  std::int64_t draft_vocabulary() const final;

 protected:
  explicit MtpHeadBase(std::int64_t vocab_size) : vocab_size_(vocab_size) {}

  // The rows of the output head a draft reads: the first draft_vocabulary() of `lm_head`.
  Weight draft_head(const Weight& lm_head) const;

  // Checks a forward's inputs (hidden_width() values per token, ids in the vocabulary, a history
  // of one allocated Cache) and returns the history's cache.
  template <typename Cache>
  Expected<Cache*> checked_history(ModelState& history, std::span<const float> hidden,
                                   std::span<const TokenId> tokens) const {
    if (Status s = check_inputs(history, hidden, tokens); !s.ok()) return s;
    auto* cache = dynamic_cast<Cache*>(&history.cache(0));
    if (cache == nullptr) return invalid_argument("MTP history cache has the wrong type");
    return cache;
  }

  // The trunk's hidden rows [S, hidden_width()], which the caller holds on the host.
  Tensor upload_hidden(Backend& be, std::span<const float> hidden) const;

  // The end of a head's forward: the backend's status, the head's hidden `x` (the next depth's
  // input) and the logits of `rows` into `out`.
  Status finish(Backend& be, LogitsRows rows, const Tensor& x, Tensor logits, const Tensor& ids,
                ForwardOutput& out) const;

 private:
  Status check_inputs(const ModelState& history, std::span<const float> hidden,
                      std::span<const TokenId> tokens) const;

  std::int64_t vocab_size_;
  std::int64_t draft_vocab_ = 0;  // 0: the whole vocabulary
};

}  // namespace fs
