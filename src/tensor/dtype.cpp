#include "tensor/dtype.h"

#include <cassert>
#include <cmath>
#include <limits>

#include "tensor/fp8_e4m3.h"

namespace fs {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E8M0:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kF8E8M0:
      return "F8_E8M0";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI64, DType::kI32,
                  DType::kU8, DType::kI8, DType::kF8E8M0}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF8E4M3;
}

float f16_to_f32(std::uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<float>::infinity()
                  : std::numeric_limits<float>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

float f8e4m3_to_f32(std::uint8_t x) {
  return e4m3_value(x);
}

void convert_to_f32(DType t, const void* src, float* dst, std::size_t count) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const std::uint8_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = f8e4m3_to_f32(s[i]);
      return;
    }
    default:
      assert(false && "convert_to_f32 on an integer dtype");
  }
}

}  // namespace fs
