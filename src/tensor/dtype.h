// Element types of checkpoint tensors and their conversions to float32, the CPU compute type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace fs {

// kI8 and kF8E8M0 are storage only: DeepSeek V4's official release keeps its FP4 experts as I8
// (two E2M1 codes a byte) and its block scales as F8_E8M0 (exponent bytes); neither is a float
// that convert_to_f32 widens.
enum class DType : std::uint8_t { kF32, kBF16, kF16, kF8E4M3, kI64, kI32, kU8, kI8, kF8E8M0 };

// Bytes per element.
std::size_t dtype_size(DType t);
// The safetensors spelling: "F32", "BF16", "F16", "F8_E4M3", "I64", "I32", "U8", "I8",
// "F8_E8M0".
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
bool dtype_is_float(DType t);

inline float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, the rounding torch uses for .to(torch.bfloat16); NaN stays NaN.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(std::uint16_t h);
// OCP FP8 E4M3 ("fn" variant: no infinities, 0x7f/0xff are NaN, max 448).
float f8e4m3_to_f32(std::uint8_t v);

// Converts `count` elements of a float dtype at `src` to float32. Integer dtypes are not floats:
// asking for one is a programming error (asserted).
void convert_to_f32(DType t, const void* src, float* dst, std::size_t count);

}  // namespace fs
