// A multi-token-prediction head: given the trunk's hidden state h_{t-1} and the embedding of token
// x_t it predicts x_{t+1}, and returns its own hidden state so it can be applied again (depth 2,
// 3) on its own output. Its cache, the MTP history, holds one row per committed token t >= 1:
// row t = head(h_{t-1}, x_t).
#pragma once

#include <memory>
#include <span>

#include "model/model.h"

namespace fs {

class MtpHead {
 public:
  virtual ~MtpHead() = default;
  // A history that covers no rows.
  virtual std::unique_ptr<ModelState> new_history() const = 0;
  // Width of the hidden rows the head consumes and returns (the trunk's ForwardOutput.hidden).
  virtual std::int64_t hidden_width() const = 0;
  // Appends one row per i, (hidden[i], tokens[i]), to `history`, and returns logits (of `rows`)
  // and the head's output hidden for every row.
  virtual Status forward(ModelState& history, std::span<const float> hidden,
                         std::span<const TokenId> tokens, LogitsRows rows, ForwardOutput& out) = 0;
  // The same with the hidden rows in the model's backend memory ([S, hidden_width()] f32, a
  // trunk's ForwardOutput::device_hidden): a prefill's rows then never cross to the host. The
  // default body reads them back and calls forward. For kNone (rows appended to the history, no
  // logits) `out` holds no hidden rows either.
  virtual Status forward_rows(ModelState& history, const Tensor& hidden,
                              std::span<const TokenId> tokens, LogitsRows rows,
                              ForwardOutput& out) {
    const std::vector<float> h =
        hidden.numel() > 0 ? hidden.to_host_vector() : std::vector<float>{};
    return forward(history, h, tokens, rows, out);
  }
  // Appends the history rows of a trunk call that absorbed `tokens` with hidden rows `rows`
  // [n, hidden_width()] in the backend's memory: row i pairs tokens[i] with the hidden of the
  // position before it, which is `before` (the previous call's last row, on the host) for i = 0
  // and rows[i - 1] after; with `before` empty (the sequence's first token) tokens[0] has no row.
  // The default body builds the rows on the host and calls forward.
  virtual Status absorb_rows(ModelState& history, std::span<const float> before, const Tensor& rows,
                             std::span<const TokenId> tokens) {
    const std::size_t n = tokens.size(), skip = before.empty() ? 1 : 0;
    if (n <= skip) return {};
    const std::vector<float> all = rows.to_host_vector();
    const auto prior = static_cast<std::size_t>(hidden_width()) * (n - 1);
    if (all.size() < prior) return invalid_argument("MTP head: fewer hidden rows than tokens");
    std::vector<float> pairs(before.begin(), before.end());
    pairs.insert(pairs.end(), all.begin(), all.begin() + static_cast<std::ptrdiff_t>(prior));
    ForwardOutput ignored;
    return forward(history, pairs, tokens.subspan(skip), LogitsRows::kNone, ignored);
  }

  // Restricts the head's logits to token ids [0, n) (0: the whole vocabulary), so a draft reads
  // an n-row output head instead of the full one (1.27 GB per draft at Qwen 3.8 Flash Next's
  // 248,320 x 2,560 in bf16). Decoding stays exact at any temperature: the verify accepts against
  // the trunk's full distribution and the draft distribution is zero past n; only acceptance
  // changes (a token past n is never drafted). Byte-level BPE vocabularies number tokens in merge
  // order, so the first ids are the common ones; special tokens come last.
  virtual Status set_draft_vocabulary(std::int64_t n) = 0;
  // The range set (the whole vocabulary by default).
  virtual std::int64_t draft_vocabulary() const = 0;
};

}  // namespace fs
