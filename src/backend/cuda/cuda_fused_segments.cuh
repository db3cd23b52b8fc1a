// The fused decode ops' row space (cuda_fused.cu): up to four weights over one x, each a segment
// with its output, its epilogue (cuda_epilogue.cuh) and, for the GatedDeltaNet qkv rows of a
// decode step, the conv (ConvTail). Shared by the multi-GEMV of float and FP8 weights
// (cuda_fused.cu) and of packed ones (cuda_fused_packed.cu), so both finish a row alike.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "backend/cuda/cuda_backend.h"  // first: its pragma for nvcc's warning 2810
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_epilogue.cuh"
#include "backend/weight.h"
#include "tensor/tensor.h"

namespace fs::cuda {

constexpr int kFusedRows = 4;  // token rows the fused kernels take (decode and MTP verify)
constexpr int kMaxSegments = 4;

// gated_delta_net_in_proj_conv's epilogue on the qkv rows, one token: channel r's product x_r
// becomes silu(sum_j w[r, j] * win_j) over win = tail[0..K-2, r] ++ x_r, with gdn_conv_kernel's
// arithmetic (the sum in j order without fused multiply-adds), and the tail moves up one row.
// Only the lane that stores channel r touches its tail column.
struct ConvTail {
  const void* w = nullptr;  // [rows, K], f32 or bf16
  bool bf16 = false;
  float* tail = nullptr;  // [K - 1, rows]
  int K = 0;

  __device__ __forceinline__ float weight(std::int64_t r, int j) const {
    return bf16 ? widen(static_cast<const bf16_bits*>(w)[r * K + j])
                : static_cast<const float*>(w)[r * K + j];
  }
  __device__ __forceinline__ float apply(std::int64_t C, std::int64_t r, float x) const {
    const int L = K - 1;
    float acc = 0;
    for (int j = 0; j < K; ++j) acc = mul_add(weight(r, j), j < L ? tail[j * C + r] : x, acc);
    for (int j = 0; j < L; ++j) tail[j * C + r] = j + 1 < L ? tail[(j + 1) * C + r] : x;
    return apply_act(acc, Activation::kSilu);
  }
};

struct Segment {
  const void* w = nullptr;  // [rows, in]
  float* y = nullptr;       // [S, rows]
  std::int64_t rows = 0;
  Epilogue ep;
  const float* scales = nullptr;  // block-scaled FP8: the 128x128 scale grid, grid_cols wide
  std::int64_t grid_cols = 0;
  ConvTail conv;  // the GatedDeltaNet conv after the epilogue (one token), when conv.tail is set
};

struct Segments {
  Segment s[kMaxSegments];
  int count = 0;
  std::int64_t total = 0;  // rows over all segments
};

// The multi-GEMV's row space over packed weights: every weight one format and width, 2-D, and x
// 16-byte aligned (the packed GEMV reads x rows as float4). The GGUF mixes' projections.
bool packed_segments_take(const Tensor& x, std::initializer_list<const Weight*> weights);

// Queues segs over x [S, in] (1 <= S <= kFusedRows; S 1 where a segment carries the conv) with
// `weights` (packed_segments_take, in segs' order) through the packed GEMV's forms
// (cuda_packed_gemv.cuh): each row's sum is packed `linear`'s, then the segment's epilogue and
// conv as multi_gemv_kernel applies them, so the unfused sequence's bits. `codebook`: IQ2_XXS's
// grid on the device (CudaBackend::iq2_grid), else unused.
void run_packed_multi_gemv(const Tensor& x, std::initializer_list<const Weight*> weights,
                           const Segments& segs, const std::uint8_t* codebook, cudaStream_t stream);

}  // namespace fs::cuda
