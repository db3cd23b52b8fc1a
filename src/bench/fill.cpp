#include "bench/fill.h"

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

}  // namespace fs::bench
