// The epilogue of the fused multi-GEMV (cuda_fused.cu), shared with cuda_moe_block.cu's shared
// down + routed combine, which finishes its rows the same way.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.h"

namespace fs::cuda {

// What a multi_gemv segment does to a row's dot product v (token s, output row r), in this order:
// v *= scale; v += bias[r]; v = act(v); v *= post; v *= col_scale[r];
// v *= sigmoid(token_gate[s]); v = y + v (accumulate). Null pointers skip their step.
struct Epilogue {
  float scale = 1.0f;
  const float* bias = nullptr;
  Activation act = Activation::kIdentity;
  float post = 1.0f;
  const float* col_scale = nullptr;
  const float* token_gate = nullptr;
  bool accumulate = false;
};

// v after the epilogue's steps; y is the value accumulated into (read only when accumulating).
__device__ __forceinline__ float finish(const Epilogue& e, float v, std::int64_t r, int s,
                                        float y) {
  v = __fmul_rn(v, e.scale);
  if (e.bias != nullptr) v = __fadd_rn(v, e.bias[r]);
  v = apply_act(v, e.act);
  v = __fmul_rn(v, e.post);
  if (e.col_scale != nullptr) v = __fmul_rn(v, e.col_scale[r]);
  if (e.token_gate != nullptr) v = __fmul_rn(v, apply_act(e.token_gate[s], Activation::kSigmoid));
  if (e.accumulate) v = __fadd_rn(y, v);
  return v;
}

}  // namespace fs::cuda
