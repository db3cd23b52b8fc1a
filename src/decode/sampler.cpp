#include "decode/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>

namespace fs {

Status SamplerConfig::validate() const {
  if (!std::isfinite(temperature) || temperature < 0 || temperature > 100) {
    return invalid_argument("temperature must be in [0, 100], got " + std::to_string(temperature));
  }
  if (top_k < 0) return invalid_argument("top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1))
    return invalid_argument("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0 && min_p <= 1))
    return invalid_argument("min_p must be in [0, 1], got " + std::to_string(min_p));
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) {
    return invalid_argument("presence_penalty must be in [-2, 2], got " +
                            std::to_string(presence_penalty));
  }
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) {
    return invalid_argument("frequency_penalty must be in [-2, 2], got " +
                            std::to_string(frequency_penalty));
  }
  if (!(repetition_penalty > 0 && repetition_penalty <= 2)) {
    return invalid_argument("repetition_penalty must be in (0, 2], got " +
                            std::to_string(repetition_penalty));
  }
  return {};
}

double TokenDistribution::prob(TokenId id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  return (it != ids.end() && *it == id) ? probs[static_cast<std::size_t>(it - ids.begin())] : 0.0;
}

std::vector<float> apply_penalties(std::span<const float> logits, const TokenCounts& counts,
                                   const SamplerConfig& c) {
  std::vector<float> out(logits.begin(), logits.end());
  if (!c.has_penalties()) return out;
  std::vector<EntryPenalty> entries;
  for (const auto& [id, n] : counts)
    if (const auto p = token_penalty(0, id, n, c)) entries.push_back(*p);
  apply_entries(out, entries);
  return out;
}

void apply_entries(std::span<float> logits, std::span<const EntryPenalty> entries) {
  for (const auto& e : entries) {
    if (e.col < 0 || static_cast<std::size_t>(e.col) >= logits.size()) continue;
    float& v = logits[static_cast<std::size_t>(e.col)];
    v = e.apply(v);
  }
}

std::optional<EntryPenalty> token_penalty(std::int32_t row, TokenId id, std::int32_t count,
                                          const SamplerConfig& c) {
  if (count < 0 || (count == 0 && c.repetition_penalty == 1.0)) return std::nullopt;
  EntryPenalty e;
  e.row = row;
  e.col = id;
  e.repetition = static_cast<float>(c.repetition_penalty);
  if (count > 0) e.amount = static_cast<float>(c.frequency_penalty * count + c.presence_penalty);
  return e;
}

TokenId argmax(std::span<const float> logits) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: the first (lowest id) of equals wins
  }
  return static_cast<TokenId>(best);
}

namespace {

// How many of the ranks the three prefix rules keep, from the probabilities of the first m ranks
// (descending) of a vocabulary of n: the shortest prefix, or `undecided` when a rule walked all m
// ranks without deciding and m < n (its prefix is only known to be >= m).
struct PrefixKeep {
  std::size_t keep = 0;
  bool undecided = false;
};
PrefixKeep prefix_keep(std::span<const double> ranked, std::size_t n, const SamplerConfig& c) {
  const std::size_t m = ranked.size();
  PrefixKeep r{n, false};
  if (c.top_k > 0) r.keep = std::min(r.keep, static_cast<std::size_t>(c.top_k));
  if (c.top_p < 1.0) {
    double before = 0;
    std::size_t k = 0;
    while (k < m && before < c.top_p) before += ranked[k++];
    if (before < c.top_p && m < n) {
      r.undecided = true;
    } else {
      r.keep = std::min(r.keep, std::max<std::size_t>(k, 1));
    }
  }
  if (c.min_p > 0.0) {
    const double floor = c.min_p * ranked[0];
    std::size_t k = 0;
    while (k < m && ranked[k] >= floor) ++k;
    if (k == m && m < n) {
      r.undecided = true;
    } else {
      r.keep = std::min(r.keep, std::max<std::size_t>(k, 1));
    }
  }
  return r;
}

// The kept ranks (ids with their probabilities), renormalised, in id order. Zero-probability tails
// (underflow at tiny temperatures) are dropped, but the top token always stays.
TokenDistribution kept_distribution(std::vector<TokenId> ids, std::vector<double> probs,
                                    std::size_t keep) {
  while (keep > 1 && probs[keep - 1] <= 0.0) --keep;
  std::vector<std::size_t> at(keep);
  std::iota(at.begin(), at.end(), std::size_t{0});
  std::sort(at.begin(), at.end(), [&](std::size_t a, std::size_t b) { return ids[a] < ids[b]; });
  double mass = 0;
  for (const auto i : at) mass += probs[i];
  TokenDistribution d;
  for (const auto i : at) {
    d.ids.push_back(ids[i]);
    d.probs.push_back(probs[i] / mass);
  }
  return d;
}

}  // namespace

