// Which fused decode kernels a weight can go to: the predicates the fused ops (cuda_fused.cu) and
// the MoE block (cuda_moe_block.cu) decide their paths with, written once so both decide alike.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "backend/cuda/cuda_gemv.cuh"
#include "backend/weight.h"

namespace fs::cuda {

template <typename T>
const T* as(const Weight& w) {
  return reinterpret_cast<const T*>(w.data);
}

// An f32 or bf16 matrix as uploaded (not block-scaled).
inline bool matrix_dtype(const Weight& w) {
  return !w.block_scaled() && (w.dtype == DType::kF32 || w.dtype == DType::kBF16);
}

// A block-scaled FP8 weight in the layout the GEMV core reads (128x128 f32 scales).
inline bool fp8_matrix(const Weight& w) {
  return w.block_scaled() && w.dtype == DType::kF8E4M3 &&
         w.scales.format == quant::ScaleFormat::kF32 && w.scales.block_rows == kFp8Block &&
         w.scales.block_cols == kFp8Block;
}

// Whether x and every weight take the 16-byte path for rows of `in` elements (and all are f32,
// all bf16, or all block-scaled FP8).
inline bool chunked(DType dtype, const void* x, std::initializer_list<const Weight*> ws,
                    std::int64_t in) {
  for (const Weight* w : ws) {
    if (w->dtype != dtype || w->is_packed()) return false;
    if (dtype == DType::kF8E4M3 ? !fp8_matrix(*w) || !vec_ok<e4m3_bits>(x, w->data, in)
        : dtype == DType::kBF16 ? !vec_ok<bf16_bits>(x, w->data, in)
                                : !vec_ok<float>(x, w->data, in))
      return false;
  }
  return true;
}

}  // namespace fs::cuda
