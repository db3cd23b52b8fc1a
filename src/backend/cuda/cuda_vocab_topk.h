// Top-k of vocabulary-wide rows on the whole GPU (cuda_vocab_topk.cu): the grid narrows each row
// to a few thousand candidates, in index order, and the radix select (cuda_select.h) finishes on
// them. The same picks, order and values as the radix select over the whole row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fs::cuda {

// Whether the narrowing takes `rows` rows of `cols` entries and this k: 1-8 rows wider than the
// radix select's registers (32,768 entries) and at most 262,144 wide, k <= 1,024 and at most a
// 64th of the row (its slices of 256 offer 8 keys each, at least 2k in all).
bool vocab_topk_fits(std::int64_t rows, std::int64_t cols, std::int64_t k);

// The scratch it needs, in elements of each buffer below.
struct VocabTopkScratch {
  std::int64_t offers, thresholds, list, counts, candidates;
};
VocabTopkScratch vocab_topk_scratch(std::int64_t rows, std::int64_t cols);

// Device buffers of at least vocab_topk_scratch's sizes (list_* and cand_* of `list` and
// `candidates` elements each), and one int64 for the candidates' row width.
struct VocabTopkBuffers {
  std::uint32_t* offers = nullptr;
  std::uint32_t* thresholds = nullptr;
  float* list_val = nullptr;
  std::int32_t* list_idx = nullptr;
  std::int32_t* counts = nullptr;
  float* cand_val = nullptr;
  std::int32_t* cand_idx = nullptr;
  std::int64_t* width = nullptr;
};

// idx [rows, k] and val [rows, k] (val may be null) as launch_radix_topk gives them for x
// [rows, cols] with block 0. Queued on `stream`; requires vocab_topk_fits(rows, cols, k).
void launch_vocab_topk(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t k,
                       const VocabTopkBuffers& buffers, std::int32_t* idx, float* val,
                       cudaStream_t stream);

}  // namespace fs::cuda