TokenDistribution target_distribution(std::span<const float> logits, const SamplerConfig& c) {
  if (c.greedy()) return TokenDistribution::point(argmax(logits));
  const std::size_t n = logits.size();
  double max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
  std::vector<double> p(n);
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / c.temperature);
    total += p[i];
  }
  for (auto& v : p) v /= total;

  TokenDistribution d;
  if (!c.has_prefix_rule()) {
    // No prefix rule: every token with any mass (the top one always has some), in id order.
    double mass = 0;
    for (std::size_t i = 0; i < n; ++i) mass += p[i] > 0.0 ? p[i] : 0.0;
    d.ids.reserve(n);
    d.probs.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (!(p[i] > 0.0)) continue;
      d.ids.push_back(static_cast<TokenId>(i));
      d.probs.push_back(p[i] / mass);
    }
    return d;
  }
  // Rank by probability, ties by lower id, and keep the shortest of the three prefixes. Only the
  // top of the ranking is ever read, so it is found by selection instead of sorting the whole
  // vocabulary (5-9x faster at 248,320 ids: bench/sampler_bench, bench/NOTES.md): the first `m`
  // ranks (nth_element, then a sort of those m) are exactly the first m of the full sort, as the
  // order is total. A prefix rule whose walk reaches m undecided asks for four times as many ranks.
  const auto ranks_before = [&](TokenId a, TokenId b) {
    const double pa = p[static_cast<std::size_t>(a)], pb = p[static_cast<std::size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  };
  std::vector<TokenId> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::size_t m = std::min<std::size_t>(n, c.top_k > 0 ? static_cast<std::size_t>(c.top_k) : 64);
  std::vector<double> ranked;
  PrefixKeep rule;
  for (;;) {
    const auto mid = order.begin() + static_cast<std::ptrdiff_t>(m);
    std::nth_element(order.begin(), mid, order.end(), ranks_before);
    std::sort(order.begin(), mid, ranks_before);
    ranked.resize(m);
    for (std::size_t k = 0; k < m; ++k) ranked[k] = p[static_cast<std::size_t>(order[k])];
    rule = prefix_keep(ranked, n, c);
    // The shortest prefix is known once the decided rules give at most m.
    if (!rule.undecided || rule.keep <= m) break;
    m = std::min(n, m * 4);
  }
  order.resize(rule.keep);
  ranked.resize(rule.keep);
  return kept_distribution(std::move(order), std::move(ranked), rule.keep);
}

std::optional<TokenDistribution> target_distribution_from_top(const RankedTop& top,
                                                              const SamplerConfig& c) {
  const std::size_t m = top.ids.size();
  if (c.greedy() || !c.has_prefix_rule() || m == 0 || top.logits.size() != m || top.vocab < m ||
      !(top.total > 0) || !std::isfinite(top.total))
    return std::nullopt;
  // The same probabilities target_distribution computes: the top logit is the row's maximum.
  const double max_logit = static_cast<double>(top.logits[0]);
  std::vector<double> ranked(m);
  for (std::size_t k = 0; k < m; ++k)
    ranked[k] =
        std::exp((static_cast<double>(top.logits[k]) - max_logit) / c.temperature) / top.total;
  PrefixKeep rule = prefix_keep(ranked, top.vocab, c);
  // Past a rank whose probability underflowed to 0 every rank has 0, which target_distribution
  // drops as a zero tail: the kept set ends inside the top whatever the rules say beyond it.
  if (ranked[m - 1] <= 0.0) rule = {std::min(rule.keep, m), false};
  // A rule undecided at the top's end, or top_k larger than the top: the row is needed.
  if (rule.keep > m) return std::nullopt;
  ranked.resize(rule.keep);
  return kept_distribution(
      std::vector<TokenId>(top.ids.begin(),
                           top.ids.begin() + static_cast<std::ptrdiff_t>(rule.keep)),
      std::move(ranked), rule.keep);
}

TokenId sample_with(const TokenDistribution& d, double u) {
  double total = 0;
  for (double v : d.probs) total += v;
  const double target = u * total;
  double cum = 0;
  for (std::size_t i = 0; i < d.ids.size(); ++i) {
    cum += d.probs[i];
    if (target < cum) return d.ids[i];
  }
  // u*total rounded up to the full mass: the last token with any mass.
  for (std::size_t i = d.ids.size(); i-- > 0;) {
    if (d.probs[i] > 0) return d.ids[i];
  }
  return d.ids.empty() ? 0 : d.ids.back();
}

TokenDistribution residual_distribution(const TokenDistribution& p, const TokenDistribution& q) {
  TokenDistribution r;
  double mass = 0;
  // Both distributions' ids ascend, so q's probability of each of p's ids comes from one walk
  // along q (q.prob's value, without a search an id: a whole vocabulary's rows are 248,320 ids).
  std::size_t j = 0;
  for (std::size_t i = 0; i < p.ids.size(); ++i) {
    while (j < q.ids.size() && q.ids[j] < p.ids[i]) ++j;
    const double qv = j < q.ids.size() && q.ids[j] == p.ids[i] ? q.probs[j] : 0.0;
    const double v = p.probs[i] - qv;
    if (v > 0) {
      r.ids.push_back(p.ids[i]);
      r.probs.push_back(v);
      mass += v;
    }
  }
  if (!(mass > 0) || !std::isfinite(mass)) return p;
  for (auto& v : r.probs) v /= mass;
  return r;
}

}  // namespace fs
