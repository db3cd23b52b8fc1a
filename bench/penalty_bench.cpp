// The host work a decode step's penalties cost at Qwen 3.8 Flash Next's vocabulary (248,320 ids)
// under a release's repetition penalty (1.05, which reaches every context token) with presence
// and frequency penalties: the entries a step's rows are penalised by, built from the turn's
// counts as generator.cpp did before TurnPenalties (a hash map copied a verify row and walked)
// beside TurnPenalties::append_rows (decode/penalties.h), for one row (autoregressive) and four
// (an MTP verify at depth 3). The context is drawn from a Zipf law over the vocabulary (s = 1.1,
// ranks shuffled), a stand-in for text; the distinct ids it holds are printed. Median of 15
// steps; microseconds a step and the ratio.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "decode/penalties.h"
#include "median_time.h"

namespace {

constexpr fs::TokenId kVocab = 248320;

// Median of 15 calls, in microseconds.
template <typename F>
double median_us(F&& f) {
  return 1e3 * fs::bench_util::median_ms(f, 15);
}

// The form TurnPenalties replaced: a copy of the counts a verify row, the drafts before it added,
// each copy walked through token_penalty.
void entries_from_counts(const fs::TokenCounts& counts, std::span<const fs::TokenId> drafts,
                         std::int64_t rows, const fs::SamplerConfig& c,
                         std::vector<fs::EntryPenalty>& out) {
  std::vector<fs::TokenCounts> row_counts(static_cast<std::size_t>(rows), counts);
  for (std::size_t j = 1; j < row_counts.size(); ++j) {
    row_counts[j] = row_counts[j - 1];
    ++row_counts[j][drafts[j - 1]];
  }
  for (std::size_t r = 0; r < row_counts.size(); ++r)
    for (const auto& [id, n] : row_counts[r]) {
      if (id < 0 || id >= kVocab) continue;
      if (const auto p = fs::token_penalty(static_cast<std::int32_t>(r), id, n, c))
        out.push_back(*p);
    }
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  // Zipf ranks by inversion of the cumulative weights, mapped to shuffled ids.
  std::vector<double> cumulative(static_cast<std::size_t>(kVocab));
  double total = 0;
  for (std::size_t r = 0; r < cumulative.size(); ++r)
    cumulative[r] = total += 1.0 / std::pow(static_cast<double>(r + 1), 1.1);
  std::vector<fs::TokenId> id_of_rank(static_cast<std::size_t>(kVocab));
  std::iota(id_of_rank.begin(), id_of_rank.end(), 0);
  std::shuffle(id_of_rank.begin(), id_of_rank.end(), rng);
  std::uniform_real_distribution<double> u(0.0, total);
  const auto draw = [&] {
    const auto r =
        std::lower_bound(cumulative.begin(), cumulative.end(), u(rng)) - cumulative.begin();
    return id_of_rank[static_cast<std::size_t>(std::min<std::ptrdiff_t>(r, kVocab - 1))];
  };
  fs::SamplerConfig c;
  c.temperature = 0.7;
  c.repetition_penalty = 1.05;
  c.presence_penalty = 0.5;
  c.frequency_penalty = 0.1;
  std::printf("%8s %9s %5s %9s %12s %12s %7s\n", "context", "distinct", "rows", "entries",
              "counts us", "turn us", "ratio");
  for (const std::size_t context : {1024u, 16384u, 65536u}) {
    std::vector<fs::TokenId> tokens(context);
    for (auto& t : tokens) t = draw();
    // The turn and the counts it stands for (sampler.h TokenCounts), a completion under way.
    fs::TurnPenalties turn(c, tokens);
    fs::TokenCounts counts;
    for (const fs::TokenId t : tokens) counts.try_emplace(t, 0);
    for (int i = 0; i < 256; ++i) {
      const fs::TokenId t = draw();
      turn.count(t);
      ++counts[t];
    }
    const std::vector<fs::TokenId> drafts = {draw(), draw(), draw()};
    for (const std::int64_t rows : {1, 4}) {
      std::vector<fs::EntryPenalty> a, b;
      const double before = median_us([&] {
        a.clear();
        entries_from_counts(counts, drafts, rows, c, a);
      });
      const double after = median_us([&] {
        b.clear();
        turn.append_rows(rows, drafts, kVocab, b);
      });
      if (a.size() != b.size()) {
        std::printf("the two forms disagree: %zu against %zu entries\n", a.size(), b.size());
        return 1;
      }
      std::printf("%8zu %9zu %5lld %9zu %12.1f %12.1f %6.1fx\n", context, counts.size(),
                  static_cast<long long>(rows), b.size(), before, after, before / after);
    }
  }
}
