// Host-side helpers for the packed formats' kernels (cuda_linear_packed.cu, cuda_moe_packed.cu):
// which formats the kernels decode, and the lanes a row takes.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_gemv.cuh"
#include "backend/weight.h"

namespace fs::cuda::packed {

// Calls f(F{}) with F the device decoder of w's packed format; false when the kernels have none.
template <typename Fn>
bool with_format(const Weight& w, Fn&& f) {
  if (!w.is_packed()) return false;
  switch (*w.packed) {
    case quant::QuantType::kF4E2M1x2:
      f(Fp4{});
      return true;
    case quant::QuantType::kQ8_0:
      f(Q8_0{});
      return true;
    case quant::QuantType::kQ2_K:
      f(Q2_K{});
      return true;
    case quant::QuantType::kQ4_K:
      f(Q4_K{});
      return true;
    case quant::QuantType::kQ5_K:
      f(Q5_K{});
      return true;
    case quant::QuantType::kQ6_K:
      f(Q6_K{});
      return true;
    default:
      return false;
  }
}

// Whether w's format has a device decoder and its rows are whole chunks (FP4 rows must be whole
// 32-weight scale blocks; the GGUF types' rows are whole blocks already).
inline bool decodable(const Weight& w) {
  bool whole = false;
  const bool known = with_format(w, [&](auto f) {
    using F = decltype(f);
    whole = F::chunks(w.cols()) * F::kChunk == w.cols();
  });
  return known && whole;
}

// Bytes of one row's separate scales (FP4: one E8M0 byte per 32 inputs; GGUF: none).
inline std::int64_t scale_row_bytes(const Weight& w) {
  return w.block_scaled() ? w.scales.grid_cols(w.cols()) : 0;
}

// Rows of many chunks take a warp, shorter ones 8 lanes (gemv_short_rows' rule, in chunks).
inline bool short_rows(std::int64_t chunks) {
  return chunks < 4 * kWarp;
}

}  // namespace fs::cuda::packed
