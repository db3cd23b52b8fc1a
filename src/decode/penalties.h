// The sampler's penalties over one turn, kept as the entries they give a logits row.
//
// A turn's penalties are a function of the counts (sampler.h TokenCounts): every token of the
// completion, and with a repetition penalty every token of the context too. Walking a hash map of
// the counts for every row a step samples costs host time in proportion to the distinct tokens
// of the context: with a release's repetition penalty (Qwen's generation_config.json has 1.05)
// at a 64k-token context that is tens of thousands of entries, and an MTP verify of depth 3
// samples four rows, each with its own counts. Here the entries live in a vector updated one
// emitted token at a time (the changed entry only), so a row's entries cost a copy, and a verify
// row's drafts before it patch a few of them (bench/penalty_bench.cpp measures both forms).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "decode/sampler.h"

namespace fs {

class TurnPenalties {
 public:
  // `context`: the tokens before the turn (entries only under a repetition penalty).
  TurnPenalties(const SamplerConfig& config, std::span<const TokenId> context);

  bool active() const { return config_.has_penalties(); }
  // One emitted token.
  void count(TokenId t);

  // Appends the entries of `rows` logits rows of `cols` columns, row r (0-based) penalised by the
  // counts and the tokens before[0, r): a verify's rows, sampled before its drafts are accepted
  // (rows - 1 <= before.size()). Equal, as a set a row, to token_penalty over each row's counts,
  // ids outside [0, cols) left out (apply_penalties' rule). Nothing when not active().
  void append_rows(std::int64_t rows, std::span<const TokenId> before, std::int64_t cols,
                   std::vector<EntryPenalty>& out) const;

  // apply_penalties(logits, the turn's counts): a penalised copy of one row.
  std::vector<float> apply(std::span<const float> logits) const;

 private:
  // Row `row`'s entries: the counts and the tokens `before`.
  void append_row(std::int32_t row, std::span<const TokenId> before, std::int64_t cols,
                  std::vector<EntryPenalty>& out) const;

  // The entry of counted id t (count n) is token_penalty(0, t, n). Only an active turn counts,
  // and then every counted id >= 0 has an entry (a completion count > 0 always does; a count 0
  // is a context token, kept under a repetition penalty only), so the entries hold the counts.
  SamplerConfig config_;
  std::vector<EntryPenalty> entries_;               // in order of first count
  std::vector<std::int32_t> counts_;                // counts_[i]: the count of entries_[i]'s id
  std::unordered_map<TokenId, std::size_t> index_;  // id -> its position in entries_
  TokenId max_id_ = -1;                             // the largest id in entries_
};

}  // namespace fs
