// The routed experts of a sparse MoE (Backend::moe_experts).
//
// One to four tokens (decode, and an MTP verify of depth 1-3): the fused path, three kernels, no
// host sync, no atomics, expert ids read on the device. A block's slot is one (token, expert) pair
// (slot_expert), token u / k's row its x: a verify's token sums exactly as a decode step's does.
//  1. gate_up: a block per (I-row tile, slot):
//     act[u, r] = silu(gate_up[e_u] row r · x) * (gate_up[e_u] row I+r · x).
//  2. down: a block per (column tile, slot): part[u, c] = down[e_u] row c · act[u].
//  3. combine: y[t, c] = the sum of weight_u * part[u, c] over token t's slots in top-k order.
// The kernels also take 2-4 tokens with a slot per distinct expert (read once for all the tokens
// routed to it, kS > 1); the op does not use that: random routings share few experts, and the
// distinct-expert prologue cost more than it saved (bench/NOTES.md 2026-12-02).
// More tokens (prefill): the pairs sorted by expert and grouped products on the tensor cores
// (cuda_grouped_gemm.h) for bf16 and block-scaled FP8 experts; f32 experts, widths off 16 bytes,
// or FLASHSERVE_CUDA_MOE_PAIRS=1: GEMVs over (token, expert) pairs. Then a combine pass in the
// CPU's order.
#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_grouped_gemm.h"
#include "backend/cuda/cuda_moe_common.cuh"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

// The fused path's slots are pairs, never distinct experts: at 2-4 tokens the fused kernels with
// their distinct-expert prologue lost to the pair kernels on the H200 (cuda_kernel_bench,
// bench/NOTES.md 2026-12-02: 63 vs 83 us at 2 tokens, 87 vs 144 at 3).
// Up to this many tokens (an MTP verify of depth 3) run the one-token kernels with a slot per
// (token, expert) pair, each reading its token's row: the sums of the autoregressive step's. The
// pair kernels below (FLASHSERVE_CUDA_MOE_PAIRS=1) take every count.
constexpr int kFusedMaxTokens = 4;
constexpr int kMaxPairs = kFusedMaxTokens * kMaxTopK;
constexpr int kGateUpThreads = 256;     // 8 warps, one I-row (its gate and up rows) each
constexpr int kGateUpStagedBlocks = 3;  // __launch_bounds__ blocks a multiprocessor, staged x
constexpr int kDownThreads = 256;       // groups of 8 or 16 lanes (FP8, bf16), a row each
constexpr int kDownLanes = 16;          // f32 down rows: 16 lanes, 8 loads in flight each,
constexpr int kDownRows = 2;            // and two rows a group

// The routing of a block's tokens, in shared memory.
struct Routing {
  int ids[kMaxPairs];
  int distinct[kMaxPairs];  // the distinct valid expert ids, ascending
  int count;                // how many
};

// Fills r from ids[0, P) (P <= kMaxPairs); ends with a barrier. Valid ids are in [0, E).
__device__ void route(const std::int32_t* ids, int P, std::int64_t E, Routing& r) {
  __shared__ bool first[kMaxPairs];
  for (int t = threadIdx.x; t < P; t += blockDim.x) r.ids[t] = ids[t];
  __syncthreads();
  for (int t = threadIdx.x; t < P; t += blockDim.x) {
    const int e = r.ids[t];
    bool f = e >= 0 && e < E;
    for (int j = 0; j < t && f; ++j) f = r.ids[j] != e;
    first[t] = f;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < P; t += blockDim.x) {
    if (!first[t]) continue;
    const int e = r.ids[t];
    int rank = 0;
    for (int j = 0; j < P; ++j) rank += first[j] && r.ids[j] < e;
    r.distinct[rank] = e;
  }
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < P; ++j) n += first[j];
    r.count = n;
  }
  __syncthreads();
}

// The expert of a block's slot u: at one token the slot is the pair (a token's top-k ids are
// distinct), read directly: one load, no barrier, the sum later in the top-k order as the CPU's;
// at 2-4 tokens the u-th distinct id ascending (route), so an expert is read once for all tokens.
// False: the slot has no expert (an id outside [0, E), or fewer distinct experts than pairs).
template <int kS>
__device__ __forceinline__ bool slot_expert(const std::int32_t* ids, int P, std::int64_t E, int u,
                                            std::int64_t& e) {
  if constexpr (kS == 1) {
    e = ids[u];
    return e >= 0 && e < E;
  } else {
    __shared__ Routing routing;
    route(ids, P, E, routing);
    if (u >= routing.count) return false;
    e = routing.distinct[u];
    return true;
  }
}

