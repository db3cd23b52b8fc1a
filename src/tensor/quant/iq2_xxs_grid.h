// The IQ2_XXS codebook (data; iq2_xxs_grid.cpp says where it comes from).
#pragma once

#include <array>
#include <cstdint>

namespace fs::quant {

extern const std::array<std::uint64_t, 256> kIq2XxsGrid;

}  // namespace fs::quant
