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

// The hyper-connection write of a column's value v (Backend::linear_into_streams,
// moe_block_into_streams): stream k of h [S, streams * W] += inject[s, k] * v, with
// add_scaled_streams' arithmetic (mul_add), so the bits of the op then add_scaled_streams.
struct StreamsOut {
  float* h = nullptr;
  const float* inject = nullptr;  // [S, streams]
  std::int64_t streams = 0;
};
constexpr int kMaxAheadStreams = 4;  // streams a one-token kernel reads before its wait

// Token 0's h values of column c and its injection gates, read before the kernel's wait (beside
// its first weight loads), which takes an L2 round trip off the kernel's end. Safe because
// neither is written by the op right before (the *_into_streams contract, backend.h): every
// kernel here releases its dependents only after its own wait, so when a kernel starts, every
// kernel before the one before it has finished. Read through L2 (__ldcg): no L1 line of an
// earlier kernel. Up to kMaxAheadStreams streams; more are read at the write.
struct StreamsAhead {
  float h[kMaxAheadStreams] = {};
  float g[kMaxAheadStreams] = {};
  __device__ __forceinline__ void read(const StreamsOut& o, std::int64_t W, std::int64_t c) {
    if (o.streams > kMaxAheadStreams) return;
#pragma unroll
    for (int k = 0; k < kMaxAheadStreams; ++k) {
      if (k < o.streams) {
        h[k] = __ldcg(o.h + k * W + c);
        g[k] = __ldcg(o.inject + k);
      }
    }
  }
  // Token 0's column c from the values read ahead.
  __device__ __forceinline__ void write(const StreamsOut& o, std::int64_t W, std::int64_t c,
                                        float v) const {
    if (o.streams > kMaxAheadStreams) return write_streams(o, W, 0, c, v);
#pragma unroll
    for (int k = 0; k < kMaxAheadStreams; ++k)
      if (k < o.streams) o.h[k * W + c] = mul_add(g[k], v, h[k]);
  }
  // Token s's column c, reading h and the gates now.
  __device__ __forceinline__ static void write_streams(const StreamsOut& o, std::int64_t W, int s,
                                                       std::int64_t c, float v) {
    float* hs = o.h + s * o.streams * W + c;
    const float* gs = o.inject + s * o.streams;
    for (std::int64_t k = 0; k < o.streams; ++k) hs[k * W] = mul_add(gs[k], v, hs[k * W]);
  }
};

}  // namespace fs::cuda