// kStaged: x from shared memory (StagedX, cuda_gemv.cuh).
template <typename T, bool kVec, int kS, bool kStaged = false, int kMinBlocks = 1>
__global__ void __launch_bounds__(kGateUpThreads, kMinBlocks)
    moe_gate_up_fused_kernel(const float* x, const T* gate_up, const float* scales,
                             const std::int32_t* ids, int P, int per_token, std::int64_t E,
                             std::int64_t H, std::int64_t I, float limit, float* act) {
  wait_for_inputs();  // the ids and x are the kernels' before
  release_dependents();
  const int u = static_cast<int>(blockIdx.y);
  std::int64_t e = 0;
  if (!slot_expert<kS>(ids, P, E, u, e)) return;  // the whole block
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const T* base = gate_up + e * 2 * I * H;
  const T* rows[2] = {r < I ? base + r * H : nullptr, r < I ? base + (I + r) * H : nullptr};
  // One token's slots are its pairs: slot u reads the row of token u / per_token (the
  // one-token kernels serve 2-4 tokens as 2-4 tokens' worth of pairs, kMaxPairTokens).
  const float* xr = kS == 1 ? x + static_cast<std::int64_t>(u / per_token) * H : x;
  const float* xs[2] = {xr, xr};
  const float* scale_rows[2] = {nullptr, nullptr};
  if (scales != nullptr) {
    const ExpertGrid g{2 * I, H};
    scale_rows[0] = g.row(scales, e, r);
    scale_rows[1] = g.row(scales, e, I + r);
  }
  float acc[2][kS] = {};
  // 5 chunks of each row in flight: a 2560-wide bf16 row is two round trips per lane (three at 4).
  rows_dot<T, kVec, kS, 2, kWarp, 5, true, false, kStaged>(rows, xs, scale_rows, H,
                                                           H / WeightChunk<T, kVec>::kN, lane, acc);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float g = group_sum<kWarp>(acc[0][s]), up = group_sum<kWarp>(acc[1][s]);
    if (lane == 0 && r < I) act[(u * kS + s) * I + r] = clamped_swiglu(g, up, limit);
  }
}

// One token's routed gate/up on FP8 E4M3 experts (128x128 block scales), as
// moe_gate_up_fused_kernel<e4m3_bits, true, 1, true> computes it, with its (pair, row) items
// streamed through resident warps: item i = (p, r) = (i / I, i % I); a warp takes items warp,
// warp + warps, ... and walks their rows gate, up, gate, up, ..., issuing each row's loads (kU
// chunks a lane and their scales) before it sums the row before it; x staged once a block. That
// kernel's 800 blocks at Qwen 3.8's shapes (10 pairs x 80) are two rounds and a few blocks of the
// 396 a device holds, each block's loads issued only once its ids are read. Each row's sum is
// rows_dot's (the lanes, chunks and order of the deferred-scale form, written out again here:
// rows_dot interleaves its rows to share x's loads, and that schedule is the decode step's
// hot path; a change to either must keep the other's bits), so the same bits
// (QuantOps.StreamedPackedRowsGiveTheOneRowAWarpBits). FLASHSERVE_CUDA_FP8_EXPERT_STREAM=0: that
// kernel (session 32: the streamed form 2.7% faster, the FP8 step 1.3-1.6%).
constexpr int kFp8StreamLoads = 5;  // chunks a lane: a 2560-wide row in one round
__global__ void __launch_bounds__(kGateUpThreads)
    moe_gate_up_fp8_stream_kernel(const float* x, const e4m3_bits* gate_up, const float* scales,
                                  const std::int32_t* ids, std::int64_t P, std::int64_t E,
                                  std::int64_t H, std::int64_t I, float limit, float* act) {
  wait_for_inputs();  // the ids and x are the kernels' before
  release_dependents();
  using C = WeightChunk<e4m3_bits, true>;
  constexpr int kN = C::kN, kU = kFp8StreamLoads;
  using Staged = StagedX<kN, kWarp>;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kGateUpThreads / kWarp);
  const std::int64_t items = P * I, chunks = H / kN;
  const ExpertGrid grid{2 * I, H};
  std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kGateUpThreads / kWarp) +
                   static_cast<std::int64_t>(threadIdx.x / kWarp);
  C::Raw raw[2][kU];
  float scale[2][kU];
  // Row h (0 gate, 1 up) of item `item` into buffer b: nothing past the last item or for a pair
  // routed nowhere.
  const auto load_row = [&](std::int64_t item, int h, int b) {
    const std::int64_t q = index_quotient(item, I);
    const std::int64_t e = item < items ? ids[q] : -1, r = item - q * I + h * I;
    const bool live = e >= 0 && e < E;
    const e4m3_bits* row = live ? gate_up + (e * 2 * I + r) * H : gate_up;
    const float* scale_row = live ? grid.row(scales, e, r) : nullptr;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = lane + static_cast<std::int64_t>(u) * kWarp;
      const bool ok = live && c < chunks;
      raw[b][u] = ok ? C::load(row + c * kN) : C::Raw{};
      scale[b][u] = ok ? __ldg(scale_row + c * kN / kFp8Block) * C::kScaleFactor : 0.0f;
    }
  };
  const auto dot = [&](int b) {
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = lane + static_cast<std::int64_t>(u) * kWarp;
      if (c >= chunks) break;
      float d = 0.0f;
#pragma unroll
      for (int w = 0; w < kN / 4; ++w) {
        float w4[4];
        C::widen_word(raw[b][u], w, w4);
        const float4 v = staged_x[Staged::at(c, w)];
        const float xv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) d = fmaf(w4[q], xv[q], d);
      }
      acc = fmaf(d, scale[b][u], acc);
    }
    return group_sum<kWarp>(acc);
  };
  load_row(i, 0, 0);
  stage_x<kN, kWarp, 1>(x, H, chunks);
  for (; i < items; i += warps) {
    load_row(i, 1, 1);
    const float g = dot(0);
    load_row(i + warps, 0, 0);
    const float u = dot(1);
    const std::int64_t e = ids[index_quotient(i, I)];
    if (lane == 0 && e >= 0 && e < E) act[i] = clamped_swiglu(g, u, limit);
  }
}

