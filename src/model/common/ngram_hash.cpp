#include "model/common/ngram_hash.h"

#include <algorithm>
#include <cassert>

namespace fs {
namespace {
constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;
constexpr std::uint64_t kM1 = 0xBF58476D1CE4E5B9ull;
constexpr std::uint64_t kM2 = 0x94D049BB133111EBull;
constexpr std::uint64_t kLayerPrime = 10007;
}  // namespace

std::uint64_t splitmix64(std::uint64_t v) {
  v += kGamma;
  v = (v ^ (v >> 30)) * kM1;
  v = (v ^ (v >> 27)) * kM2;
  return v ^ (v >> 31);
}

std::vector<std::int64_t> ngram_layer_multipliers(std::int64_t vocab_size, std::int64_t ngram_size,
                                                  std::int64_t ple_index, std::int64_t seed) {
  // Multipliers stay below (2^63-1)/vocab so that id * multiplier never overflows int64.
  const std::uint64_t mmax = static_cast<std::uint64_t>(INT64_MAX) /
                             static_cast<std::uint64_t>(std::max<std::int64_t>(vocab_size, 1));
  const std::uint64_t half = std::max<std::uint64_t>(1, mmax / 2);
  const std::uint64_t base =
      static_cast<std::uint64_t>(seed) + kLayerPrime * static_cast<std::uint64_t>(ple_index);
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < ngram_size; ++i) {
    const std::uint64_t v = base + kGamma * static_cast<std::uint64_t>(i + 1);
    out.push_back(static_cast<std::int64_t>(2 * (splitmix64(v) % half) + 1));
  }
  return out;
}

void ngram_ids(const NgramHashTable& t, std::vector<std::int64_t>& context,
               std::span<const TokenId> tokens, std::vector<std::int64_t>& ids) {
  const auto N = t.ngram_size, ctx = t.context_length(), NH = t.heads();
  assert(static_cast<std::int64_t>(context.size()) == ctx);
  std::vector<std::int64_t> hist(context);
  hist.insert(hist.end(), tokens.begin(), tokens.end());
  ids.assign(tokens.size() * static_cast<std::size_t>(NH), 0);
  std::vector<std::int64_t> shifted(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto p = static_cast<std::int64_t>(i) + ctx;
    // shift_s(p) = hist[p-s] unless an eos lies in hist[p-s .. p-1] (Q4M 1115-1129): tokens after
    // an eos do not see across it; an eos itself still sees its predecessors.
    bool blocked = false;
    for (std::int64_t s = 0; s < N; ++s) {
      if (s > 0 && hist[static_cast<std::size_t>(p - s)] == t.eos) blocked = true;
      shifted[static_cast<std::size_t>(s)] =
          blocked ? t.eos : hist[static_cast<std::size_t>(p - s)];
    }
    for (std::int64_t n = 2; n <= N; ++n) {
      // Wrapping 64-bit products and XOR, as torch's int64 arithmetic.
      std::uint64_t mix = 0;
      for (std::int64_t s = 0; s < n; ++s)
        mix ^= static_cast<std::uint64_t>(shifted[static_cast<std::size_t>(s)]) *
               static_cast<std::uint64_t>(t.multipliers[static_cast<std::size_t>(s)]);
      const auto smix = static_cast<std::int64_t>(mix);
      for (std::int64_t j = 0; j < t.heads_per_ngram; ++j) {
        const auto head = (n - 2) * t.heads_per_ngram + j;
        const auto size = t.head_sizes[static_cast<std::size_t>(head)];
        auto r = smix % size;  // torch.remainder: non-negative
        if (r < 0) r += size;
        ids[i * static_cast<std::size_t>(NH) + static_cast<std::size_t>(head)] =
            r + t.head_offsets[static_cast<std::size_t>(head)];
      }
    }
  }
  context.assign(hist.end() - ctx, hist.end());
}

}  // namespace fs
