// Fills a tensor with hash-derived values, in its own memory (on the GPU by a kernel, so the
// bench never moves ~100 GB of synthetic weights across PCIe): element i is
// offset + scale * u(seed, i), u uniform in [-1, 1) from splitmix64 of (seed, i). f32, bf16, or
// f8_e4m3 (rounded to nearest even, saturated at +-448).
#pragma once

#include <cstdint>

#include "tensor/quant/quant_type.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace fs::bench {

Status fill_uniform(Tensor& t, std::uint64_t seed, float scale, float offset = 0.0f);

// A packed weight's bytes (a U8 tensor of whole `q` blocks) as a synthetic checkpoint of that
// type: every byte hashed from (seed, index), then each block's f16 factors set so that its
// weights stay within about +-scale. kF4E2M1x2: random codes (every one finite, |w| <= 6);
// kF8E8M0: every byte the exponent of scale / 6 (the FP4 weights' scales).
Status fill_packed(Tensor& t, quant::QuantType q, std::uint64_t seed, float scale);

// The value fill_uniform writes at element `index` (before any bf16 rounding).
float uniform_value(std::uint64_t seed, std::uint64_t index, float scale, float offset);

#if FLASHSERVE_HAVE_CUDA
// The device half (fill_cuda.cu).
Status fill_uniform_cuda(Tensor& t, std::uint64_t seed, float scale, float offset);
// One block layout: block_bytes per block, up to two f16 factors at their offsets (-1: none).
struct PackedFill {
  std::int64_t block_bytes = 1;
  int f16_offset[2] = {-1, -1};
  std::uint16_t f16_bits[2] = {0, 0};
  int constant = -1;  // >= 0: every byte this value
};
Status fill_packed_cuda(Tensor& t, const PackedFill& f, std::uint64_t seed);
#endif

}  // namespace fs::bench