// Down, one (column tile, slot) per block, all tiles of all slots at once: a group of kLanes
// lanes per kRows output columns c of slot u (kU of its chunks in flight per lane) writes
// part[u, s, c] = down[e_u] row c · act[u, s]. The walk over the experts in a column's own loop
// (the form before, two experts in flight per group) kept too few loads in flight: 1.34 TB/s on
// the H200 under ncu against 2.5 for gate_up (bench/NOTES.md, 2026-12-02).
template <typename T, bool kVec, int kS, bool kStaged = false, int kLanes = kDownLanes,
          int kRows = kDownRows, int kU = 8, int kMinBlocks = 1>
__global__ void __launch_bounds__(kDownThreads, kMinBlocks)
    moe_down_part_kernel(const float* act, const T* down, const float* scales,
                         const std::int32_t* ids, int P, std::int64_t E, std::int64_t H,
                         std::int64_t I, float* part) {
  wait_for_inputs();  // the ids and act are the kernels' before
  release_dependents();
  const int u = static_cast<int>(blockIdx.y);
  std::int64_t e = 0;
  if (!slot_expert<kS>(ids, P, E, u, e)) return;  // the whole block
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const std::int64_t c0 =
      (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kLanes * kRows;
  const T* rows[kRows];
  const float* xs[kRows];
  const float* scale_rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t c = c0 + r;
    rows[r] = c < H ? down + e * H * I + c * I : nullptr;
    xs[r] = act + u * kS * I;
    scale_rows[r] = scales != nullptr && c < H ? ExpertGrid{H, I}.row(scales, e, c) : nullptr;
  }
  float acc[kRows][kS] = {};
  rows_dot<T, kVec, kS, kRows, kLanes, kU, true, false, kStaged>(
      rows, xs, scale_rows, I, I / WeightChunk<T, kVec>::kN, lane, acc);
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const float v = group_sum<kLanes>(acc[r][s]);
      if (lane == 0 && c0 + r < H) part[(u * kS + s) * H + c0 + r] = v;
    }
}

// y[s, c] = sum over the distinct experts u in ascending id of weight(s, u) * part[u, s, c], for
// those token s routed to: a thread per (s, c).
// y[s, c] = the sum over the slots u (see slot_expert; at 2-4 tokens the distinct experts in
// ascending id) of weight(s, u) * part[u, s, c], for the tokens s routed there: a thread per
// (s, c).
template <int kS>
__global__ void moe_combine_fused_kernel(const float* part, const std::int32_t* ids,
                                         const float* weights, int P, int k, std::int64_t E,
                                         std::int64_t H, float* y) {
  wait_for_inputs();
  release_dependents();
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if constexpr (kS == 1) {
    // Slots are pairs, token t's the k from t * k (P = tokens * k): a thread per (t, column).
    const std::int64_t t = c / H, col = c % H;
    if (t >= P / k) return;
    float out = 0.0f;
    for (int j = t * k; j < (t + 1) * k; ++j)
      if (ids[j] >= 0 && ids[j] < E) out = fmaf(weights[j], part[j * H + col], out);
    y[t * H + col] = out;
  } else {
    __shared__ Routing routing;
    __shared__ float weight[kMaxPairs][kS];  // token s's weight on distinct expert u
    __shared__ unsigned routed[kMaxPairs];   // bit s: token s routed to distinct expert u
    route(ids, P, E, routing);
    for (int u = threadIdx.x; u < routing.count; u += blockDim.x) {
      unsigned bits = 0;
      for (int s = 0; s < kS; ++s) {
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) {
          if (routing.ids[s * k + j] != routing.distinct[u]) continue;
          sum += weights[s * k + j];
          bits |= 1u << s;
        }
        weight[u][s] = sum;
      }
      routed[u] = bits;
    }
    __syncthreads();
    if (c >= H) return;
    float out[kS] = {};
    for (int u = 0; u < routing.count; ++u)
#pragma unroll
      for (int s = 0; s < kS; ++s)
        if ((routed[u] >> s) & 1u) out[s] = fmaf(weight[u][s], part[(u * kS + s) * H + c], out[s]);
#pragma unroll
    for (int s = 0; s < kS; ++s) y[s * H + c] = out[s];
  }
}

