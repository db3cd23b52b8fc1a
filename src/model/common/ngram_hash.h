// Hashed n-gram ids of PLE (Qwen 3.8 Flash Next, arch-qwen.md section 2.7, Q4M 1036-1174): per
// token, for orders 2..N, a multiplicative-XOR hash of the token and its predecessors within
// the current eos-delimited segment, reduced modulo one prime per head.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/types.h"

namespace fs {

struct NgramHashTable {
  std::int64_t ngram_size = 3;             // N: orders 2..N are used
  std::int64_t heads_per_ngram = 0;        // heads per order
  std::int64_t eos = 0;                    // segment boundary and the padding of a fresh context
  std::vector<std::int64_t> multipliers;   // [N], odd
  std::vector<std::int64_t> head_sizes;    // [NH] primes
  std::vector<std::int64_t> head_offsets;  // [NH] running sums of head_sizes

  std::int64_t heads() const { return (ngram_size - 1) * heads_per_ngram; }
  std::int64_t context_length() const { return ngram_size - 1; }
};

// splitmix64 (Steele et al.), all arithmetic mod 2^64 (Q4M 1041-1045).
std::uint64_t splitmix64(std::uint64_t v);
// The N hash multipliers of the `ple_index`-th PLE layer (Q4M 1048-1057).
std::vector<std::int64_t> ngram_layer_multipliers(std::int64_t vocab_size, std::int64_t ngram_size,
                                                  std::int64_t ple_index, std::int64_t seed);

// Ids (offsets included, rows of the concatenated table) of `tokens`, [tokens.size() x NH],
// order-2 heads first. `context` holds the N-1 ids before the call (all eos on a fresh sequence)
// and is advanced to the last N-1 ids of context ++ tokens.
void ngram_ids(const NgramHashTable& table, std::vector<std::int64_t>& context,
               std::span<const TokenId> tokens, std::vector<std::int64_t>& ids);

}  // namespace fs
