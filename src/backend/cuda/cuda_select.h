// Top-k of long rows by a radix select (cuda_select.cu): the kernel behind topk and
// select_blocks for the QSA indexer's rows of up to ~64k block scores and k up to a few thousand.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_graph.h"

namespace fs::cuda {

// The largest k the radix select takes (its survivors are sorted in 32 KiB of shared memory).
constexpr std::int64_t kRadixSelectMaxK = 4096;

// Whether the radix select handles rows of `cols` entries and this k (k >= 1).
inline bool radix_select_fits(std::int64_t cols, std::int64_t k) {
  return k >= 1 && k <= kRadixSelectMaxK && cols >= 0 && cols < (std::int64_t{1} << 31);
}

// Per row r of x [rows, cols]: its first n entries (n = cols, or min(cols, (first + r + 1) /
// block) when block > 0) ranked by value descending, ties to the lower index; idx[r, :k] the
// best k, -1 past n; val (when not null) their values, 0 past n. `cols` and `first` are read
// when the kernel runs (per-step scalars of a step graph); `max_cols` >= cols sizes the launch.
// Queued on `stream` (the caller checks the launch). Requires radix_select_fits(max_cols, k) and
// rows >= 1.
void launch_radix_topk(const float* x, std::int64_t rows, std::int64_t max_cols, StepScalar cols,
                       std::int64_t k, StepScalar first, std::int64_t block, std::int32_t* idx,
                       float* val, cudaStream_t stream);

}  // namespace fs::cuda