// --- the pair path (more than kMaxPairTokens tokens) -------------------------------------------
// The pair path's kernels are the ones this op had before the fused path (a warp per output row,
// two 16-byte loads in flight per lane): measured on the H200 beside the fused path
// (bench/cuda_kernel_bench times them through FLASHSERVE_CUDA_MOE_PAIRS), they are what 2-4
// tokens run now.
// 16 bytes of weights widened to f32.
template <typename T>
struct PairChunk;
template <>
struct PairChunk<float> {
  static constexpr int kN = 4;
  __device__ __forceinline__ static void load(const float* p, float (&f)[kN]) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
};
template <>
struct PairChunk<bf16_bits> {
  static constexpr int kN = 8;
  __device__ __forceinline__ static void load(const bf16_bits* p, float (&f)[kN]) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};

// acc[s] += this lane's share of row · x[s] (x rows `x_stride` floats apart); not yet reduced
// over the warp. kVec: row and x are 16-byte aligned and `in` is a multiple of the chunk.
template <typename T, int kS, bool kVec>
__device__ __forceinline__ void lane_dot(const T* row, const float* x, std::int64_t x_stride,
                                         std::int64_t in, float (&acc)[kS]) {
  const int lane = threadIdx.x % kWarp;
  if constexpr (kVec) {
    constexpr int kN = PairChunk<T>::kN;
#pragma unroll 2
    for (std::int64_t k = lane * kN; k < in; k += kWarp * kN) {
      float w[kN];
      PairChunk<T>::load(row + k, w);
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const float* xs = x + s * x_stride + k;
#pragma unroll
        for (int q = 0; q < kN; q += 4) {
          const float4 xv = *reinterpret_cast<const float4*>(xs + q);
          acc[s] += w[q] * xv.x;
          acc[s] += w[q + 1] * xv.y;
          acc[s] += w[q + 2] * xv.z;
          acc[s] += w[q + 3] * xv.w;
        }
      }
    }
  } else {
    for (std::int64_t k = lane; k < in; k += kWarp) {
      const float w = widen(row[k]);
#pragma unroll
      for (int s = 0; s < kS; ++s) acc[s] += w * x[s * x_stride + k];
    }
  }
}

// act[p, r] = silu(gate_up[e] row r · x[s]) * (gate_up[e] row I + r · x[s]), p = (s, j),
// e = experts[p]; a warp per r. Pairs run along grid.x, row tiles along grid.y.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kGateUpThreads)
    moe_gate_up_kernel(const float* x, const T* gate_up, const std::int32_t* experts,
                       std::int64_t k, std::int64_t E, std::int64_t H, std::int64_t I, float limit,
                       float* act) {
  wait_for_inputs();  // overlapped (cuda_common.h): x/act and the ids are the kernels' before
  release_dependents();
  const std::int64_t p = blockIdx.x;
  const std::int64_t r = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (r >= I) return;
  const std::int64_t e = experts[p];
  float* o = act + p * I + r;
  if (e < 0 || e >= E) {
    if (threadIdx.x % kWarp == 0) *o = 0.0f;
    return;
  }
  const T* w = gate_up + e * (2 * I * H);
  const float* xs = x + (p / k) * H;
  float g[1] = {}, u[1] = {};
  lane_dot<T, 1, kVec>(w + r * H, xs, H, H, g);
  lane_dot<T, 1, kVec>(w + (I + r) * H, xs, H, H, u);
  const float gv = warp_sum(g[0]), uv = warp_sum(u[0]);
  if (threadIdx.x % kWarp == 0) *o = clamped_swiglu(gv, uv, limit);
}

// out[p, c] = down[e] row c · act[p]; a warp per c.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kGateUpThreads)
    moe_down_kernel(const float* act, const T* down, const std::int32_t* experts, std::int64_t E,
                    std::int64_t H, std::int64_t I, float* out) {
  wait_for_inputs();  // overlapped (cuda_common.h): x/act and the ids are the kernels' before
  release_dependents();
  const std::int64_t p = blockIdx.x;
  const std::int64_t c = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (c >= H) return;
  const std::int64_t e = experts[p];
  float* o = out + p * H + c;
  if (e < 0 || e >= E) {
    if (threadIdx.x % kWarp == 0) *o = 0.0f;
    return;
  }
  float acc[1] = {};
  lane_dot<T, 1, kVec>(down + e * (H * I) + c * I, act + p * I, I, I, acc);
  const float v = warp_sum(acc[0]);
  if (threadIdx.x % kWarp == 0) *o = v;
}

