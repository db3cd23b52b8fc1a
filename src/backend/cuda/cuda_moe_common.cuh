// What the routed-expert paths share (cuda_moe.cu, cuda_moe_packed.cu): the clamped SwiGLU and
// the combine pass in the CPU reference's order.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_gemv.cuh"

namespace fs::cuda {
namespace {

constexpr int kMaxTopK = 64;
// Tokens up to which the routed experts run as GEMVs over (token, expert) pairs (decode, an MTP
// verify); a prefill past them takes the grouped products (cuda_grouped_gemm.h).
constexpr int kMaxPairTokens = 4;

// The f32 scale grid of a stacked block-scaled [E, rows, cols] tensor ([E, gr, gc]).
struct ExpertGrid {
  std::int64_t rows, cols;
  __device__ __forceinline__ const float* row(const float* scales, std::int64_t e,
                                              std::int64_t r) const {
    const std::int64_t gr = (rows + kFp8Block - 1) / kFp8Block,
                       gc = (cols + kFp8Block - 1) / kFp8Block;
    return scales + (e * gr + r / kFp8Block) * gc;
  }
};

// silu(gate) * up, clamped first when limit > 0 (gate <= L, up in [-L, L]: DeepSeek V4, GLM 5.3).
__device__ __forceinline__ float clamped_swiglu(float g, float up, float limit) {
  if (limit > 0.0f) {
    g = fminf(g, limit);
    up = fminf(fmaxf(up, -limit), limit);
  }
  return apply_act(g, Activation::kSilu) * up;
}

// y[s, c] = sum of weights[s, j] * out[s*k + j, c] over the token's valid pairs, added in the
// CPU reference's order (its per-expert loop: expert id ascending, then j), without fused
// multiply-adds. A block per (token, 256 columns).
__global__ void moe_combine_kernel(const float* out, const float* weights,
                                   const std::int32_t* experts, std::int64_t E, std::int64_t k,
                                   std::int64_t H, float* y) {
  __shared__ int order[kMaxTopK];
  __shared__ int count;
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  const std::int64_t s = blockIdx.x;
  const std::int32_t* ids = experts + s * k;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < k; ++j) {
      const std::int32_t e = ids[j];
      if (e < 0 || e >= E) continue;
      int at = n;
      for (; at > 0 && ids[order[at - 1]] > e; --at) order[at] = order[at - 1];
      order[at] = j;
      ++n;
    }
    count = n;
  }
  __syncthreads();
  const std::int64_t c = blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= H) return;
  float acc = 0.0f;
  for (int i = 0; i < count; ++i) {
    const std::int64_t p = s * k + order[i];
    acc = mul_add(weights[p], out[p * H + c], acc);
  }
  y[s * H + c] = acc;
}

}  // namespace
}  // namespace fs::cuda
