// Q8_0: blocks of 32 weights, an f16 scale d then 32 signed bytes q; w = q * d.
#include "tensor/quant/blocks.h"

namespace fs::quant::detail {

void dequantize_q8_0(const std::uint8_t* blocks, std::int64_t n_blocks, float* out) {
  constexpr int kBytes = 34;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::uint8_t* blk = blocks + b * kBytes;
    const float d = load_f16(blk);
    const auto* q = reinterpret_cast<const std::int8_t*>(blk + 2);
    for (int j = 0; j < 32; ++j) *out++ = static_cast<float>(q[j]) * d;
  }
}

}  // namespace fs::quant::detail
