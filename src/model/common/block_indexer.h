// The pooled-block token selector of QSA sparse attention (Q4M 693-779): keys are grouped in
// blocks of `block` consecutive tokens; each query keeps the `top_blocks` best complete blocks it
// can see (by its block scores) plus the unfinished tail of visible tokens after the last
// complete block. With top_blocks >= complete blocks this is dense causal attention.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "model/types.h"

namespace fs {

// q_positions[s] is the position of query s; it sees keys 0..q_positions[s]. scores [S, B]
// holds the query's score for every cached block (only the first (pos+1)/block are visible).
void select_block_tokens(Backend& be, const Tensor& scores, std::span<const Position> q_positions,
                         std::int64_t block, std::int64_t top_blocks, KeySelection& sel);

}  // namespace fs
