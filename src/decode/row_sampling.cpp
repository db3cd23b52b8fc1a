#include "decode/row_sampling.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace fs {

namespace {

// (A penalty outside the rows is the backend's error: penalise_entries checks each.)
Status check_rows(const Tensor& logits, std::int64_t first, std::int64_t count) {
  if (logits.shape().size() != 2 || first < 0 || count < 1 || first + count > logits.rows())
    return invalid_argument("sampling on the backend: rows [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") are not rows of the logits");
  return {};
}

// What the ops over whole rows (no prefix rule) take: a sampled config without top-k, top-p or
// min-p, rows of the logits, and one `each` (a uniform, an id) a row.
Status check_whole_rows(const SamplerConfig& config, const Tensor& logits, std::int64_t first,
                        std::int64_t count, std::size_t given, const std::string& what,
                        const std::string& each) {
  if (config.greedy() || config.has_prefix_rule())
    return invalid_argument(what + " on the backend take a sampled config with no prefix rule");
  if (auto s = check_rows(logits, first, count); !s.ok()) return s;
  if (static_cast<std::int64_t>(given) != count)
    return invalid_argument(what + " on the backend take one " + each + " a row");
  return {};
}

// Rows [first, first + count) of the logits with the penalties applied to a copy; the logits
// themselves when there is nothing to penalise and no slice to take.
Tensor rows_to_sample(Backend& be, const Tensor& logits, std::int64_t first, std::int64_t count,
                      std::span<const EntryPenalty> penalties) {
  Tensor rows = logits;
  if (first != 0 || count != logits.rows() || !penalties.empty())
    be.slice_rows(logits, first, count, rows);
  if (!penalties.empty()) be.penalise_entries(rows, penalties);
  return rows;
}

Status take_status(Backend& be) {
  Status s = be.status();
  if (s.ok()) return s;
  be.clear_status();
  return s.with_context("sampling on the " + be.name() + " backend");
}

// The first `count` ids of a backend's [rows, 1] i32 tensor, on the host (the op's error, if
// any, named as sampling's).
Expected<std::vector<TokenId>> ids_to_host(Backend& be, const Tensor& ids, std::int64_t count) {
  const Tensor host_ids = ids.to(host_memory());
  if (auto s = take_status(be); !s.ok()) return s;
  const auto* p = host_ids.data_as<std::int32_t>();
  return std::vector<TokenId>(p, p + count);
}

}  // namespace

Expected<std::vector<TokenId>> penalised_argmax_on_backend(
    Backend& be, const Tensor& logits, std::int64_t first, std::int64_t count,
    const SamplerConfig& config, std::span<const EntryPenalty> penalties) {
  if (!config.greedy()) return invalid_argument("greedy picks on the backend take a greedy config");
  if (auto s = check_rows(logits, first, count); !s.ok()) return s;
  const Tensor rows = rows_to_sample(be, logits, first, count, penalties);
  Tensor ids;
  be.argmax_rows(rows, ids);
  return ids_to_host(be, ids, count);
}

Expected<std::vector<TokenId>> draws_on_backend(Backend& be, const Tensor& logits,
                                                std::int64_t first, std::int64_t count,
                                                const SamplerConfig& config,
                                                std::span<const double> u,
                                                std::span<const EntryPenalty> penalties) {
  if (auto s = check_whole_rows(config, logits, first, count, u.size(), "draws", "uniform");
      !s.ok())
    return s;
  const Tensor rows = rows_to_sample(be, logits, first, count, penalties);
  Tensor ids;
  be.sample_rows(rows, config.temperature, u, ids);
  return ids_to_host(be, ids, count);
}

Expected<std::vector<TokenId>> residual_draws_on_backend(Backend& be, const Tensor& logits,
                                                         std::int64_t first, std::int64_t count,
                                                         const Tensor& q,
                                                         const SamplerConfig& config,
                                                         std::span<const double> u,
                                                         std::span<const EntryPenalty> penalties) {
  if (auto s =
          check_whole_rows(config, logits, first, count, u.size(), "residual draws", "uniform");
      !s.ok())
    return s;
  if (q.shape().size() != 2 || q.rows() != count || q.cols() > logits.cols())
    return invalid_argument("residual draws on the backend take a draft row a verify row");
  const Tensor rows = rows_to_sample(be, logits, first, count, penalties);
  Tensor ids;
  be.sample_residual_rows(rows, q, config.temperature, u, ids);
  return ids_to_host(be, ids, count);
}

