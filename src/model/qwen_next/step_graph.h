// What a step graph's key needs from a Qwen QSA cache (docs/GPU.md "Step 3"): the buffers a
// recorded kernel points at, the room a step appends into, and the indexer's block branch, which
// changes the step's ops. The trunk's forward uses it; the MTP head's graphs (branch
// experiments/mtp-head-graphs, docs/GPU.md "Step 10") share it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/qwen_next/state.h"

namespace fs {

// Appends a tensor's device address and capacity to a key: two states, or a regrown cache, are
// other buffers and so another key.
inline void add_buffer_identity(const Tensor& t, std::vector<std::int64_t>& words) {
  words.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(t.raw())));
  words.push_back(static_cast<std::int64_t>(t.capacity_bytes()));
}

inline void add_buffer_identity(const QsaCache& c, std::vector<std::int64_t>& words) {
  add_buffer_identity(c.keys, words);
  add_buffer_identity(c.values, words);
  add_buffer_identity(c.index_keys, words);
  add_buffer_identity(c.blocks, words);
}

// Room for S more rows in every appendable tensor of the cache, so nothing is reallocated inside
// a step graph (capacity grows geometrically: a regrowth, and so a new recording, is rare).
inline bool reserve_step(QsaCache& c, std::int64_t S) {
  const auto rows = c.index_keys.rows() + S;
  return c.keys.reserve_rows(c.keys.rows() + S) && c.values.reserve_rows(c.values.rows() + S) &&
         c.index_keys.reserve_rows(rows) && c.blocks.reserve_rows(rows / c.block);
}

// How many indexer blocks a step of S tokens completes: the indexer's block branch (block_mean,
// norm, RoPE, append) runs only then, so steps at 0-2 mod 4 share one graph and the completing
// step has another.
inline std::int64_t blocks_completed(const QsaCache& c, std::int64_t S) {
  return (c.index_keys.rows() + S) / c.block - c.blocks.rows();
}

}  // namespace fs
