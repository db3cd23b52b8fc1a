// Turning a row of logits into a token: penalties, temperature, top-k / top-p / min-p, and the
// draw. Distributions are computed in double on the host so that the speculative acceptance test
// p(x)/q(x) and the residual max(p - q, 0) are exact up to double rounding.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/entry_penalty.h"
#include "decode/philox.h"
#include "model/types.h"
#include "util/status.h"

namespace fs {

struct SamplerConfig {
  double temperature = 0.0;  // <= 0: greedy
  std::int32_t top_k = 0;    // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  // HF's and vLLM's multiplicative penalty over the prompt and the completion: a seen token's
  // logit divided by it when positive, multiplied when not. 1: off.
  double repetition_penalty = 1.0;

  bool greedy() const { return temperature <= 0.0; }
  // top-k, top-p or min-p: without one every token with mass is kept.
  bool has_prefix_rule() const { return top_k > 0 || top_p < 1.0 || min_p > 0.0; }
  bool has_penalties() const {
    return presence_penalty != 0.0 || frequency_penalty != 0.0 || repetition_penalty != 1.0;
  }
  // Names the first out-of-range parameter.
  Status validate() const;
};

// Occurrences of each token among the completion so far (the prompt is not counted for the
// presence and frequency penalties, as in OpenAI's and vLLM's). With a repetition penalty the
// prompt's tokens are entries too, with count 0 unless the completion has them: the repetition
// penalty applies to every entry, as HF's and vLLM's apply it to the prompt and the completion.
using TokenCounts = std::unordered_map<TokenId, std::int32_t>;

// A distribution over the kept tokens, ids ascending, probabilities summing to 1.
struct TokenDistribution {
  std::vector<TokenId> ids;
  std::vector<double> probs;

  double prob(TokenId id) const;
  bool empty() const { return ids.empty(); }
  static TokenDistribution point(TokenId id) { return {{id}, {1.0}}; }
};

// For each entry j of counts: logit[j] divided by the repetition penalty when positive, multiplied
// by it otherwise (when it is not 1), then less frequency * count[j] + presence * (count[j] > 0),
// in floats (EntryPenalty::apply). A copy; unchanged without penalties.
std::vector<float> apply_penalties(std::span<const float> logits, const TokenCounts& counts,
                                   const SamplerConfig& config);
// logits[e.col] = e.apply(logits[e.col]) for each entry whose column lies in the row (the
// entries' `row` is not read): how apply_penalties and decode/penalties.h apply theirs.
void apply_entries(std::span<float> logits, std::span<const EntryPenalty> entries);
// The penalty apply_penalties gives token `id` of row `row`, an entry seen `count` >= 0 times in
// the completion; rows on a backend take the same entries (Backend::penalise_entries). nullopt
// when it changes nothing (count 0 without a repetition penalty).
std::optional<EntryPenalty> token_penalty(std::int32_t row, TokenId id, std::int32_t count,
                                          const SamplerConfig& config);

// The highest logit; ties go to the lowest token id.
TokenId argmax(std::span<const float> logits);

// softmax(logits / T) restricted to the intersection of the top-k, top-p and min-p sets, each
// computed on the full tempered distribution, renormalised. Candidates are ranked by probability,
// ties by lower id; top-p keeps a token when the mass ranked before it is < top_p. Greedy configs
// give the point mass at argmax. Penalties are not applied here.
TokenDistribution target_distribution(std::span<const float> logits, const SamplerConfig& config);

// The top of a row's ranking, which a device can send instead of the row: the first ids by
// logit (descending, ties to the lower id: Backend::topk's order) with their logits, and the
// row's softmax denominator at the config's temperature over the whole vocabulary,
// total = sum_j exp((l_j - l_max) / T) (Backend::softmax_denominators).
struct RankedTop {
  std::span<const TokenId> ids;
  std::span<const float> logits;
  double total = 0;
  std::size_t vocab = 0;
};
// target_distribution of the whole row, from its top alone: the same kept set with the same
// probabilities (bit for bit when `total` was summed as target_distribution sums it, in id order)
// whenever the prefix rules are decided inside the top (top_k no larger than it, or the top-p
// mass or the min-p floor reached within it). nullopt when they are not, or when no prefix rule
// is set (every token is kept): the caller then needs the whole row. Greedy configs are not for
// this (their point mass needs no total).
std::optional<TokenDistribution> target_distribution_from_top(const RankedTop& top,
                                                              const SamplerConfig& config);

// Inverse CDF over ids ascending with one uniform u in [0, 1).
TokenId sample_with(const TokenDistribution& d, double u);
inline TokenId sample(const TokenDistribution& d, Rng& rng) {
  return sample_with(d, rng.uniform());
}

// normalise(max(p - q, 0)); p itself when that has no mass (p == q).
TokenDistribution residual_distribution(const TokenDistribution& p, const TokenDistribution& q);

}  // namespace fs
