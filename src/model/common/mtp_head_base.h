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
  // Checks the host rows' count, copies them to the backend and runs forward_rows, where each
  // family's head keeps its math.
  Status forward(ModelState& history, std::span<const float> hidden,
                 std::span<const TokenId> tokens, LogitsRows rows, ForwardOutput& out) final;
  // The rows concatenated in the backend's memory (upload of `before`, a slice of `rows`).
  Status absorb_rows(ModelState& history, std::span<const float> before, const Tensor& rows,
                     std::span<const TokenId> tokens) final;
  Status set_draft_vocabulary(std::int64_t n) final;
  std::int64_t draft_vocabulary() const final;

 protected:
  explicit MtpHeadBase(std::int64_t vocab_size) : vocab_size_(vocab_size) {}

  // The rows of the output head a draft reads: the first draft_vocabulary() of `lm_head`.
  Weight draft_head(const Weight& lm_head) const;

  // The backend the head computes on (its model's).
  virtual Backend& head_backend() const = 0;

  // Checks a forward's inputs (f32 rows [S, hidden_width()] in the backend's memory, ids in the
  // vocabulary, a history of one allocated Cache) and returns the history's cache.
  template <typename Cache>
  Expected<Cache*> checked_history(ModelState& history, const Tensor& hidden,
                                   std::span<const TokenId> tokens) const {
    if (Status s = check_inputs(history, hidden, tokens); !s.ok()) return s;
    auto* cache = dynamic_cast<Cache*>(&history.cache(0));
    if (cache == nullptr) return invalid_argument("MTP history cache has the wrong type");
    return cache;
  }

  // The end of a head's forward: the backend's status, the head's hidden `x` (the next depth's
  // input) and the logits of `rows` into `out`.
  Status finish(Backend& be, LogitsRows rows, const Tensor& x, Tensor logits, const Tensor& ids,
                ForwardOutput& out) const;

 private:
  Status check_inputs(const ModelState& history, const Tensor& hidden,
                      std::span<const TokenId> tokens) const;

  std::int64_t vocab_size_;
  std::int64_t draft_vocab_ = 0;  // 0: the whole vocabulary
};

}  // namespace fs
