#include "decode/penalties.h"

#include <algorithm>

namespace fs {

TurnPenalties::TurnPenalties(const SamplerConfig& config, std::span<const TokenId> context)
    : config_(config) {
  // The repetition penalty reaches the context before this turn too (sampler.h TokenCounts).
  if (!active() || config_.repetition_penalty == 1.0) return;
  for (const TokenId t : context) {
    if (!counts_.try_emplace(t, 0).second || t < 0) continue;
    const auto p = token_penalty(0, t, 0, config_);
    if (!p) continue;
    index_.emplace(t, entries_.size());
    entries_.push_back(*p);
    max_id_ = std::max(max_id_, t);
  }
}

void TurnPenalties::count(TokenId t) {
  const std::int32_t n = ++counts_[t];
  if (!active() || t < 0) return;
  const auto p = token_penalty(0, t, n, config_);
  if (!p) return;
  const auto [at, inserted] = index_.try_emplace(t, entries_.size());
  if (!inserted) {
    entries_[at->second] = *p;
    return;
  }
  entries_.push_back(*p);
  max_id_ = std::max(max_id_, t);
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
    const auto counted = counts_.find(x);
    const auto n = static_cast<std::int32_t>((counted == counts_.end() ? 0 : counted->second) +
                                             std::count(first, before.end(), x));
    const auto p = token_penalty(row, x, n, config_);  // n > 0: always an entry
    const auto at = index_.find(x);
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
  if (!active()) return out;
  for (const auto& e : entries_) {
    if (static_cast<std::size_t>(e.col) >= out.size()) continue;
    float& v = out[static_cast<std::size_t>(e.col)];
    v = e.apply(v);
  }
  return out;
}

}  // namespace fs