// The pair path for block-scaled FP8 experts: the same work split (a warp per output row of a
// pair), the rows read through the GEMV core with their scales.
template <bool kVec>
__global__ void __launch_bounds__(kGateUpThreads)
    moe_gate_up_fp8_kernel(const float* x, const e4m3_bits* gate_up, const float* scales,
                           const std::int32_t* experts, std::int64_t k, std::int64_t E,
                           std::int64_t H, std::int64_t I, float limit, float* act) {
  wait_for_inputs();  // overlapped (cuda_common.h): x/act and the ids are the kernels' before
  release_dependents();
  const std::int64_t p = blockIdx.x;
  const std::int64_t r = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (r >= I) return;
  const std::int64_t e = experts[p];
  float* o = act + p * I + r;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (e < 0 || e >= E) {
    if (lane == 0) *o = 0.0f;
    return;
  }
  const e4m3_bits* w = gate_up + e * (2 * I * H);
  const e4m3_bits* rows[2] = {w + r * H, w + (I + r) * H};
  const float* xs[2] = {x + (p / k) * H, x + (p / k) * H};
  const ExpertGrid g{2 * I, H};
  const float* scale_rows[2] = {g.row(scales, e, r), g.row(scales, e, I + r)};
  float acc[2][1] = {};
  rows_dot<e4m3_bits, kVec, 1, 2, kWarp, 4, true>(rows, xs, scale_rows, H,
                                                  H / WeightChunk<e4m3_bits, kVec>::kN, lane, acc);
  const float gv = warp_sum(acc[0][0]), uv = warp_sum(acc[1][0]);
  if (lane == 0) *o = clamped_swiglu(gv, uv, limit);
}

template <bool kVec>
__global__ void __launch_bounds__(kGateUpThreads)
    moe_down_fp8_kernel(const float* act, const e4m3_bits* down, const float* scales,
                        const std::int32_t* experts, std::int64_t E, std::int64_t H, std::int64_t I,
                        float* out) {
  wait_for_inputs();  // overlapped (cuda_common.h): x/act and the ids are the kernels' before
  release_dependents();
  const std::int64_t p = blockIdx.x;
  const std::int64_t c = (blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (c >= H) return;
  const std::int64_t e = experts[p];
  float* o = out + p * H + c;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (e < 0 || e >= E) {
    if (lane == 0) *o = 0.0f;
    return;
  }
  const e4m3_bits* rows[1] = {down + e * (H * I) + c * I};
  const float* xs[1] = {act + p * I};
  const float* scale_rows[1] = {ExpertGrid{H, I}.row(scales, e, c)};
  float acc[1][1] = {};
  rows_dot<e4m3_bits, kVec, 1, 1, kWarp, 8, true>(rows, xs, scale_rows, I,
                                                  I / WeightChunk<e4m3_bits, kVec>::kN, lane, acc);
  const float v = warp_sum(acc[0][0]);
  if (lane == 0) *o = v;
}

template <typename T>
bool pair_vec_ok(const void* a, const void* b, std::int64_t in) {
  return in % PairChunk<T>::kN == 0 && reinterpret_cast<std::uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(b) % 16 == 0;
}

template <typename T>
void launch_gate_up(const float* x, const T* w, const std::int32_t* experts, std::int64_t P,
                    std::int64_t k, std::int64_t E, std::int64_t H, std::int64_t I, float limit,
                    float* act, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(P), grid_for(I * kWarp, kGateUpThreads));
  if (pair_vec_ok<T>(x, w, H)) {
    launch_overlapped(moe_gate_up_kernel<T, true>, grid, kGateUpThreads, 0, stream, x, w, experts,
                      k, E, H, I, limit, act);
  } else {
    launch_overlapped(moe_gate_up_kernel<T, false>, grid, kGateUpThreads, 0, stream, x, w, experts,
                      k, E, H, I, limit, act);
  }
}

template <typename T>
void launch_down(const float* act, const T* w, const std::int32_t* experts, std::int64_t P,
                 std::int64_t E, std::int64_t H, std::int64_t I, float* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(P), grid_for(H * kWarp, kGateUpThreads));
  if (pair_vec_ok<T>(act, w, I)) {
    launch_overlapped(moe_down_kernel<T, true>, grid, kGateUpThreads, 0, stream, act, w, experts, E,
                      H, I, out);
  } else {
    launch_overlapped(moe_down_kernel<T, false>, grid, kGateUpThreads, 0, stream, act, w, experts,
                      E, H, I, out);
  }
}

template <typename T>
const T* as(const Weight& w) {
  return reinterpret_cast<const T*>(w.data);
}

