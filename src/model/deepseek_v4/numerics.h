// The official DeepSeek V4 graph's numerics (arch-dsv4.md 7, ds4.c 1590-1727), which
// `--numerics official` adds to HF's arithmetic (model/numerics.h):
//  - KV FP8: the raw KV rows (after RoPE) and the compressed main rows (after kv_norm and RoPE),
//    dims [0, head_dim - rope_dim) (the non-RoPE dims: 448 in Flash) in 64-wide E4M3 blocks; the
//    RoPE dims untouched. The MTP block's sliding rows too (it is a decoder layer).
//  - Indexer: a Walsh-Hadamard rotation of each index head (128-wide in Flash), then FP4 E2M1 in
//    32-wide blocks, on the indexer's query heads (after RoPE) and its compressed rows (after
//    kv_norm and RoPE).
// Widths smaller than a block (the hf-tiny fixture: head_dim 32, rope 8, index_head_dim 16): a
// block is cut at the end of its span, so the 24 non-RoPE dims are one FP8 block of 24 and an
// FP4 block is at most the Hadamard group. The Hadamard group is min(128, index_head_dim),
// which must be a power of two dividing index_head_dim (the whole head when it is smaller than
// 128; 128-wide groups of a wider head); a config where it is not is refused at load.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "model/deepseek_v4/config.h"
#include "util/status.h"

namespace fs {

inline constexpr std::int64_t kDsKvFp8Block = 64;
inline constexpr std::int64_t kDsIndexerHadamardBlock = 128;
inline constexpr std::int64_t kDsIndexerFp4Block = 32;

// The Hadamard group of the indexer heads: min(128, index_head_dim).
std::int64_t ds_indexer_hadamard_block(const DeepseekV4Config& c);
// Whether the official numerics apply to this config: an error naming the width that does not
// fit (the indexer's Hadamard group, the non-RoPE span).
Status check_official_numerics(const DeepseekV4Config& c);

// In place on rows [n, head_dim] (raw or compressed KV): FP8 on the non-RoPE dims.
void simulate_kv_fp8(Backend& be, const DeepseekV4Config& c, Tensor& rows);
// In place on rows [n, k * index_head_dim] (indexer queries or compressed rows): Hadamard + FP4.
void simulate_indexer_fp4(Backend& be, const DeepseekV4Config& c, Tensor& rows);

}  // namespace fs
