#include "decode/row_sampling.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace fs {

Expected<std::vector<TokenDistribution>> distributions_on_backend(Backend& be, const Tensor& logits,
                                                                  std::int64_t first,
                                                                  std::int64_t count,
                                                                  const SamplerConfig& config,
                                                                  RowSamplingStats* stats) {
  if (config.greedy() || config.has_penalties())
    return invalid_argument("sampling on the backend takes a sampled config without penalties");
  if (logits.shape().size() != 2 || first < 0 || count < 1 || first + count > logits.rows())
    return invalid_argument("sampling on the backend: rows [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") are not rows of the logits");
  const auto vocab = logits.cols();
  const auto k = std::min(kTopOfRow, vocab);
  Tensor rows = logits, idx, val, totals;
  if (first != 0 || count != logits.rows()) be.slice_rows(logits, first, count, rows);
  be.topk(rows, k, idx, val);
  be.softmax_denominators(rows, config.temperature, totals);
  const Tensor host_idx = idx.to(host_memory()), host_val = val.to(host_memory()),
               host_totals = totals.to(host_memory());
  if (Status s = be.status(); !s.ok()) {
    be.clear_status();
    return s.with_context("sampling on the " + be.name() + " backend");
  }

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
    if (Status s = be.status(); !s.ok()) {
      be.clear_status();
      return s.with_context("sampling on the " + be.name() + " backend");
    }
    out.push_back(target_distribution(row, config));
    if (stats != nullptr) ++stats->read_back;
  }
  return out;
}

}  // namespace fs
