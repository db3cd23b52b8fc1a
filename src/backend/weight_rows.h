// Rows [r0, r0 + n) of a 2-D weight as a weight of its own (the groups of grouped_linear): rows
// are contiguous in every storage format, and a block-scaled weight's scale grid is row-major in
// whole block rows, so the slice starts at block row r0 / block_rows when r0 is a multiple of
// block_rows (always for FP4's 1x32 blocks; FP8's 128-row blocks need r0 % 128 == 0).
#pragma once

#include <string>

#include "backend/weight.h"

namespace fs {

inline Expected<Weight> weight_rows(const Weight& w, std::int64_t r0, std::int64_t n) {
  Weight out = w.first_rows(n);
  out.data = w.data + static_cast<std::size_t>(r0) * w.row_bytes();
  if (w.block_scaled()) {
    if (r0 % w.scales.block_rows != 0)
      return unsupported("rows from " + std::to_string(r0) + " of a " + w.format_name() +
                         " weight start inside a scale block");
    out.scales.data += static_cast<std::size_t>(r0 / w.scales.block_rows) *
                       static_cast<std::size_t>(w.scales.grid_cols(w.cols())) *
                       w.scales.scale_size();
  }
  return out;
}

}  // namespace fs