// Calls f(T{}) with T the element type of w (f32, bf16 or block-scaled e4m3).
template <typename F>
void with_dtype(const Weight& w, F&& f) {
  if (w.block_scaled())
    f(e4m3_bits{});
  else if (w.dtype == DType::kBF16)
    f(bf16_bits{});
  else
    f(float{});
}

const float* scales_of(const Weight& w) {
  return w.block_scaled() ? reinterpret_cast<const float*>(w.scales.data) : nullptr;
}

bool fp8_ok(const Weight& w) {
  return w.dtype == DType::kF8E4M3 && w.block_scaled() &&
         w.scales.format == quant::ScaleFormat::kF32 && w.scales.block_rows == kFp8Block &&
         w.scales.block_cols == kFp8Block;
}

}  // namespace

bool CudaBackend::moe_token_parts(const char* op, const Tensor& x, const Weight& gate_up,
                                  const Weight& down, const Tensor& experts, float swiglu_limit,
                                  Tensor& act, Tensor& part, bool with_down) {
  const auto E = gate_up.shape[0], I = gate_up.shape[1] / 2, H = x.cols(), S = x.rows();
  const auto P = S * experts.cols();
  const auto* ids = experts.data_as<std::int32_t>();
  const int pairs = static_cast<int>(P);
  const int per_token = static_cast<int>(experts.cols());
  // Slots are pairs (kS = 1): one token's, or 2-4 tokens' pairs each reading its token's row.
  constexpr int kS = 1;
  with_dtype(gate_up, [&](auto t) {
    using T = std::remove_cvref_t<decltype(t)>;
    if constexpr (std::is_same_v<T, e4m3_bits>) {
      // One token's FP8 experts, rows of one round, x staged: the streamed items where a
      // multiprocessor holds two blocks of them.
      const auto chunks = H / WeightChunk<T, true>::kN;
      const auto smem = vec_ok<T>(x.data(), gate_up.data, H)
                            ? staged_x_launch_bytes<T, true, kWarp, kS>(chunks)
                            : std::size_t{0};
      const auto kernel = moe_gate_up_fp8_stream_kernel;
      const auto blocks =
          smem != 0 && P == per_token && chunks <= std::int64_t{kWarp} * kFp8StreamLoads &&
                  env_flag_default_on("FLASHSERVE_CUDA_FP8_EXPERT_STREAM")
              ? streamed_grid(reinterpret_cast<const void*>(kernel), kGateUpThreads, smem, P * I, 2)
              : 0u;
      if (blocks != 0) {
        launch_overlapped(kernel, blocks, kGateUpThreads, smem, stream(), x.data(), as<T>(gate_up),
                          scales_of(gate_up), ids, P, E, H, I, swiglu_limit, act.data());
        return;
      }
    }
    const dim3 grid(grid_for(I * kWarp, kGateUpThreads), static_cast<unsigned>(P));
    const bool vec = vec_ok<T>(x.data(), gate_up.data, H);
    auto kernel =
        vec ? moe_gate_up_fused_kernel<T, true, kS> : moe_gate_up_fused_kernel<T, false, kS>;
    std::size_t smem = 0;
    if constexpr (kStagesX<T, true, kWarp, kS>) {
      smem = vec ? staged_x_launch_bytes<T, true, kWarp, kS>(H / WeightChunk<T, true>::kN) : 0;
      // Staged, compiled for 3 blocks a multiprocessor: the FP8 form took 96 registers, 2 blocks
      // an SM and 3 waves of its 800 blocks; at 80 (8 bytes spilled) 2 waves (bench/NOTES.md,
      // session 12: +2.8% on the FP8 step; 4 blocks spilled and gained nothing).
      if (smem) kernel = moe_gate_up_fused_kernel<T, true, kS, true, kGateUpStagedBlocks>;
    }
    launch_overlapped(kernel, grid, kGateUpThreads, smem, stream(), x.data(), as<T>(gate_up),
                      scales_of(gate_up), ids, pairs, per_token, E, H, I, swiglu_limit, act.data());
  });
  if (!launched(op)) return false;
  if (!with_down) return true;
  with_dtype(down, [&](auto t) {
    using T = std::remove_cvref_t<decltype(t)>;
    const auto launch = [&](auto lanes, auto rows, auto loads, auto min_blocks) {
      constexpr int kL = decltype(lanes)::value, kR = decltype(rows)::value,
                    kU = decltype(loads)::value, kM = decltype(min_blocks)::value;
      const dim3 grid(grid_for(H * kL / kR, kDownThreads), static_cast<unsigned>(P));
      const bool vec = vec_ok<T>(act.data(), down.data, I);
      auto kernel = vec ? moe_down_part_kernel<T, true, kS, false, kL, kR, kU, kM>
                        : moe_down_part_kernel<T, false, kS, false, kL, kR, kU, kM>;
      std::size_t smem = 0;
      if constexpr (kStagesX<T, true, kL, kS>) {
        smem = vec ? staged_x_launch_bytes<T, true, kL, kS>(I / WeightChunk<T, true>::kN) : 0;
        if (smem) kernel = moe_down_part_kernel<T, true, kS, true, kL, kR, kU, kM>;
      }
      launch_overlapped(kernel, grid, kDownThreads, smem, stream(), act.data(), as<T>(down),
                        scales_of(down), ids, pairs, E, H, I, part.data());
    };
    // A group of lanes per down row sized to its 16-byte chunks (640 wide: 40 FP8 chunks, 80
    // bf16), 5 loads in flight each, one row a group, compiled for 4 blocks a multiprocessor
    // (64 registers, no spill): 800 blocks in 1.5 waves where 16 lanes with 8 loads in flight
    // (most of them past the row's end for FP8) took 128 registers and 3 waves (bench/NOTES.md,
    // session 12). f32 keeps the 16-lane form.
    using Loads = std::integral_constant<int, 5>;
    using OneRow = std::integral_constant<int, 1>;
    using FourBlocks = std::integral_constant<int, 4>;
    if constexpr (std::is_same_v<T, e4m3_bits>)
      launch(std::integral_constant<int, 8>{}, OneRow{}, Loads{}, FourBlocks{});
    else if constexpr (std::is_same_v<T, bf16_bits>)
      launch(std::integral_constant<int, 16>{}, OneRow{}, Loads{}, FourBlocks{});
    else
      launch(std::integral_constant<int, kDownLanes>{}, std::integral_constant<int, kDownRows>{},
             std::integral_constant<int, 8>{}, std::integral_constant<int, 1>{});
  });
  return launched(op);
}