Expected<std::vector<RowScore>> row_scores_on_backend(Backend& be, const Tensor& logits,
                                                      std::int64_t first, std::int64_t count,
                                                      double temperature,
                                                      std::span<const TokenId> tokens, int top,
                                                      std::span<const EntryPenalty> penalties) {
  if (auto s = check_rows(logits, first, count); !s.ok()) return s;
  const auto cols = logits.cols();
  if (!(temperature > 0) || static_cast<std::int64_t>(tokens.size()) != count ||
      !std::all_of(tokens.begin(), tokens.end(), [&](TokenId t) { return t >= 0 && t < cols; }))
    return invalid_argument(
        "scores on the backend take a temperature > 0 and one token inside its row a row");
  const Tensor rows = rows_to_sample(be, logits, first, count, penalties);
  // The sampler's top (kTopOfRow, the width its device kernels were measured and tested at),
  // of which the first `top` are kept: the same entries in the same order as a top of `top`.
  const auto k = std::min(std::max<std::int64_t>(kTopOfRow, top), cols);
  Tensor idx, val, totals;
  be.topk(rows, k, idx, val);
  be.softmax_denominators(rows, temperature, totals);
  const Tensor host_idx = idx.to(host_memory()), host_val = val.to(host_memory()),
               host_totals = totals.to(host_memory());
  std::vector<RowScore> out(static_cast<std::size_t>(count));
  for (std::int64_t r = 0; r < count; ++r) {
    // The token's logit alone crosses (stream-ordered after the penalties).
    auto& o = out[static_cast<std::size_t>(r)];
    rows.memory()->to_host(&o.token_logit, rows.data() + r * cols + tokens[r], sizeof(float));
  }
  if (auto s = take_status(be); !s.ok()) return s;
  for (std::int64_t r = 0; r < count; ++r) {
    auto& o = out[static_cast<std::size_t>(r)];
    const auto* ids = host_idx.data_as<std::int32_t>() + r * k;
    const float* v = host_val.data() + r * k;
    o.max_logit = static_cast<double>(v[0]);
    o.top_ids.assign(ids, ids + std::min<std::int64_t>(std::max(top, 0), k));
    o.top_logits.assign(v, v + o.top_ids.size());
    o.total = std::bit_cast<double>(host_totals.data_as<std::int64_t>()[r]);
  }
  return out;
}

Expected<std::vector<double>> token_probs_on_backend(Backend& be, const Tensor& logits,
                                                     std::int64_t first, std::int64_t count,
                                                     const SamplerConfig& config,
                                                     std::span<const TokenId> ids,
                                                     std::span<const EntryPenalty> penalties) {
  if (auto s =
          check_whole_rows(config, logits, first, count, ids.size(), "token probabilities", "id");
      !s.ok())
    return s;
  const Tensor rows = rows_to_sample(be, logits, first, count, penalties);
  Tensor probs;
  be.token_probs(rows, config.temperature, ids, probs);
  const Tensor host = probs.to(host_memory());
  if (auto s = take_status(be); !s.ok()) return s;
  std::vector<double> out(static_cast<std::size_t>(count));
  for (std::int64_t r = 0; r < count; ++r)
    out[static_cast<std::size_t>(r)] = std::bit_cast<double>(host.data_as<std::int64_t>()[r]);
  return out;
}

Expected<std::vector<TokenDistribution>> distributions_on_backend(
    Backend& be, const Tensor& logits, std::int64_t first, std::int64_t count,
    const SamplerConfig& config, RowSamplingStats* stats, std::span<const EntryPenalty> penalties) {
  if (config.greedy())
    return invalid_argument("sampling on the backend takes a sampled (not greedy) config");
  if (auto s = check_rows(logits, first, count); !s.ok()) return s;
  const auto vocab = logits.cols();
  const auto k = std::min(kTopOfRow, vocab);
  const Tensor rows = rows_to_sample(be, logits, first, count, penalties);
  if (!config.has_prefix_rule()) {
    // Every token is kept, so no top decides a row: each comes back whole (an MTP verify's and
    // drafts' rows, whose whole distributions the acceptance test reads; a primary is drawn on
    // the backend instead, draws_on_backend).
    const Tensor host = rows.to(host_memory());
    if (auto s = take_status(be); !s.ok()) return s;
    std::vector<TokenDistribution> out;
    out.reserve(static_cast<std::size_t>(count));
    for (std::int64_t r = 0; r < count; ++r) {
      out.push_back(target_distribution(
          std::span<const float>(host.row(r), static_cast<std::size_t>(vocab)), config));
      if (stats != nullptr) ++stats->read_back;
    }
    return out;
  }
  Tensor idx, val, totals;
  be.topk(rows, k, idx, val);
  be.softmax_denominators(rows, config.temperature, totals);
  const Tensor host_idx = idx.to(host_memory()), host_val = val.to(host_memory()),
               host_totals = totals.to(host_memory());
  if (auto s = take_status(be); !s.ok()) return s;

  std::vector<TokenDistribution> out;
  out.reserve(static_cast<std::size_t>(count));
  std::vector<float> row;
  for (std::int64_t r = 0; r < count; ++r) {
    const auto at = static_cast<std::size_t>(r * k);
    const RankedTop top{{host_idx.data_as<std::int32_t>() + at, static_cast<std::size_t>(k)},
                        {host_val.data() + at, static_cast<std::size_t>(k)},
                        std::bit_cast<double>(host_totals.data_as<std::int64_t>()[r]),
                        static_cast<std::size_t>(vocab)};
    if (auto d = target_distribution_from_top(top, config)) {
      out.push_back(std::move(*d));
      if (stats != nullptr) ++stats->from_top;
      continue;
    }
    // The rules reach past the top: this row comes back whole.
    Tensor one;
    be.slice_rows(rows, r, 1, one);
    row = one.to_host_vector();
    if (auto s = take_status(be); !s.ok()) return s;
    out.push_back(target_distribution(row, config));
    if (stats != nullptr) ++stats->read_back;
  }
  return out;
}

}  // namespace fs
