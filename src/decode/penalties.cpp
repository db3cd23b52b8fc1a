#include "decode/penalties.h"

#include <algorithm>

namespace fs {

TurnPenalties::TurnPenalties(const SamplerConfig& config, std::span<const TokenId> context)
    : config_(config) {
  // The repetition penalty reaches the context before this turn too (sampler.h TokenCounts).
  if (!active() || config_.repetition_penalty == 1.0) return;
  for (const TokenId t : context) {
    if (t < 0 || !index_.try_emplace(t, entries_.size()).second) continue;
    entries_.push_back(*token_penalty(0, t, 0, config_));  // a repetition penalty: an entry
    counts_.push_back(0);
    max_id_ = std::max(max_id_, t);
  }
}

void TurnPenalties::count(TokenId t) {
  if (!active() || t < 0) return;
  const auto [at, inserted] = index_.try_emplace(t, entries_.size());
  if (inserted) {
    entries_.emplace_back();
    counts_.push_back(0);
    max_id_ = std::max(max_id_, t);
  }
  entries_[at->second] = *token_penalty(0, t, ++counts_[at->second], config_);  // count > 0
}

void TurnPenalties::append_rows(std::int64_t rows, std::span<const TokenId> before,
                                std::int64_t cols, std::vector<EntryPenalty>& out) const {
  if (!active()) return;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto n = std::min(static_cast<std::size_t>(r), before.size());
    append_row(static_cast<std::int32_t>(r), before.first(n), cols, out);
  }
}

void TurnPenalties::append_row(std::int32_t row, std::span<const TokenId> before, std::int64_t cols,
                               std::vector<EntryPenalty>& out) const {
  const std::size_t start = out.size();
  // Every entry lies inside the row unless the row is narrower than an id counted (a context
  // token past the logits' width): then the row takes those that fit.
  const bool all_inside = max_id_ < cols;
  if (all_inside) {
    out.insert(out.end(), entries_.begin(), entries_.end());
    for (std::size_t i = start; i < out.size(); ++i) out[i].row = row;
  } else {
    for (const auto& e : entries_) {
      if (e.col >= cols) continue;
      out.push_back(e);
      out.back().row = row;
    }
  }
  // A draft before this row counts once more for each time it occurs there.
  for (std::size_t i = 0; i < before.size(); ++i) {
    const TokenId x = before[i];
    if (x < 0 || x >= cols) continue;
    const auto first = before.begin() + static_cast<std::ptrdiff_t>(i);
    if (std::find(before.begin(), first, x) != first) continue;  // done at its first occurrence
    const auto at = index_.find(x);
    const auto n = static_cast<std::int32_t>((at == index_.end() ? 0 : counts_[at->second]) +
                                             std::count(first, before.end(), x));
    const auto p = token_penalty(row, x, n, config_);  // n > 0: always an entry
    if (at == index_.end()) {
      out.push_back(*p);
    } else if (all_inside) {
      out[start + at->second] = *p;
    } else {
      *std::find_if(out.begin() + static_cast<std::ptrdiff_t>(start), out.end(),
                    [x](const EntryPenalty& e) { return e.col == x; }) = *p;
    }
  }
}

std::vector<float> TurnPenalties::apply(std::span<const float> logits) const {
  std::vector<float> out(logits.begin(), logits.end());
  apply_entries(out, entries_);
  return out;
}

}  // namespace fs
