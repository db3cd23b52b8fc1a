// Weights whose scales live in a separate tensor, as the official FP8/FP4 releases store them.
//
// - Qwen/DeepSeek FP8 (`weight` F8_E4M3 [out, in] beside `weight_scale_inv` F32
//   [ceil(out/128), ceil(in/128)]): w = e4m3 * scale_inv. (The name is the quantiser's: it
//   divided by the scale, so the stored number is what dequantisation multiplies by.)
// - DeepSeek V4 FP8: the same 128x128 blocks with E8M0 scales (one exponent byte per block).
// - DeepSeek V4 routed experts, FP4: E2M1 packed two per byte ([out, in/2], the first of each
//   pair in the low nibble) with E8M0 scales per 32 consecutive inputs ([out, in/32]).
// A block at the matrix's edge is partial: the grid rounds up.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tensor/quant/quant_type.h"
#include "util/status.h"

namespace fs::quant {

enum class ScaleFormat : std::uint8_t { kF32, kE8M0 };

struct BlockScales {
  ScaleFormat format = ScaleFormat::kF32;
  std::int64_t block_rows = 128;        // weights per scale along the output dimension
  std::int64_t block_cols = 128;        // and along the input dimension
  std::span<const std::uint8_t> bytes;  // [ceil(rows/block_rows), ceil(cols/block_cols)], row-major
};

// A weight matrix with its scales: `element` is kF8E4M3 or kF4E2M1x2; `weights` holds the
// [rows, cols] matrix row after row (cols/2 bytes a row for FP4).
struct ScaledMatrix {
  QuantType element = QuantType::kF8E4M3;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::span<const std::uint8_t> weights;
  BlockScales scales;
};

// Checks that the element type, the byte counts and the scale grid agree with the shape; the
// error names what disagrees.
Status validate(const ScaledMatrix& m);
// Row `row` into `out` (cols floats): each weight times its block's scale, one f32 product.
Status dequantize_row(const ScaledMatrix& m, std::int64_t row, std::span<float> out);
Expected<std::vector<float>> dequantize(const ScaledMatrix& m);

}  // namespace fs::quant
