// The shared expert's gate/up as device functions: cuda_fused.cu's shared_expert kernels and
// cuda_moe_block.cu's routing + shared gate/up grid run these bodies, so both compute the same
// bits.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_gemv.cuh"

namespace fs::cuda {

// Lanes per unit (8 when true, else a warp): as `linear` picks them for rows of H elements of T;
// the FP8 form takes T = e4m3_bits (the expert gate's row follows the FP8 rows).
template <typename T>
inline bool shared_units_short(std::int64_t H) {
  return gemv_short_rows(H / WeightChunk<T, true>::kN);
}

// A unit's group sums and its store: act[s, r] = silu(gate) * up for r < I, the scalar gate's
// logit[s] for r == I. Every lane sums (whole groups shuffle); lane 0 stores.
template <int kS, int kG>
__device__ __forceinline__ void store_units(const float (&acc)[2][kS], std::int64_t r,
                                            std::int64_t I, int lane, float* act, float* logit) {
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float g = group_sum<kG>(acc[0][s]), u = group_sum<kG>(acc[1][s]);
    if (lane != 0) continue;
    if (r < I) {
      act[s * I + r] = apply_act(g, Activation::kSilu) * u;
    } else if (r == I) {
      logit[s] = g;
    }
  }
}

// The shared expert's gate and up: unit r < I takes gate row r and up row r (act[s, r] =
// silu(g) * u), unit I the scalar gate's one row (logit[s]). Block `block` of kGemvThreads
// threads, kG lanes a unit. Waits for x (wait_for_inputs) after its first weight loads, so it
// may run in an overlapped launch.
template <typename T, int kS, int kG>
__device__ __forceinline__ void shared_gate_up_units(const float* x, const T* gate, const T* up,
                                                     const T* expert_gate, std::int64_t H,
                                                     std::int64_t I, float* act, float* logit,
                                                     std::int64_t block) {
  const std::int64_t r = (block * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const T* rows[2] = {r < I ? gate + r * H : (r == I ? expert_gate : nullptr),
                      r < I ? up + r * H : nullptr};
  const float* xs[2] = {x, x};
  float acc[2][kS] = {};
  rows_dot<T, true, kS, 2, kG, 4, true, true>(rows, xs, H, H / WeightChunk<T, true>::kN, lane,
                                              acc);  // waits for x after the first weight loads
  store_units<kS, kG>(acc, r, I, lane, act, logit);
}

// The same units for FP8 gate and up (block-scaled e4m3) beside the float expert gate (TG, which
// the FP8 releases keep in bf16): a group takes gate and up row r with their scales, or the
// expert gate's one row; the group sums run outside the branch (whole warps shuffle). Reads x
// without waiting: an overlapped launch waits before calling it.
template <typename TG, int kS, int kG>
__device__ __forceinline__ void shared_gate_up_fp8_units(
    const float* x, const e4m3_bits* gate, const float* gate_scales, const e4m3_bits* up,
    const float* up_scales, std::int64_t grid_cols, const TG* expert_gate, std::int64_t H,
    std::int64_t I, float* act, float* logit, std::int64_t block) {
  const std::int64_t r = (block * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  float acc[2][kS] = {};
  if (r < I) {
    const e4m3_bits* rows[2] = {gate + r * H, up + r * H};
    const float* xs[2] = {x, x};
    const float* scale_rows[2] = {gate_scales + (r / kFp8Block) * grid_cols,
                                  up_scales + (r / kFp8Block) * grid_cols};
    rows_dot<e4m3_bits, true, kS, 2, kG, 4, true>(rows, xs, scale_rows, H,
                                                  H / WeightChunk<e4m3_bits, true>::kN, lane, acc);
  } else if (r == I) {
    const TG* rows[1] = {expert_gate};
    const float* xs[1] = {x};
    float one[1][kS] = {};
    rows_dot<TG, true, kS, 1, kG, 8, true>(rows, xs, H, H / WeightChunk<TG, true>::kN, lane, one);
#pragma unroll
    for (int s = 0; s < kS; ++s) acc[0][s] = one[0][s];
  }
  store_units<kS, kG>(acc, r, I, lane, act, logit);
}

}  // namespace fs::cuda
