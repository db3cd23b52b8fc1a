// Storage formats of weights: the GGUF (ggml) block types, the FP8/FP4 element types of the
// official FP8 releases, and plain floats, with their block geometry in one table.
//
// A quantised row is a run of whole blocks: `block_elements` weights stored in `block_bytes`
// bytes, so a row of n weights takes n / block_elements * block_bytes bytes and n must be a
// multiple of block_elements. Element types (F32, FP8 E4M3) are blocks of one; FP4 E2M1 packs two
// weights in a byte. The per-block scales of the FP8/FP4 releases live in separate tensors
// (`block_scaled.h`); GGUF blocks carry their scales inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "util/status.h"

namespace fs::quant {

enum class QuantType : std::uint8_t {
  // plain numbers
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kI16,
  kI32,
  kI64,
  // ggml's blocks of 32 (and the small-block newcomers)
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ8_1,
  kIQ4_NL,
  kMXFP4,
  kNVFP4,
  kQ1_0,
  kQ2_0,
  // ggml's super-blocks of 256
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,
  kIQ2_XXS,
  kIQ2_XS,
  kIQ2_S,
  kIQ3_XXS,
  kIQ3_S,
  kIQ1_S,
  kIQ1_M,
  kIQ4_XS,
  kTQ1_0,
  kTQ2_0,
  // the element types of the official FP8/FP4 releases (scales in a separate tensor)
  kF8E4M3,    // OCP E4M3 "fn": no infinities, max 448
  kF8E8M0,    // OCP E8M0: an exponent byte, 2^(e-127); the MX scale type
  kF4E2M1x2,  // OCP E2M1, two per byte, the first element in the low nibble
};

struct QuantTypeInfo {
  QuantType type;
  std::string_view name;  // ggml's spelling, upper case ("Q4_K", "IQ2_XXS", "F32")
  int ggml_id;            // the type's number in a GGUF tensor info; -1 when GGUF has none
  std::int64_t block_elements;
  std::int64_t block_bytes;
  bool dequantizable;  // dequantize() knows it (see dequantize.h)
  bool is_float;       // holds weights (false for the integer types I8..I64)
};

const QuantTypeInfo& quant_info(QuantType t);
std::string_view quant_name(QuantType t);
// The table, in enum order (for listings and tests).
const QuantTypeInfo* quant_table_begin();
const QuantTypeInfo* quant_table_end();
std::optional<QuantType> quant_type_from_ggml(std::uint32_t ggml_id);
std::optional<QuantType> quant_type_from_name(std::string_view name);  // case-insensitive

// Bytes of a row of `elements` weights; an error naming the type when `elements` is not a
// multiple of its block or the bytes would overflow.
Expected<std::uint64_t> row_bytes(QuantType t, std::int64_t elements);

}  // namespace fs::quant
