#include "bench/fill.h"

#include <cmath>

#include "tensor/dtype.h"
#include "tensor/quant/minifloat.h"

namespace fs::bench {

float uniform_value(std::uint64_t seed, std::uint64_t index, float scale, float offset) {
  // splitmix64 of the pair; the top 24 bits give a uniform float in [0, 1).
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return offset + scale * (2.0f * u - 1.0f);
}

Status fill_uniform(Tensor& t, std::uint64_t seed, float scale, float offset) {
  if (!t.ok()) return internal_error("bench: a synthetic tensor could not be allocated");
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF8E4M3)
    return invalid_argument("bench: fill_uniform takes f32, bf16 or f8_e4m3 tensors");
  if (t.device() == Device::kHost) {
    const auto n = static_cast<std::uint64_t>(t.numel());
    if (t.dtype() == DType::kF32) {
      float* p = t.data();
      for (std::uint64_t i = 0; i < n; ++i) p[i] = uniform_value(seed, i, scale, offset);
    } else if (t.dtype() == DType::kF8E4M3) {
      auto* p = t.data_as<std::uint8_t>();
      for (std::uint64_t i = 0; i < n; ++i)
        p[i] = quant::f32_to_e4m3_saturate(uniform_value(seed, i, scale, offset));
    } else {
      auto* p = t.data_as<std::uint16_t>();
      for (std::uint64_t i = 0; i < n; ++i)
        p[i] = f32_to_bf16(uniform_value(seed, i, scale, offset));
    }
    return {};
  }
#if FLASHSERVE_HAVE_CUDA
  return fill_uniform_cuda(t, seed, scale, offset);
#else
  return unsupported("bench: no CUDA in this build");
#endif
}

namespace {

// f16 bits of a positive finite v below 65504 (round to nearest; subnormals in units of 2^-24).
std::uint16_t f16_bits(float v) {
  int e = 0;
  const float m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  const int biased = e - 1 + 15;
  if (biased <= 0) return static_cast<std::uint16_t>(std::lround(std::ldexp(v, 24)));
  auto mant = std::lround((2.0f * m - 1.0f) * 1024.0f);
  int ex = biased;
  if (mant == 1024) {
    mant = 0;
    ++ex;
  }
  return static_cast<std::uint16_t>((ex << 10) | mant);
}

// The factors that keep a block's weights within about +-scale: the largest quant (times the
// largest sub-block scale) times d is about scale, and a K type's min about half of it.
Expected<PackedFill> packed_fill(quant::QuantType q, float scale) {
  using quant::QuantType;
  PackedFill f;
  auto factor = [&](int i, int offset, float value) {
    f.f16_offset[i] = offset;
    f.f16_bits[i] = f16_bits(value);
  };
  switch (q) {
    case QuantType::kQ8_0:
      f.block_bytes = 34;
      factor(0, 0, scale / 127);
      break;
    case QuantType::kQ4_K:
      f.block_bytes = 144;
      factor(0, 0, scale / (63 * 15));
      factor(1, 2, scale / (2 * 63));
      break;
    case QuantType::kQ5_K:
      f.block_bytes = 176;
      factor(0, 0, scale / (63 * 31));
      factor(1, 2, scale / (2 * 63));
      break;
    case QuantType::kQ6_K:
      f.block_bytes = 210;
      factor(0, 208, scale / (127 * 32));
      break;
    case QuantType::kQ2_K:
      f.block_bytes = 84;
      factor(0, 80, scale / (15 * 3));
      factor(1, 82, scale / (2 * 15));
      break;
    case QuantType::kIQ2_XXS:  // d * (0.5 + 15) / 4 * 43 at most
      f.block_bytes = 66;
      factor(0, 0, scale / 166);
      break;
    case QuantType::kF4E2M1x2:
      break;
    case QuantType::kF8E8M0:
      f.constant = 127 + static_cast<int>(std::lround(std::log2(scale / 6)));
      break;
    default:
      return unsupported("bench: fill_packed: no synthetic fill for " +
                         std::string(quant::quant_name(q)));
  }
  return f;
}

}  // namespace

Status fill_packed(Tensor& t, quant::QuantType q, std::uint64_t seed, float scale) {
  if (!t.ok()) return internal_error("bench: a synthetic tensor could not be allocated");
  auto f = packed_fill(q, scale);
  if (!f.ok()) return f.status();
  const auto n = static_cast<std::int64_t>(t.bytes());
  if (n % f->block_bytes != 0)
    return internal_error("bench: fill_packed: the tensor is not whole blocks");
  if (t.device() == Device::kHost) {
    auto* p = static_cast<std::uint8_t*>(t.raw());
    for (std::int64_t i = 0; i < n; ++i) {
      const float u = uniform_value(seed, static_cast<std::uint64_t>(i), 1.0f, 1.0f);  // [0, 2)
      p[i] = f->constant >= 0 ? static_cast<std::uint8_t>(f->constant)
                              : static_cast<std::uint8_t>(static_cast<int>(u * 128.0f) & 0xff);
    }
    for (std::int64_t b = 0; b < n / f->block_bytes; ++b)
      for (int k = 0; k < 2; ++k)
        if (f->f16_offset[k] >= 0) {
          auto* at = p + b * f->block_bytes + f->f16_offset[k];
          at[0] = static_cast<std::uint8_t>(f->f16_bits[k] & 0xff);
          at[1] = static_cast<std::uint8_t>(f->f16_bits[k] >> 8);
        }
    return {};
  }
#if FLASHSERVE_HAVE_CUDA
  return fill_packed_cuda(t, *f, seed);
#else
  return unsupported("bench: no CUDA in this build");
#endif
}

}  // namespace fs::bench
