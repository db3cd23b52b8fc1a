// Dequantisation to f32 on the CPU: the reference every kernel that reads a quantised type is
// compared to. A row of a quantised matrix is a run of whole blocks, so the row (the GEMV
// reference) and the whole tensor are the same operation over different spans.
//
// Types with dequantizable == true in quant_type.h: F32, F16, BF16, Q8_0, Q2_K, Q4_K, Q5_K,
// Q6_K, IQ2_XXS and the FP8/FP4 element types (without their block scales; block_scaled.h
// applies those).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tensor/quant/quant_type.h"
#include "tensor/tensor_view.h"
#include "util/status.h"

namespace fs::quant {

// `out.size()` weights from exactly row_bytes(t, out.size()) bytes.
Status dequantize(QuantType t, std::span<const std::uint8_t> blocks, std::span<float> out);
// Row `row` of a [rows, cols] matrix stored row after row in `matrix`.
Status dequantize_row(QuantType t, std::span<const std::uint8_t> matrix, std::int64_t cols,
                      std::int64_t row, std::span<float> out);
// A whole tensor; its last dimension is the row.
Expected<std::vector<float>> dequantize_tensor(QuantType t, const Shape& shape,
                                               std::span<const std::uint8_t> bytes);

}  // namespace fs::quant
