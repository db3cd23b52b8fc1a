// The per-family dequantisers behind dequantize.h: each turns `n_blocks` whole blocks at
// `blocks` into n_blocks * block_elements floats at `out`. Sizes are the caller's to check.
//
// Each is written from the format's definition (the block layouts of ggml's ggml-common.h), with
// the products in the order the format defines them, one rounding each: their results equal
// ggml's reference dequantisation bit for bit (tests/unit/test_quant_ggml.cpp), which is also
// why these files are compiled without floating-point contraction (an FMA would round once
// where the definition rounds twice).
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"

namespace fs::quant::detail {

// Little-endian reads from a block's bytes.
inline std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float load_f16(const std::uint8_t* p) {
  return f16_to_f32(load_u16(p));
}

void dequantize_q8_0(const std::uint8_t* blocks, std::int64_t n_blocks, float* out);
void dequantize_q2_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out);
void dequantize_q4_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out);
void dequantize_q5_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out);
void dequantize_q6_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out);
void dequantize_iq2_xxs(const std::uint8_t* blocks, std::int64_t n_blocks, float* out);

}  // namespace fs::quant::detail
