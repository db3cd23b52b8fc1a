// Sampling from logits rows that stay on the backend (issue 14: a 248,320-float row per token
// need not cross to the host). The backend ranks each row's top kTopOfRow entries and sums its
// softmax denominator at the request's temperature; only those (~8 KB a row) come back, and the
// host builds each row's target distribution from them (sampler.h target_distribution_from_top:
// the same kept set with the same probabilities, bit for bit on the CPU backend, which sums in
// the host sampler's order; to the rounding of a double sum on a GPU). A row whose rules are not
// decided inside its top (no top-k/top-p/min-p, or a row flatter than the top) is read back and
// sampled on the host as before: the same distribution either way, one more copy.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "decode/sampler.h"

namespace fs {

// Wide enough for the samplers agents send (top_k <= 1024, or top_p reached inside it); small
// enough that the copy back is negligible next to a decode step.
inline constexpr std::int64_t kTopOfRow = 1024;

// How many rows needed the whole row read back, for the stats.
struct RowSamplingStats {
  std::int64_t from_top = 0;
  std::int64_t read_back = 0;
};

// The target distributions of rows [first, first + count) of `logits` ([rows, vocab] in `be`'s
// memory) under a sampled (not greedy) config: target_distribution of each row, which takes no
// penalties, or, where `penalties` are given, target_distribution of the rows with them applied
// (their `row` counted from `first`; TurnPenalties::append_rows makes them): they are applied to a
// copy of the rows on the backend (Backend::penalise_entries), so a penalised row still sends
// only its top. The logits themselves are not changed.
Expected<std::vector<TokenDistribution>> distributions_on_backend(
    Backend& be, const Tensor& logits, std::int64_t first, std::int64_t count,
    const SamplerConfig& config, RowSamplingStats* stats = nullptr,
    std::span<const EntryPenalty> penalties = {});

// Draws from rows [first, first + count) of `logits` under a sampled config with no prefix rule
// (target_distribution keeps every token with mass, so the top cannot decide it), one uniform of
// `u` a row, on the backend (Backend::sample_rows, on a penalised copy as above): only the ids
// come back. sample_with(target_distribution(row, config), u[r]) of each penalised row, bit for
// bit on the CPU backend.
Expected<std::vector<TokenId>> draws_on_backend(Backend& be, const Tensor& logits,
                                                std::int64_t first, std::int64_t count,
                                                const SamplerConfig& config,
                                                std::span<const double> u,
                                                std::span<const EntryPenalty> penalties);

// The probability target_distribution(row, config) gives ids[r] in each of rows [first, first +
// count) of `logits` (penalised as above), under a sampled config with no prefix rule: what an
// MTP draft's acceptance test reads of its verify row (Backend::token_probs), only the doubles
// coming back. Bit for bit the host's on the CPU backend.
Expected<std::vector<double>> token_probs_on_backend(Backend& be, const Tensor& logits,
                                                     std::int64_t first, std::int64_t count,
                                                     const SamplerConfig& config,
                                                     std::span<const TokenId> ids,
                                                     std::span<const EntryPenalty> penalties);

// Draws the corrections of rejected MTP drafts on the backend, one uniform of `u` a row: row
// `first + r` of `logits` (penalised as above) against row r of `q` (the draft's own logits, left
// on the backend by the drafter), under a sampled config with no prefix rule:
// sample_with(residual_distribution(target_distribution(p), target_distribution(q)), u[r])
// (Backend::sample_residual_rows), bit for bit on the CPU backend. Only the ids come back.
Expected<std::vector<TokenId>> residual_draws_on_backend(Backend& be, const Tensor& logits,
                                                         std::int64_t first, std::int64_t count,
                                                         const Tensor& q,
                                                         const SamplerConfig& config,
                                                         std::span<const double> u,
                                                         std::span<const EntryPenalty> penalties);

// What an emitted token's log-probabilities (decode/generator.h TokenLogprobs) read of its row:
// the row's largest logit, its `top` largest logits with their ids (ranked by logit, ties to the
// lower id), its softmax denominator sum_j exp((l_j - max) / temperature) and the token's logit.
struct RowScore {
  double max_logit = 0;
  std::vector<TokenId> top_ids;
  std::vector<float> top_logits;
  double total = 0;
  float token_logit = 0;
};
// The RowScore of each of rows [first, first + count) of `logits` (penalised as above) for
// tokens[r], from the backend: Backend::topk (the sampler's kTopOfRow, of which `top` are kept),
// softmax_denominators and the token's one float; the row itself stays there. The CPU backend
// gives the host's values bit for bit.
Expected<std::vector<RowScore>> row_scores_on_backend(Backend& be, const Tensor& logits,
                                                      std::int64_t first, std::int64_t count,
                                                      double temperature,
                                                      std::span<const TokenId> tokens, int top,
                                                      std::span<const EntryPenalty> penalties);

// The greedy picks of rows [first, first + count) with `penalties` applied (as above), only the
// ids coming back (Backend::argmax_rows on a penalised copy).
Expected<std::vector<TokenId>> penalised_argmax_on_backend(Backend& be, const Tensor& logits,
                                                           std::int64_t first, std::int64_t count,
                                                           const SamplerConfig& config,
                                                           std::span<const EntryPenalty> penalties);

}  // namespace fs