void CudaBackend::moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                              const Tensor& experts, const Tensor& weights, float swiglu_limit,
                              Tensor& y) {
  constexpr const char* kOp = "moe_experts";
  if (failed() || !on_device(kOp, gate_up, /*packed_ok=*/true) ||
      !on_device(kOp, down, /*packed_ok=*/true) || !on_device(kOp, {&x, &experts, &weights}))
    return;
  if (!check(gate_up.shape.size() == 3 && down.shape.size() == 3, kOp,
             "expert weights must be [E, out, in]"))
    return;
  const auto E = gate_up.shape[0], I = gate_up.shape[1] / 2, H = x.cols(), S = x.rows();
  if (!check(gate_up.shape[2] == H && down.shape[0] == E && down.shape[1] == H &&
                 down.shape[2] == I && gate_up.shape[1] == 2 * I,
             kOp, "gate_up [E, 2I, H] and down [E, H, I] do not match x [S, H]"))
    return;
  if (gate_up.is_packed() || down.is_packed())
    return moe_experts_packed(x, gate_up, down, experts, weights, swiglu_limit, y);
  auto dtype_ok = [](const Weight& w) {
    return (!w.block_scaled() && (w.dtype == DType::kF32 || w.dtype == DType::kBF16)) || fp8_ok(w);
  };
  for (const Weight* w : {&gate_up, &down})
    if (!dtype_ok(*w))
      return fail(unsupported_format("cuda: moe_experts", *w,
                                     "F32, BF16, F8_E4M3 with 128x128 scales and packed experts"));
  const auto k = experts.cols();
  if (!check(experts.dtype() == DType::kI32 && experts.rows() == S &&
                 weights.dtype() == DType::kF32 && weights.rows() == S && weights.cols() == k,
             kOp, "experts must be int32 [S, k] and weights f32 [S, k]"))
    return;
  if (!check(k <= kMaxTopK, kOp, "more than 64 experts per token")) return;
  if (!ensure(y, {S, H})) return;
  if (S == 0 || H == 0) return;
  const auto P = S * k;
  if (P == 0 || I == 0) {
    memory_->zero(y.raw(), y.bytes());
    return;
  }
  const auto* ids = experts.data_as<std::int32_t>();
  // Scratch: the members eagerly, this step's own inside a step graph.
  Tensor& act = scratch(moe_act_);
  Tensor& outp = scratch(moe_out_);
  if (S <= kMaxPairTokens && !env_flag("FLASHSERVE_CUDA_MOE_PAIRS")) {
    // act [pair, I], the down products [pair, H]: the one-token kernels over the S * k pairs.
    if (!ensure(act, {P, I}) || !ensure(outp, {P, H})) return;
    if (walking()) return;
    if (!moe_token_parts(kOp, x, gate_up, down, experts, swiglu_limit, act, outp)) return;
    launch_overlapped(moe_combine_fused_kernel<1>, grid_for(S * H, 256), 256, 0, stream(),
                      outp.data(), ids, weights.data(), static_cast<int>(P), static_cast<int>(k), E,
                      H, y.data());
    launched(kOp);
    return;
  }
  if (!ensure(act, {P, I}) || !ensure(outp, {P, H})) return;
  // The grouped products (cuda_grouped_gemm.h): each expert's weights read once for a tile of up
  // to 64 (or 32) of its pairs, on the tensor cores. FLASHSERVE_CUDA_MOE_PAIRS=1 keeps the pair
  // GEMVs below.
  const auto grouped = gate_up.block_scaled() ? GroupedWeights::kFp8Scaled : GroupedWeights::kBf16;
  const int rows = grouped_tile_rows(P, E);
  if (!env_flag("FLASHSERVE_CUDA_MOE_PAIRS") && gate_up.dtype == down.dtype &&
      gate_up.block_scaled() == down.block_scaled() &&
      (gate_up.block_scaled() || gate_up.dtype == DType::kBF16) &&
      grouped_products_take(grouped, H, I, E, x.data(), gate_up.data, down.data) &&
      grouped_tiles_fit(P, E, rows)) {
    grouped_experts(
        experts, weights, E, rows,
        [&](const std::int32_t* work) {
          return grouped_gate_up(x.data(), k, gate_up.data, scales_of(gate_up), grouped, E, H, I,
                                 swiglu_limit, work, P, rows, act.data(), stream());
        },
        [&](const std::int32_t* work) {
          return grouped_down(act.data(), down.data, scales_of(down), grouped, E, H, I, work, P,
                              rows, outp.data(), stream());
        },
        outp, y);
    return;
  }
  if (walking()) return;
  if (gate_up.block_scaled()) {
    const dim3 grid(static_cast<unsigned>(P), grid_for(I * kWarp, kGateUpThreads));
    if (vec_ok<e4m3_bits>(x.data(), gate_up.data, H))
      launch_overlapped(moe_gate_up_fp8_kernel<true>, grid, kGateUpThreads, 0, stream(), x.data(),
                        as<e4m3_bits>(gate_up), scales_of(gate_up), ids, k, E, H, I, swiglu_limit,
                        act.data());
    else
      launch_overlapped(moe_gate_up_fp8_kernel<false>, grid, kGateUpThreads, 0, stream(), x.data(),
                        as<e4m3_bits>(gate_up), scales_of(gate_up), ids, k, E, H, I, swiglu_limit,
                        act.data());
  } else if (gate_up.dtype == DType::kBF16)
    launch_gate_up(x.data(), as<bf16_bits>(gate_up), ids, P, k, E, H, I, swiglu_limit, act.data(),
                   stream());
  else
    launch_gate_up(x.data(), as<float>(gate_up), ids, P, k, E, H, I, swiglu_limit, act.data(),
                   stream());
  if (!launched(kOp)) return;
  if (down.block_scaled()) {
    const dim3 grid(static_cast<unsigned>(P), grid_for(H * kWarp, kGateUpThreads));
    if (vec_ok<e4m3_bits>(act.data(), down.data, I))
      launch_overlapped(moe_down_fp8_kernel<true>, grid, kGateUpThreads, 0, stream(), act.data(),
                        as<e4m3_bits>(down), scales_of(down), ids, E, H, I, outp.data());
    else
      launch_overlapped(moe_down_fp8_kernel<false>, grid, kGateUpThreads, 0, stream(), act.data(),
                        as<e4m3_bits>(down), scales_of(down), ids, E, H, I, outp.data());
  } else if (down.dtype == DType::kBF16)
    launch_down(act.data(), as<bf16_bits>(down), ids, P, E, H, I, outp.data(), stream());
  else
    launch_down(act.data(), as<float>(down), ids, P, E, H, I, outp.data(), stream());
  if (!launched(kOp)) return;
  launch_overlapped(moe_combine_kernel, dim3(static_cast<unsigned>(S), grid_for(H, 256)), 256, 0,
                    stream(), outp.data(), weights.data(), ids, E, k, H, y.data());
  launched(kOp);
}

void CudaBackend::grouped_experts(const Tensor& experts, const Tensor& weights, std::int64_t E,
                                  int tile_rows, const SortedProduct& gate_up,
                                  const SortedProduct& down, const Tensor& part, Tensor& y) {
  constexpr const char* kOp = "moe_experts";
  const auto S = experts.rows(), k = experts.cols(), P = S * k, H = y.cols();
  const auto* ids = experts.data_as<std::int32_t>();
  Tensor& work = scratch(moe_sort_);
  if (!ensure(work, {grouped_work_words(P, E, tile_rows)}, DType::kI32)) return;
  if (walking()) return;
  auto* w = work.data_as<std::int32_t>();
  if (!launched(kOp, sort_pairs_by_expert(ids, P, E, tile_rows, w, stream()))) return;
  if (!launched(kOp, gate_up(w))) return;
  if (!launched(kOp, down(w))) return;
  launch_overlapped(moe_combine_kernel, dim3(static_cast<unsigned>(S), grid_for(H, 256)), 256, 0,
                    stream(), part.data(), weights.data(), ids, E, k, H, y.data());
  launched(kOp);
}

}  // namespace fs::cuda
