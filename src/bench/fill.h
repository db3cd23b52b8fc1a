// Fills a tensor with hash-derived values, in its own memory (on the GPU by a kernel, so the
// bench never moves ~100 GB of synthetic weights across PCIe): element i is
// offset + scale * u(seed, i), u uniform in [-1, 1) from splitmix64 of (seed, i). f32, bf16, or
// f8_e4m3 (rounded to nearest even, saturated at +-448).
#pragma once

#include <cstdint>

#include "tensor/tensor.h"
#include "util/status.h"

namespace fs::bench {

Status fill_uniform(Tensor& t, std::uint64_t seed, float scale, float offset = 0.0f);

// The value fill_uniform writes at element `index` (before any bf16 rounding).
float uniform_value(std::uint64_t seed, std::uint64_t index, float scale, float offset);

#if FLASHSERVE_HAVE_CUDA
// The device half (fill_cuda.cu).
Status fill_uniform_cuda(Tensor& t, std::uint64_t seed, float scale, float offset);
#endif

}  // namespace fs::bench
