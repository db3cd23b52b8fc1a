// IQ2_XXS, 66 bytes per 256 weights: an f16 d, then 8 groups of 8 bytes, one group per 32
// weights. A group's first four bytes each name a point of the codebook (kIq2XxsGrid): eight
// magnitudes for eight weights. Its last four bytes, read as a little-endian u32, hold four 7-bit
// sign fields (bits 7l..7l+6, one per point) and a 4-bit scale s (bits 28-31). The eighth sign of
// a point is implied: the number of negative weights in each 8 is even. The 32 weights share the
// factor d * (0.5 + s) / 4.
#include "tensor/quant/blocks.h"
#include "tensor/quant/iq2_xxs_grid.h"

namespace fs::quant::detail {
namespace {

// The eight signs from a 7-bit field: bit 7 completes an even count of set bits.
std::uint8_t signs_of(std::uint32_t field) {
  const auto s = static_cast<std::uint8_t>(field & 127u);
  const int parity = __builtin_popcount(s) & 1;
  return static_cast<std::uint8_t>(s | (parity << 7));
}

}  // namespace

void dequantize_iq2_xxs(const std::uint8_t* blocks, std::int64_t n_blocks, float* out) {
  constexpr int kBytes = 66;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::uint8_t* blk = blocks + b * kBytes;
    const float d = load_f16(blk);
    for (int group = 0; group < 8; ++group) {
      const std::uint8_t* g = blk + 2 + 8 * group;
      const std::uint32_t meta = load_u32(g + 4);
      const float factor = d * (0.5f + static_cast<float>(meta >> 28)) * 0.25f;
      for (int point = 0; point < 4; ++point) {
        const std::uint64_t magnitudes = kIq2XxsGrid[g[point]];
        const std::uint8_t signs = signs_of(meta >> (7 * point));
        for (int j = 0; j < 8; ++j) {
          const auto m = static_cast<float>((magnitudes >> (8 * j)) & 0xff);
          *out++ = factor * m * (((signs >> j) & 1) ? -1.0f : 1.0f);
        }
      }
    }
  }
}

}  // namespace fs::quant::detail
