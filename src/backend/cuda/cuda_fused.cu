// The fused decode ops (backend.h "fused decode ops"): a decode step's per-layer op sequences in
// fewer kernels. The products go through the GEMV core (cuda_gemv.cuh), and the epilogues apply
// the fp32 operations of the unfused sequence in its order, with no fused multiply-adds between
// what were separate ops. With the lanes per row `linear` picks (a row's sum depends on nothing
// else) that is the unfused CUDA sequence bit for bit; the exceptions are a product of few long
// rows, which takes a block per row and sums in another order, and the hyper-connection read,
// whose first product folds the norm in (within rounding of the unfused sequence). Shapes the fused
// kernels do not take (more than kFusedRows rows: prefill; widths that are not whole 16-byte
// chunks; mixed weight dtypes) run the unfused sequence (Backend's default body).
//
//  - multi_gemv: several weights over one x in one grid (a row index space over up to four
//    segments), each segment with its own epilogue: scale, bias, activation, a per-column factor,
//    a per-token sigmoid gate, accumulation into y.
//  - hyper_connection_read: two kernels. A block per row of mix_down and inject computes the
//    row's products with the normalised streams, the norm folded in (hc_down_kernel), with their
//    epilogues; then the stream mix as a GEMV over mix_up whose thread group takes the four rows
//    of one output column (one per stream) and finishes the norm, sigmoid, product and mean.
//  - gated_delta_net_in_proj: one multi_gemv over qkv, z, b and a with the gate epilogues.
//  - qsa_projections: one multi_gemv over QSA's q, k, v and indexer projections (biases in the
//    epilogue, as add_bias after linear adds them).
//  - gated_delta_net_conv: one kernel, a block per q/k head (or per chunk of v channels) looping
//    over the tokens: conv, silu, the head's l2 norm and the q scale, then the tail update.
//  - gated_delta_net_in_proj_conv (a decode step's): gated_delta_net_in_proj's multi_gemv with
//    the conv and silu as the qkv rows' epilogue (ConvTail). Its partner gated_delta_net_core
//    (the q/k norms, the recurrence, the gated norm) is in cuda_sequence.cu, by the recurrence.
//  - shared_expert: gate and up rows of each intermediate unit in one thread group (swiglu in its
//    epilogue, the scalar gate as one more unit), then the down GEMV adding gate * out into y.
//    Block-scaled FP8 gate/up/down (beside a float expert gate) take the same two kernels.
//
// Nothing here synchronises or allocates outside the pool: scratch is pooled Tensors local to the
// op (inside a step they come from the graph's arena), and each op returns before queueing when
// a replay walks it (docs/GPU.md, rules for new CUDA ops), so every kernel records and replays.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_epilogue.cuh"
#include "backend/cuda/cuda_fused_segments.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_packed.cuh"
#include "backend/cuda/cuda_shared_expert.cuh"
#include "backend/cuda/cuda_switches.h"
#include "backend/cuda/cuda_weight_checks.cuh"

namespace fs::cuda {
namespace {

// How a multi_gemv treats ConvTail segments: not at all, the conv after the wait, or its values
// read before the wait (ConvAhead).
constexpr int kNoConv = 0, kConvAfter = 1, kConvAhead = 2;

// A channel's conv weights and tail read before the kernel's wait (K <= kConvAheadK), beside its
// first weight loads, so the conv adds no DRAM round trip after the product. Safe for the tail:
// its last writer is this op in the step before, which finished before the kernel before this
// one could stop waiting (the rule of cuda_common.h); read through L2 (__ldcg).
constexpr int kConvAheadK = 4;
struct ConvAhead {
  float w[kConvAheadK] = {};
  float tail[kConvAheadK - 1] = {};
  bool read = false;
  __device__ __forceinline__ void fetch(const ConvTail& c, std::int64_t C, std::int64_t r) {
    if (c.tail == nullptr || c.K > kConvAheadK) return;
#pragma unroll
    for (int j = 0; j < kConvAheadK; ++j) {
      if (j < c.K) w[j] = c.weight(r, j);
      if (j < c.K - 1) tail[j] = __ldcg(c.tail + j * C + r);
    }
    read = true;
  }
  // ConvTail::apply's arithmetic from the values read ahead.
  __device__ __forceinline__ float apply(const ConvTail& c, std::int64_t C, std::int64_t r,
                                         float x) const {
    if (!read) return c.apply(C, r, x);
    const int L = c.K - 1;
    float acc = 0;
#pragma unroll
    for (int j = 0; j < kConvAheadK; ++j)
      if (j < c.K) acc = mul_add(w[j], j < L ? tail[j] : x, acc);
#pragma unroll
    for (int j = 0; j < kConvAheadK - 1; ++j)
      if (j < L) c.tail[j * C + r] = j + 1 < L ? tail[j + 1] : x;
    return apply_act(acc, Activation::kSilu);
  }
};

// The sum of v over the kG lanes of this thread's group, in lane 0 of the group (kG <= 32: every
// lane). kG = kGemvThreads is the whole block: warp sums, then the warps in order. Every thread
// of the block calls it.
template <int kG>
__device__ __forceinline__ float lanes_sum(float v) {
  if constexpr (kG <= kWarp) {
    return group_sum<kG>(v);
  } else {
    static_assert(kG == kGemvThreads, "a group is at most a warp, or the whole block");
    __shared__ float part[kG / kWarp];
    v = group_sum<kWarp>(v);
    if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = v;
    __syncthreads();
    float total = 0;
    if (threadIdx.x == 0)
      for (int i = 0; i < kG / kWarp; ++i) total += part[i];
    __syncthreads();  // part is reused by the next call
    return total;
  }
}

// y_seg[s, r] = finish(W_seg[r] · x[s]) over the rows of every segment: a group of kG lanes per
// kR consecutive rows of the joint index space (a group's rows may lie in different segments).
template <int kR>
inline constexpr int kMultiChunksInFlight = kR == 1 ? 8 : (kR == 2 ? 4 : 2);

// kConv: one token, and a segment may carry the GatedDeltaNet conv (ConvTail); at kConvAhead its
// weights and tail are read before the wait (ConvAhead), which costs the kernel ~10 registers.
template <typename T, int kS, int kR, int kG, int kU = kMultiChunksInFlight<kR>,
          bool kStaged = false, int kConv = kNoConv>
__global__ void __launch_bounds__(kGemvThreads)
    multi_gemv_kernel(const float* x, const Segments segs, std::int64_t in) {
  const std::int64_t group =
      (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const T* rows[kR];
  const float* xs[kR];
  const float* scale_rows[kR];
  int seg[kR];
  std::int64_t local[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const std::int64_t g = group * kR + r;
    int i = 0;
    std::int64_t base = 0;
    while (i < segs.count && g >= base + segs.s[i].rows) base += segs.s[i++].rows;
    seg[r] = i;
    local[r] = g - base;
    rows[r] = i < segs.count ? static_cast<const T*>(segs.s[i].w) + local[r] * in : nullptr;
    xs[r] = x;
    scale_rows[r] = i < segs.count && segs.s[i].scales != nullptr
                        ? segs.s[i].scales + (local[r] / kFp8Block) * segs.s[i].grid_cols
                        : nullptr;
  }
  float acc[kR][kS] = {};
  static_assert(kConv == kNoConv || kS == 1, "the conv epilogue takes one token");
  [[maybe_unused]] ConvAhead conv[kConv == kConvAhead ? kR : 1];
  if constexpr (kConv == kConvAhead) {
#pragma unroll
    for (int r = 0; r < kR; ++r)
      if (lane == 0 && rows[r] != nullptr)
        conv[r].fetch(segs.s[seg[r]].conv, segs.s[seg[r]].rows, local[r]);
  }
  // Weights (and the conv's values) only before the wait (inside rows_dot); x, the epilogue's
  // inputs and y after it.
  rows_dot<T, true, kS, kR, kG, kU, true, true, kStaged>(rows, xs, scale_rows, in,
                                                         in / WeightChunk<T, true>::kN, lane, acc);
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const float v = lanes_sum<kG>(acc[r][s]);
      if (lane == 0 && rows[r] != nullptr) {
        const Segment& sg = segs.s[seg[r]];
        float* y = sg.y + s * sg.rows + local[r];
        const float out = finish(sg.ep, v, local[r], s, sg.ep.accumulate ? *y : 0.0f);
        if constexpr (kConv == kConvAfter) {
          *y = sg.conv.tail != nullptr ? sg.conv.apply(sg.rows, local[r], out) : out;
        } else if constexpr (kConv == kConvAhead) {
          *y = sg.conv.tail != nullptr ? conv[r].apply(sg.conv, sg.rows, local[r], out) : out;
        } else {
          *y = out;
        }
      }
    }
}

template <typename T, int kS, int kR, int kG, int kU = kMultiChunksInFlight<kR>,
          int kConv = kNoConv>
void launch_multi_gemv(const float* x, const Segments& segs, std::int64_t in, cudaStream_t stream) {
  const auto groups = (segs.total + kR - 1) / kR;
  auto kernel = multi_gemv_kernel<T, kS, kR, kG, kU, false, kConv>;
  std::size_t smem = 0;
  if constexpr (kStagesX<T, true, kG, kS>) {
    smem = staged_x_launch_bytes<T, true, kG, kS>(in / WeightChunk<T, true>::kN);
    if (smem) kernel = multi_gemv_kernel<T, kS, kR, kG, kU, true, kConv>;
  }
  launch_overlapped(kernel, grid_for(groups * kG, kGemvThreads), kGemvThreads, smem, stream, x,
                    segs, in);
}

template <typename T, int kS, int kConv = kNoConv>
void multi_gemv_rows(const float* x, const Segments& segs, std::int64_t in, cudaStream_t stream) {
  constexpr int kWide = kS == 1 ? 1 : (kS == 2 ? 2 : 4);
  const auto chunks = in / WeightChunk<T, true>::kN;
  const bool short_rows = gemv_short_rows(chunks);
  const bool many_rows = segs.total >= kManyRows;
  // Few long rows (the hyper-connection's 324 rows of 10240): a warp per row leaves most of the
  // GPU idle with too few loads in flight, so a block takes each row (its sum in another order
  // than linear's: these products are not bit-identical to the unfused sequence).
  constexpr std::int64_t kFewRows = 1024;
  if (segs.total < kFewRows && chunks >= 4 * kGemvThreads) {
    launch_multi_gemv<T, kS, 1, kGemvThreads, kMultiChunksInFlight<1>, kConv>(x, segs, in, stream);
    return;
  }
  // As linear's FP8 GEMV: 160-chunk rows take two a warp, all ten chunks in flight.
  if constexpr (kS == 1 && WeightChunk<T, true>::kDeferredScale) {
    if (!short_rows && many_rows && chunks <= 5 * kWarp) {
      launch_multi_gemv<T, 1, 2, kWarp, 5, kConv>(x, segs, in, stream);
      return;
    }
  }
  if (short_rows) {
    if (many_rows)
      launch_multi_gemv<T, kS, kWide, 8, kMultiChunksInFlight<kWide>, kConv>(x, segs, in, stream);
    else
      launch_multi_gemv<T, kS, 1, 8, kMultiChunksInFlight<1>, kConv>(x, segs, in, stream);
  } else {
    if (many_rows)
      launch_multi_gemv<T, kS, kWide, kWarp, kMultiChunksInFlight<kWide>, kConv>(x, segs, in,
                                                                                 stream);
    else
      launch_multi_gemv<T, kS, 1, kWarp, kMultiChunksInFlight<1>, kConv>(x, segs, in, stream);
  }
}

constexpr int kMixStreams = 4;

// The hyper-connection read's first product with its norm folded in, kR rows a block of the joint
// (mix_down, inject) index space: for token s and stream group k (W columns each) the block sums
// a_k = W_row[kW:(k+1)W] · (h[s] * (1 + nw)) for each of its rows and ss_k = sum of h[s]^2 (in
// double) over the chunks it reads anyway, then row · xn = sum over k of inv_k * a_k with inv_k =
// 1/sqrt(ss_k/W + eps), the rms_norm's scale (every block computes the same inv; the block of row
// 0 writes it for the stream mix). Reassociated against product-after-norm: within rounding of it,
// not the same bits.
// Thread t takes chunks t, t + 256, ... of every row of its block, kU a round, and sums each
// row's chunks in that order whatever kR and kU are, so a row's bits do not depend on the form
// (CudaHyperConnection.EveryFormOfTheFirstKernelGivesTheSameBits).
// Rows a block (session 20): each block reads all of h (S x 40 KB) and the norm weight (40 KB)
// through L2 beside its 20 KB row of weights, so at a row a block the 324 blocks pulled ~32 MB
// from L2 for 6.6 MB from DRAM at one token and ~71 MB at four (hc_down 5.7 / 18.6 us alone,
// cuda_kernel_bench --hc, session 19): bound by L2, not DRAM. kR rows a block divide that by kR.
// The one-row forms stay for the A/B: session 19's (3 blocks a multiprocessor, 3 chunks a round at
// 2 tokens, 2 at 3-4: one wave) and the one before it (FLASHSERVE_CUDA_OLD_HC_DOWN=1 with
// FLASHSERVE_CUDA_HC_DOWN_ROWS=1: 2 blocks a multiprocessor at 2-4 tokens, two waves).
// Row `row` of the read's joint (mix_down, inject) index space: its weights (null past the end),
// segment and index in it.
template <typename T>
__device__ __forceinline__ const T* joint_row(const Segments& segs, std::int64_t row,
                                              std::int64_t in, int& seg, std::int64_t& local) {
  int i = 0;
  std::int64_t base = 0;
  while (i + 1 < segs.count && row >= base + segs.s[i].rows) base += segs.s[i++].rows;
  seg = i;
  local = row - base;
  return row < segs.total ? static_cast<const T*>(segs.s[i].w) + local * in : nullptr;
}

// Chunk c of the first kernel's rows: d[r][s] = row r's chunk · (h[s]'s chunk * (1 + nw's)), the
// products in column order, and q2[s] = the sum of h[s]'s chunk squared in double.
template <typename T, int kS, int kR>
__device__ __forceinline__ void hc_chunk(const typename WeightChunk<T, true>::Raw (&raw)[kR],
                                         const float* h, const float* nw, std::int64_t in,
                                         std::int64_t c, float (&d)[kR][kS], double (&q2)[kS]) {
  using C = WeightChunk<T, true>;
  constexpr int kN = C::kN;
  float scale[kN];
  load_x<kN>(nw + c * kN, scale);
#pragma unroll
  for (int q = 0; q < kN; ++q) scale[q] = 1.0f + scale[q];
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    float xv[kN];
    load_x<kN>(h + s * in + c * kN, xv);
    q2[s] = 0;
#pragma unroll
    for (int q = 0; q < kN; ++q) q2[s] += static_cast<double>(xv[q]) * xv[q];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float wv[kN];
      C::widen(raw[r], wv);
      d[r][s] = 0;
#pragma unroll
      for (int q = 0; q < kN; ++q) d[r][s] = fmaf(wv[q], xv[q] * scale[q], d[r][s]);
    }
  }
}

// A thread's chunks c_first, c_first + kGemvThreads, ... below `end` of the rows w (null: none),
// kU a round, the first round's weight loads before the wait (no kernel writes W; h, nw and the
// outputs are touched after it): each chunk's hc_chunk goes to add(c, d, q2) in chunk order. Every
// thread returns having waited once (one with no chunk at the end).
template <typename T, int kS, int kR, int kU, typename Add>
__device__ __forceinline__ void hc_walk(const T* const (&w)[kR], const float* h, const float* nw,
                                        std::int64_t in, std::int64_t c_first, std::int64_t end,
                                        const Add& add) {
  using C = WeightChunk<T, true>;
  for (std::int64_t c0 = c_first; c0 < end; c0 += static_cast<std::int64_t>(kGemvThreads) * kU) {
    typename C::Raw raw[kU][kR];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kGemvThreads;
#pragma unroll
      for (int r = 0; r < kR; ++r)
        raw[u][r] = c < end && w[r] != nullptr ? C::load(w[r] + c * C::kN) : typename C::Raw{};
    }
    if (c0 == c_first) {
      wait_for_inputs();
      release_dependents();
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(u) * kGemvThreads;
      if (c >= end) break;
      float d[kR][kS];
      double q2[kS];
      hc_chunk<T, kS, kR>(raw[u], h, nw, in, c, d, q2);
      add(c, d, q2);
    }
  }
  if (c_first >= end) {
    wait_for_inputs();
    release_dependents();
  }
}

template <typename T, int kS, int kR, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks)
    hc_down_kernel(const float* h, const float* nw, const Segments segs, std::int64_t in,
                   std::int64_t W, float eps, float* inv_out) {
  using C = WeightChunk<T, true>;
  constexpr int kN = C::kN;
  constexpr int kWarps = kGemvThreads / kWarp;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kR;
  const T* w[kR];
  int seg[kR];
  std::int64_t local[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) w[r] = joint_row<T>(segs, first + r, in, seg[r], local[r]);
  const std::int64_t chunks = in / kN, per_group = W / kN;
  float acc[kR][kMixStreams][kS] = {};
  double ss[kMixStreams][kS] = {};
  // Chunk c lies in stream group g: its sums go to that stream's accumulators.
  const auto add = [&](std::int64_t c, const float(&d)[kR][kS], const double(&q2)[kS]) {
    const int g = static_cast<int>(index_quotient(c, per_group));
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int k = 0; k < kMixStreams; ++k)
          if (k == g) acc[r][k][s] += d[r][s];
#pragma unroll
      for (int k = 0; k < kMixStreams; ++k)
        if (k == g) ss[k][s] += q2[s];
    }
  };
  hc_walk<T, kS, kR, kU>(w, h, nw, in, threadIdx.x, chunks, add);
  __shared__ float part_a[kWarps][kR * kMixStreams * kS];
  __shared__ double part_ss[kWarps][kMixStreams * kS];
  const int lane = static_cast<int>(threadIdx.x % kWarp),
            warp = static_cast<int>(threadIdx.x / kWarp);
#pragma unroll
  for (int k = 0; k < kMixStreams; ++k)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const float a = warp_sum(acc[r][k][s]);
        if (lane == 0) part_a[warp][(r * kMixStreams + k) * kS + s] = a;
      }
      const double b = warp_sum(ss[k][s]);
      if (lane == 0) part_ss[warp][k * kS + s] = b;
    }
  __syncthreads();
  // The sums over the warps, in warp order, a thread each: stream k's inv for token s (threads
  // k + kMixStreams * s of warp 0) and row r's a_k for token s (warps 1-2); then thread s + kS * r
  // adds its row's terms in stream order. The same operations in the same order as one thread a
  // row doing all of them (before session 35), so the same bits, with the four streams' double
  // division and square root side by side instead of in one thread's chain.
  constexpr int kInvs = kMixStreams * kS, kAs = kR * kMixStreams * kS;
  static_assert(kInvs <= kWarp && kWarp + kAs <= kGemvThreads);
  __shared__ float inv_k[kInvs];
  __shared__ float a_k[kAs];
  const int t = static_cast<int>(threadIdx.x);
  if (t < kInvs) {
    const int k = t % kMixStreams, s = t / kMixStreams;
    double b = 0;
    for (int wi = 0; wi < kWarps; ++wi) b += part_ss[wi][k * kS + s];
    inv_k[k * kS + s] = static_cast<float>(1.0 / sqrt(b / static_cast<double>(W) + eps));
  } else if (t >= kWarp && t < kWarp + kAs) {
    const int i = t - kWarp;  // (r * kMixStreams + k) * kS + s
    float a = 0;
    for (int wi = 0; wi < kWarps; ++wi) a += part_a[wi][i];
    a_k[i] = a;
  }
  __syncthreads();
  if (t >= kS * kR) return;
  const int s = t % kS, r = t / kS;
  if (w[r] == nullptr) return;
  float v = 0;
  for (int k = 0; k < kMixStreams; ++k) {
    const float inv = inv_k[k * kS + s];
    if (first + r == 0) inv_out[s * kMixStreams + k] = inv;
    v = __fadd_rn(v, __fmul_rn(inv, a_k[(r * kMixStreams + k) * kS + s]));
  }
  const Segment& sg = segs.s[seg[r]];
  float* y = sg.y + s * sg.rows + local[r];
  *y = finish(sg.ep, v, local[r], s, sg.ep.accumulate ? *y : 0.0f);
}

// The first kernel split by stream (session 36, the default at one token, hc_split_bytes;
// FLASHSERVE_CUDA_HC_SPLIT=0 gives back hc_down_kernel): block (b, k) takes kR rows and
// stream k's W columns only, so the grid has four times the blocks and each thread a quarter of
// the chain (ncu in session 35: hc_down_kernel's 108 blocks, one a multiprocessor, issued on 24%
// of a scheduler's cycles). Thread t sums the chunks t + 256 j that fall in stream k, j ascending:
// exactly the chunks, in the order, that hc_down_kernel's thread t adds into its stream-k
// accumulators, and the warps are summed in the same order, so a_k and inv_k are its bits. The
// block writes a_k to parts [S, rows, 4] and (blocks of row group 0) inv_k; the sum over k and the
// epilogue, hc_down_kernel's last step, move into the stream mix (stream_mix_split_kernel), which
// needs all of u anyway.
// Four blocks a multiprocessor (at most 64 registers): the 432 blocks of the Qwen shapes in one
// wave.
template <typename T, int kS, int kR, int kU>
__global__ void __launch_bounds__(kGemvThreads, 4)
    hc_parts_kernel(const float* h, const float* nw, const Segments segs, std::int64_t in,
                    std::int64_t W, float eps, float* parts, float* inv_out) {
  using C = WeightChunk<T, true>;
  constexpr int kN = C::kN;
  constexpr int kWarps = kGemvThreads / kWarp;
  const int k = static_cast<int>(blockIdx.y);
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kR;
  const T* w[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    int seg;
    std::int64_t local;
    w[r] = joint_row<T>(segs, first + r, in, seg, local);
  }
  const std::int64_t per_group = W / kN, begin = k * per_group, end = begin + per_group;
  const std::int64_t t = threadIdx.x;
  const std::int64_t c_first =
      t >= begin ? t : t + (begin - t + kGemvThreads - 1) / kGemvThreads * kGemvThreads;
  float acc[kR][kS] = {};
  double ss[kS] = {};
  const auto add = [&](std::int64_t, const float(&d)[kR][kS], const double(&q2)[kS]) {
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int r = 0; r < kR; ++r) acc[r][s] += d[r][s];
      ss[s] += q2[s];
    }
  };
  hc_walk<T, kS, kR, kU>(w, h, nw, in, c_first, end, add);
  __shared__ float part_a[kWarps][kR * kS];
  __shared__ double part_ss[kWarps][kS];
  const int lane = static_cast<int>(threadIdx.x % kWarp),
            warp = static_cast<int>(threadIdx.x / kWarp);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float a = warp_sum(acc[r][s]);
      if (lane == 0) part_a[warp][r * kS + s] = a;
    }
    const double b = warp_sum(ss[s]);
    if (lane == 0) part_ss[warp][s] = b;
  }
  __syncthreads();
  // hc_down_kernel's sums over the warps, in warp order: token s's inv_k (threads s of warp 0,
  // written by the blocks of row group 0) and row r's a_k (warp 1).
  static_assert(kS <= kWarp && kR * kS <= kWarp);
  if (warp == 0 && lane < kS) {
    double b = 0;
    for (int wi = 0; wi < kWarps; ++wi) b += part_ss[wi][lane];
    if (blockIdx.x == 0)
      inv_out[lane * kMixStreams + k] =
          static_cast<float>(1.0 / sqrt(b / static_cast<double>(W) + eps));
  } else if (warp == 1 && lane < kR * kS) {
    const int r = lane / kS, s = lane % kS;
    float a = 0;
    for (int wi = 0; wi < kWarps; ++wi) a += part_a[wi][lane];
    if (first + r < segs.total) parts[(s * segs.total + first + r) * kMixStreams + k] = a;
  }
}

// Rows a block of hc_down_kernel (FLASHSERVE_CUDA_HC_DOWN_ROWS=1..4; kHcDownRows unless set).
inline constexpr int kHcDownRows = 3;
inline int hc_down_rows() {
  const char* v = std::getenv("FLASHSERVE_CUDA_HC_DOWN_ROWS");
  const int r = v != nullptr ? std::atoi(v) : 0;
  return r >= 1 && r <= 4 ? r : kHcDownRows;
}

// Column c's h (kS tokens) and norm weight in each stream. Before a kernel's wait only where h is
// complete when the kernel starts (stream_mix_kernel's kEarly), so through L2 (__ldcg).
template <int kS>
__device__ __forceinline__ void read_column(const float* h, const float* nw, std::int64_t W,
                                            std::int64_t c, float (&hv)[kS][kMixStreams],
                                            float (&nv)[kMixStreams]) {
#pragma unroll
  for (int k = 0; k < kMixStreams; ++k) {
    nv[k] = __ldg(nw + k * W + c);
#pragma unroll
    for (int s = 0; s < kS; ++s) hv[s][k] = __ldcg(h + s * kMixStreams * W + k * W + c);
  }
}

// The mixed value of one column and token: the mean over streams of sigmoid(m_k) * xn_k, xn_k =
// h_k * inv_k * (1 + nw_k) as rms_norm computes it, the sum in stream order (mul then
// stream_mean).
__device__ __forceinline__ float mixed_column(const float (&m)[kMixStreams],
                                              const float (&hk)[kMixStreams],
                                              const float (&nk)[kMixStreams], const float* inv) {
  float sum = 0;
#pragma unroll
  for (int k = 0; k < kMixStreams; ++k) {
    const float xn = __fmul_rn(__fmul_rn(hk[k], inv[k]), 1.0f + nk[k]);
    sum = __fadd_rn(sum, __fmul_rn(apply_act(m[k], Activation::kSigmoid), xn));
  }
  return sum / static_cast<float>(kMixStreams);
}

// The stream mix over mix_up [streams * W, rank] (streams = 4): the group of column c takes rows
// c, W + c, 2W + c, 3W + c and writes out[s, c] = (sum over k of sigmoid(m_k) * xn[s, kW + c]) / 4,
// m_k = up row kW + c · u[s]; the sum in stream order, as mul then stream_mean. xn = h * inv_k *
// (1 + nw) as rms_norm computes it, from hc_down_kernel's inv.
template <typename T, int kS, int kG, bool kEarly = false>
__global__ void __launch_bounds__(kGemvThreads)
    stream_mix_kernel(const float* h, const float* inv, const float* nw, const float* u,
                      const T* up, std::int64_t rank, std::int64_t W, float* out) {
  const std::int64_t c = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  const T* rows[kMixStreams];
  const float* xs[kMixStreams];
#pragma unroll
  for (int k = 0; k < kMixStreams; ++k) {
    rows[k] = c < W ? up + (k * W + c) * rank : nullptr;
    xs[k] = u;
  }
  float acc[kMixStreams][kS] = {};
  // kEarly: lane 0 reads its column's h and nw before the wait, beside the first weight loads,
  // which takes one L2 round trip off the end of the kernel (the sums that need u, then these
  // loads, then the store, was the order). Safe for h because hc_down_kernel, the kernel before
  // this one, releases it only after its own wait for h's writer, so h is complete when this
  // kernel starts (read through L2 with __ldcg: no L1 line of an earlier kernel); nw is a weight.
  // The same values, so the same bits (CudaHyperConnection test). FP8 48 layers: +1.5%, 172.2
  // against 169.6 tok/s over three rounds (bench/NOTES.md, session 17). Staging hc_down's norm
  // weight the same way (cp.async before its wait) was measured too: 1% slower, not kept.
  float hv[kS][kMixStreams] = {}, nv[kMixStreams] = {};
  if (kEarly && lane == 0 && c < W) read_column<kS>(h, nw, W, c, hv, nv);
  // The group count is a quarter of a plain GEMV's over these rows, so each thread keeps more of
  // its rows in flight: rank 320 in bf16 is 5 chunks a lane, all 4 rows' issued at once (before
  // the wait for u, h and inv, inside rows_dot).
  constexpr int kU = 5;
  rows_dot<T, true, kS, kMixStreams, kG, kU, true, true>(
      rows, xs, rank, rank / WeightChunk<T, true>::kN, lane, acc);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    float m[kMixStreams];
#pragma unroll
    for (int k = 0; k < kMixStreams; ++k) m[k] = group_sum<kG>(acc[k][s]);
    if (lane == 0 && c < W) {
      if (!kEarly) read_column<kS>(h, nw, W, c, hv, nv);
      out[s * W + c] = mixed_column(m, hv[s], nv, inv + s * kMixStreams);
    }
  }
}

// The stream mix after hc_parts_kernel (session 36): a warp a column c, its lanes 8k..8k+7 taking
// row kW + c as stream_mix_kernel's 8 lanes take it (chunks lane, lane + 8, ...), so four times the
// warps with a quarter of the loads and sums each, and m_k the same bits (group_sum<8>, then
// shuffled to lane 0). u is not in memory: every block computes all of it first, hc_down_kernel's
// last step (row j's sum over k of inv_k * a_k in stream order, then its segment's epilogue), into
// shared memory in rows_dot's staged layout, after the first weight loads and the wait (one L2
// round trip after the wait, as reading u was); block 0 also writes the inject rows. parts and
// segs are hc_parts_kernel's (mix_down's rank rows, then inject's); rank / 8 >= 8 chunks.
template <typename T, int kS, bool kEarly>
__global__ void __launch_bounds__(kGemvThreads)
    stream_mix_split_kernel(const float* h, const float* inv, const float* nw, const float* parts,
                            const Segments segs, const T* up, std::int64_t rank, std::int64_t W,
                            float* out) {
  constexpr int kG = 8, kN = WeightChunk<T, true>::kN;
  const std::int64_t c = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int wl = static_cast<int>(threadIdx.x % kWarp), k = wl / kG, lane = wl % kG;
  const T* rows[1] = {c < W ? up + (k * W + c) * rank : nullptr};
  const float* xs[1] = {parts};  // unread: rows_dot reads the staged u
  float hv[kS][kMixStreams] = {}, nv[kMixStreams] = {};
  if (kEarly && wl == 0 && c < W) read_column<kS>(h, nw, W, c, hv, nv);
  const auto combine = [&] {
    using L = StagedX<kN, kG>;
    const std::int64_t tw = L::token_words(rank / kN);
    auto* staged = reinterpret_cast<float*>(staged_x);
    for (std::int64_t j = threadIdx.x; j < segs.total; j += blockDim.x) {
      const bool is_u = j < rank;
      if (!is_u && blockIdx.x != 0) break;
      const Segment& sg = segs.s[is_u ? 0 : 1];
      const std::int64_t local = is_u ? j : j - rank;
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const float4 a = __ldcg(reinterpret_cast<const float4*>(parts) + s * segs.total + j);
        const float ak[kMixStreams] = {a.x, a.y, a.z, a.w};
        float v = 0;
#pragma unroll
        for (int q = 0; q < kMixStreams; ++q)
          v = __fadd_rn(v, __fmul_rn(inv[s * kMixStreams + q], ak[q]));
        if (is_u) {
          staged[4 * (s * tw + L::at(j / kN, static_cast<int>(j % kN) / 4)) + j % 4] =
              finish(sg.ep, v, local, s, 0.0f);
        } else {
          float* y = sg.y + s * sg.rows + local;
          *y = finish(sg.ep, v, local, s, sg.ep.accumulate ? *y : 0.0f);
        }
      }
    }
    __syncthreads();
  };
  float acc[1][kS] = {};
  rows_dot<T, true, kS, 1, kG, 5, true, true, true>(rows, xs, rank, rank / kN, lane, acc, combine);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float mine = group_sum<kG>(acc[0][s]);
    float m[kMixStreams];
#pragma unroll
    for (int q = 0; q < kMixStreams; ++q) m[q] = __shfl_sync(0xffffffffu, mine, q * kG);
    if (wl == 0 && c < W) {
      if (!kEarly) read_column<kS>(h, nw, W, c, hv, nv);
      out[s * W + c] = mixed_column(m, hv[s], nv, inv + s * kMixStreams);
    }
  }
}

// The read's two kernels: hc_down_kernel over segs (mix_down, then inject), then the stream mix.
// The stream mix's staged u where the read splits its first kernel by stream
// (FLASHSERVE_CUDA_HC_SPLIT, on unless "0"), or 0 where it does not: one token (the decode step;
// at an MTP verify's 2-4 the split read took 11-23 us against 10-14 unsplit, cuda_kernel_bench
// --hc on an H100, session 36: each 8-lane row group reads the staged u of every token, four
// times the shared-memory reads of the unsplit mix, whose group reads it once for four rows),
// rows of mix_up short enough for 8-lane groups (the stream mix's form at rank 320) and at least
// 8 chunks (every lane reaches rows_dot's staging barrier), and u within the default dynamic
// shared memory.
template <typename T>
std::size_t hc_split_bytes(std::int64_t S, std::int64_t rank) {
  constexpr int kN = WeightChunk<T, true>::kN;
  const auto chunks = rank / kN;
  if (S != 1 || !env_flag_default_on("FLASHSERVE_CUDA_HC_SPLIT") || !gemv_short_rows(chunks) ||
      chunks < 8)
    return 0;
  const auto bytes = static_cast<std::size_t>(S) *
                     static_cast<std::size_t>(StagedX<kN, 8>::token_words(chunks)) * sizeof(float4);
  return bytes <= kMaxStagedXBytes ? bytes : 0;
}

// parts non-null: hc_parts_kernel then the stream mix that finishes it (hc_split_bytes said yes).
template <typename T, int kS>
void launch_hc_read(const float* h, const float* nw, const Segments& segs, const float* u,
                    const T* up, std::int64_t rank, std::int64_t W, float eps, float* inv,
                    float* out, cudaStream_t stream, bool early, float* parts) {
  const auto in = kMixStreams * W;
  if constexpr (kS == 1) {  // hc_split_bytes: one token only
    if (parts != nullptr) {
      const auto split = [&](auto kernel, int rows) {
        const dim3 grid(static_cast<unsigned>((segs.total + rows - 1) / rows), kMixStreams);
        launch_overlapped(kernel, grid, kGemvThreads, 0, stream, h, nw, segs, in, W, eps, parts,
                          inv);
      };
      switch (hc_down_rows()) {
        case 1:
          split(hc_parts_kernel<T, kS, 1, 2>, 1);
          break;
        case 2:
          split(hc_parts_kernel<T, kS, 2, 2>, 2);
          break;
        case 4:
          split(hc_parts_kernel<T, kS, 4, 2>, 4);
          break;
        default:
          split(hc_parts_kernel<T, kS, 3, 2>, 3);
      }
      const auto smem = hc_split_bytes<T>(kS, rank);
      const auto mix = [&](auto kernel) {
        launch_overlapped(kernel, grid_for(W * kWarp, kGemvThreads), kGemvThreads, smem, stream, h,
                          inv, nw, parts, segs, up, rank, W, out);
      };
      early ? mix(stream_mix_split_kernel<T, kS, true>)
            : mix(stream_mix_split_kernel<T, kS, false>);
      return;
    }
  }
  const auto down = [&](auto kernel, int rows) {
    launch_overlapped(kernel, static_cast<unsigned>((segs.total + rows - 1) / rows), kGemvThreads,
                      0, stream, h, nw, segs, in, W, eps, inv);
  };
  // Chunks a round: all five of a thread's 10240 bf16 columns at one token; fewer at 2-4 tokens,
  // where the accumulators take the registers (ptxas -v, session 20: no spills at these).
  switch (hc_down_rows()) {
    case 1:
      if (kS > 1 && env_flag("FLASHSERVE_CUDA_OLD_HC_DOWN"))
        down(hc_down_kernel<T, kS, 1, 5, 1>, 1);
      else
        down(hc_down_kernel < T, kS, 1, kS == 1 ? 5 : (kS == 2 ? 3 : 2), kS == 1 ? 1 : 3 >, 1);
      break;
    case 2:
      down(hc_down_kernel < T, kS, 2, kS == 1 ? 5 : (kS == 2 ? 3 : 2), kS == 1 ? 2 : 2 >, 2);
      break;
    case 4:
      down(hc_down_kernel < T, kS, 4, kS <= 2 ? 5 : 3, 1 >, 4);
      break;
    default:
      down(hc_down_kernel<T, kS, 3, 5, 1>, 3);
  }
  // Blocks of 64 threads: 2,560 columns in groups of 8 lanes make 320 blocks, every SM busy (at
  // 256 threads they were 80).
  constexpr int kMixThreads = 64;
  const auto mix = [&](auto kernel, int lanes) {
    launch_overlapped(kernel, grid_for(W * lanes, kMixThreads), kMixThreads, 0, stream, h, inv, nw,
                      u, up, rank, W, out);
  };
  if (gemv_short_rows(rank / WeightChunk<T, true>::kN)) {
    early ? mix(stream_mix_kernel<T, kS, 8, true>, 8) : mix(stream_mix_kernel<T, kS, 8>, 8);
  } else {
    early ? mix(stream_mix_kernel<T, kS, kWarp, true>, kWarp)
          : mix(stream_mix_kernel<T, kS, kWarp>, kWarp);
  }
}

// The shared expert's gate and up (cuda_shared_expert.cuh), a grid of its own.
template <typename T, int kS, int kG>
__global__ void __launch_bounds__(kGemvThreads)
    shared_gate_up_kernel(const float* x, const T* gate, const T* up, const T* expert_gate,
                          std::int64_t H, std::int64_t I, float* act, float* logit) {
  shared_gate_up_units<T, kS, kG>(x, gate, up, expert_gate, H, I, act, logit, blockIdx.x);
}

template <typename T, int kS>
void launch_shared_gate_up(const float* x, const T* gate, const T* up, const T* expert_gate,
                           std::int64_t H, std::int64_t I, float* act, float* logit,
                           cudaStream_t stream) {
  const auto units = I + 1;
  if (shared_units_short<T>(H)) {
    launch_overlapped(shared_gate_up_kernel<T, kS, 8>, grid_for(units * 8, kGemvThreads),
                      kGemvThreads, 0, stream, x, gate, up, expert_gate, H, I, act, logit);
  } else {
    launch_overlapped(shared_gate_up_kernel<T, kS, kWarp>, grid_for(units * kWarp, kGemvThreads),
                      kGemvThreads, 0, stream, x, gate, up, expert_gate, H, I, act, logit);
  }
}

// The same for FP8 gate and up beside the float expert gate (cuda_shared_expert.cuh).
template <typename TG, int kS, int kG>
__global__ void __launch_bounds__(kGemvThreads)
    shared_gate_up_fp8_kernel(const float* x, const e4m3_bits* gate, const float* gate_scales,
                              const e4m3_bits* up, const float* up_scales, std::int64_t grid_cols,
                              const TG* expert_gate, std::int64_t H, std::int64_t I, float* act,
                              float* logit) {
  shared_gate_up_fp8_units<TG, kS, kG>(x, gate, gate_scales, up, up_scales, grid_cols, expert_gate,
                                       H, I, act, logit, blockIdx.x);
}

template <typename TG, int kS>
void launch_shared_gate_up_fp8(const float* x, const Weight& gate, const Weight& up,
                               const TG* expert_gate, std::int64_t H, std::int64_t I, float* act,
                               float* logit, cudaStream_t stream) {
  const auto units = I + 1;
  const auto* g = reinterpret_cast<const e4m3_bits*>(gate.data);
  const auto* u = reinterpret_cast<const e4m3_bits*>(up.data);
  const auto* gs = reinterpret_cast<const float*>(gate.scales.data);
  const auto* us = reinterpret_cast<const float*>(up.scales.data);
  const auto gc = gate.scales.grid_cols(H);
  if (shared_units_short<e4m3_bits>(H)) {
    shared_gate_up_fp8_kernel<TG, kS, 8>
        <<<grid_for(units * 8, kGemvThreads), kGemvThreads, 0, stream>>>(
            x, g, gs, u, us, gc, expert_gate, H, I, act, logit);
  } else {
    shared_gate_up_fp8_kernel<TG, kS, kWarp>
        <<<grid_for(units * kWarp, kGemvThreads), kGemvThreads, 0, stream>>>(
            x, g, gs, u, us, gc, expert_gate, H, I, act, logit);
  }
}

// The GatedDeltaNet conv over qkv [S, C] with its tail [L = K-1, C], silu, and q/k/v: block b <
// 2 * heads is q head b (then k head b - heads) of head_dim channels, a later block a chunk of
// blockDim.x v channels. Thread t holds channels t, t + blockDim.x, ... of its block, so the l2
// norm's sum of squares is the l2_norm kernel's (same threads, same double block sum).
template <typename T>
__global__ void gdn_conv_kernel(const float* qkv, const T* w, float* tail, std::int64_t S,
                                std::int64_t C, std::int64_t K, std::int64_t key_dim,
                                std::int64_t head_dim, float q_scale, float* q, float* k,
                                float* v) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  __shared__ double red[32];
  const std::int64_t heads = key_dim / head_dim, L = K - 1, value_dim = C - 2 * key_dim;
  const std::int64_t b = blockIdx.x;
  const bool normed = b < 2 * heads;
  const std::int64_t width = normed ? head_dim : blockDim.x;
  const std::int64_t c0 = normed ? b * head_dim : 2 * key_dim + (b - 2 * heads) * width;
  const std::int64_t n = normed ? head_dim : (C - c0 < width ? C - c0 : width);
  for (std::int64_t t = 0; t < S; ++t) {
    double ss = 0;
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const std::int64_t c = c0 + i;
      float acc = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        const std::int64_t r = t + j;
        const float x = r < L ? tail[r * C + c] : qkv[(r - L) * C + c];
        acc = mul_add(widen(w[c * K + j]), x, acc);
      }
      const float y = apply_act(acc, Activation::kSilu);
      if (normed) {
        // Written now, scaled below (by this thread) once the head's norm is known.
        ss += static_cast<double>(y) * y;
        *(c < key_dim ? q + t * key_dim + c : k + t * key_dim + (c - key_dim)) = y;
      } else {
        v[t * value_dim + (c - 2 * key_dim)] = y;
      }
    }
    if (!normed) continue;
    ss = block_sum(ss, red);
    const float inv = static_cast<float>(1.0 / sqrt(ss + 1e-6f));
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const std::int64_t c = c0 + i;
      if (c < key_dim) {
        float* p = q + t * key_dim + c;
        *p = __fmul_rn(__fmul_rn(*p, inv), q_scale);
      } else {
        float* p = k + t * key_dim + (c - key_dim);
        *p = __fmul_rn(*p, inv);
      }
    }
  }
  // The tail becomes the last L rows of tail ++ qkv; each thread moves only its own channels,
  // which only it read above.
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const std::int64_t c = c0 + i;
    for (std::int64_t j = 0; j < L; ++j) {
      const std::int64_t r = S + j;
      tail[j * C + c] = r < L ? tail[r * C + c] : qkv[(r - L) * C + c];
    }
  }
}

int fused_threads(std::int64_t n) {
  return static_cast<int>(std::clamp<std::int64_t>((n + kWarp - 1) / kWarp * kWarp, kWarp, 256));
}

// Adds a segment to segs.
void add_segment(Segments& segs, const void* w, float* y, std::int64_t rows, const Epilogue& ep) {
  segs.s[segs.count++] = Segment{w, y, rows, ep};
  segs.total += rows;
}
// A segment over weight `w` (its scale grid too when block-scaled).
void add_segment(Segments& segs, const Weight& w, float* y, std::int64_t rows, const Epilogue& ep) {
  add_segment(segs, w.data, y, rows, ep);
  if (w.block_scaled()) {
    segs.s[segs.count - 1].scales = reinterpret_cast<const float*>(w.scales.data);
    segs.s[segs.count - 1].grid_cols = w.scales.grid_cols(w.cols());
  }
}

// Queues the multi_gemv of segs over x [S, in] (1 <= S <= kFusedRows, 16-byte rows).
void run_multi_gemv(const Tensor& x, DType dtype, const Segments& segs, cudaStream_t stream) {
  if (segs.total == 0) return;
  with_count<kFusedRows>(x.rows(), [&](auto tokens) {
    constexpr int kS = decltype(tokens)::value;
    if (dtype == DType::kF8E4M3)
      multi_gemv_rows<e4m3_bits, kS>(x.data(), segs, x.cols(), stream);
    else if (dtype == DType::kBF16)
      multi_gemv_rows<bf16_bits, kS>(x.data(), segs, x.cols(), stream);
    else
      multi_gemv_rows<float, kS>(x.data(), segs, x.cols(), stream);
  });
}

// The same for one token whose segments may carry the GatedDeltaNet conv (ConvTail). FP8 reads
// the conv's values before the wait (its kernel keeps two blocks a multiprocessor either way:
// 19.7 against 20.9 us a layer on the H200); bf16 and f32 read them after it, since the ~10
// registers more would take a bf16 kernel from four blocks a multiprocessor to three.
void run_multi_gemv_conv(const Tensor& x, DType dtype, const Segments& segs, cudaStream_t stream) {
  if (dtype == DType::kF8E4M3)
    multi_gemv_rows<e4m3_bits, 1, kConvAhead>(x.data(), segs, x.cols(), stream);
  else if (dtype == DType::kBF16)
    multi_gemv_rows<bf16_bits, 1, kConvAfter>(x.data(), segs, x.cols(), stream);
  else
    multi_gemv_rows<float, 1, kConvAfter>(x.data(), segs, x.cols(), stream);
}

}  // namespace

// --- hyper-connection read -------------------------------------------------------------------

void CudaBackend::hyper_connection_read(const Tensor& h, const Weight& norm, const Weight& mix_down,
                                        const Weight& mix_up, const Weight& inject,
                                        std::int64_t streams, std::int64_t width, float eps,
                                        Tensor& mixed, Tensor* inject_out) {
  constexpr const char* kOp = "hyper_connection_read";
  if (failed() || !on_device(kOp, {&h})) return;
  const auto S = h.shape().empty() ? 0 : h.rows();
  const auto rank = mix_down.rows(), in = h.cols();
  const auto dtype = mix_down.dtype;
  const bool shapes = S >= 1 && S <= kFusedRows && streams == kMixStreams &&
                      in == streams * width && mix_down.cols() == in && matrix_dtype(mix_down) &&
                      mix_up.rows() == in && mix_up.cols() == rank && mix_up.dtype == dtype &&
                      (inject_out == nullptr || (inject.rows() == streams && inject.cols() == in &&
                                                 inject.dtype == dtype)) &&
                      &mixed != &h && inject_out != &h && inject_out != &mixed;
  if (!shapes) {
    Backend::hyper_connection_read(h, norm, mix_down, mix_up, inject, streams, width, eps, mixed,
                                   inject_out);
    return;
  }
  if (!on_device(kOp, mix_down) || !on_device(kOp, mix_up) ||
      (inject_out != nullptr && !on_device(kOp, inject)))
    return;
  // The 16-byte rows: h, mix_down and inject over `in`, u and mix_up over `rank`; chunks never
  // straddle two streams. Pooled tensors and uploaded weights start 16-byte aligned.
  const auto kN = dtype == DType::kBF16 ? 8 : 4;
  const bool vec = width % kN == 0 && norm.dtype == DType::kF32 && norm.numel() == in &&
                   reinterpret_cast<std::uintptr_t>(norm.data) % 16 == 0 &&
                   chunked(dtype, h.data(), {&mix_down, &mix_up}, in) && rank % kN == 0 &&
                   (inject_out == nullptr || chunked(dtype, h.data(), {&inject}, in));
  if (!vec) {
    Backend::hyper_connection_read(h, norm, mix_down, mix_up, inject, streams, width, eps, mixed,
                                   inject_out);
    return;
  }
  if (!on_device(kOp, norm)) return;
  Tensor u, inv;
  if (!ensure(u, {S, rank}) || !ensure(inv, {S, streams}) || !ensure(mixed, {S, width})) return;
  if (inject_out != nullptr && !ensure(*inject_out, {S, streams})) return;
  const float inv_streams = 1.0f / static_cast<float>(streams);
  Segments segs;
  Epilogue down_ep;
  down_ep.scale = inv_streams;
  down_ep.act = Activation::kSilu;
  add_segment(segs, mix_down.data, u.data(), rank, down_ep);
  if (inject_out != nullptr) {
    Epilogue inject_ep;
    inject_ep.scale = inv_streams;
    inject_ep.act = Activation::kSigmoid;
    inject_ep.post = 2.0f;
    add_segment(segs, inject.data, inject_out->data(), streams, inject_ep);
  }
  // Split by stream (hc_parts_kernel), a_k of every row in parts; the default where it applies.
  const bool split = (dtype == DType::kBF16 ? hc_split_bytes<bf16_bits>(S, rank)
                                            : hc_split_bytes<float>(S, rank)) > 0;
  Tensor parts;
  if (split && !ensure(parts, {S, segs.total * streams})) return;
  float* const parts_at = split ? parts.data() : nullptr;
  if (walking()) return;  // a replay: outputs ensured, nothing queued
  // FLASHSERVE_CUDA_HC_PREWAIT=0: the stream mix reads h and nw after its wait, as before session
  // 17 (an A/B in one binary; the same bits either way).
  const bool early = env_flag_default_on("FLASHSERVE_CUDA_HC_PREWAIT");
  with_count<kFusedRows>(S, [&](auto tokens) {
    constexpr int kS = decltype(tokens)::value;
    if (dtype == DType::kBF16)
      launch_hc_read<bf16_bits, kS>(h.data(), norm.f32(), segs, u.data(), as<bf16_bits>(mix_up),
                                    rank, width, eps, inv.data(), mixed.data(), stream(), early,
                                    parts_at);
    else
      launch_hc_read<float, kS>(h.data(), norm.f32(), segs, u.data(), as<float>(mix_up), rank,
                                width, eps, inv.data(), mixed.data(), stream(), early, parts_at);
  });
  launched(kOp);
}

// --- GatedDeltaNet -------------------------------------------------------------------------------

namespace {

// Whether the multi-GEMV takes gated_delta_net_in_proj's weights over x (S tokens, in columns).
bool in_proj_fusable(const Tensor& x, const Weight& w_qkv, const Weight& w_z, const Weight& w_b,
                     const Weight& w_a, const Weight& dt_bias, const Weight& decay_rate) {
  const auto in = x.cols(), heads = w_a.rows();
  return (matrix_dtype(w_qkv) || fp8_matrix(w_qkv)) &&
         chunked(w_qkv.dtype, x.data(), {&w_qkv, &w_z, &w_b, &w_a}, in) && w_qkv.cols() == in &&
         w_z.cols() == in && w_b.cols() == in && w_a.cols() == in && w_b.rows() == heads &&
         dt_bias.dtype == DType::kF32 && dt_bias.numel() == heads &&
         decay_rate.dtype == DType::kF32 && decay_rate.numel() == heads;
}

// The same over packed weights (cuda_fused_packed.cu): the four of one format and width.
// FLASHSERVE_CUDA_PACKED_FUSED=0: the unfused sequence, as before session 34.
bool in_proj_packed(const Tensor& x, const Weight& w_qkv, const Weight& w_z, const Weight& w_b,
                    const Weight& w_a, const Weight& dt_bias, const Weight& decay_rate) {
  const auto heads = w_a.rows();
  return env_flag_default_on("FLASHSERVE_CUDA_PACKED_FUSED") &&
         packed_segments_take(x, {&w_qkv, &w_z, &w_b, &w_a}) && w_b.rows() == heads &&
         dt_bias.dtype == DType::kF32 && dt_bias.numel() == heads &&
         decay_rate.dtype == DType::kF32 && decay_rate.numel() == heads;
}

// The in-projections' four segments: qkv (into `qkv_out`), z, beta = sigmoid(b),
// g = decay_rate * softplus(a + dt_bias).
Segments in_proj_segments(const Weight& w_qkv, const Weight& w_z, const Weight& w_b,
                          const Weight& w_a, const Weight& dt_bias, const Weight& decay_rate,
                          float* qkv_out, Tensor& z, Tensor& beta, Tensor& g) {
  Epilogue beta_ep, g_ep;
  beta_ep.act = Activation::kSigmoid;
  g_ep.bias = dt_bias.f32();
  g_ep.act = Activation::kSoftplus;
  g_ep.col_scale = decay_rate.f32();
  Segments segs;
  add_segment(segs, w_qkv, qkv_out, w_qkv.rows(), Epilogue{});
  add_segment(segs, w_z, z.data(), w_z.rows(), Epilogue{});
  add_segment(segs, w_b, beta.data(), w_b.rows(), beta_ep);
  add_segment(segs, w_a, g.data(), w_a.rows(), g_ep);
  return segs;
}

}  // namespace

void CudaBackend::gated_delta_net_in_proj(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                          const Weight& w_b, const Weight& w_a,
                                          const Weight& dt_bias, const Weight& decay_rate,
                                          Tensor& qkv, Tensor& z, Tensor& beta, Tensor& g) {
  constexpr const char* kOp = "gated_delta_net_in_proj";
  if (failed() || !on_device(kOp, {&x})) return;
  const auto S = x.shape().empty() ? 0 : x.rows(), heads = w_a.rows();
  const bool fused =
      S >= 1 && S <= kFusedRows && in_proj_fusable(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate);
  const bool packed = !fused && S >= 1 && S <= kFusedRows &&
                      in_proj_packed(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate);
  if (!fused && !packed) {
    Backend::gated_delta_net_in_proj(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate, qkv, z, beta, g);
    return;
  }
  for (const Weight* w : {&w_qkv, &w_z, &w_b, &w_a, &dt_bias, &decay_rate})
    if (!on_device(kOp, *w, packed)) return;
  for (Tensor* t : {&qkv, &z, &beta, &g})
    if (!check(t != &x, kOp, "an output may not be x")) return;
  if (!ensure(qkv, {S, w_qkv.rows()}) || !ensure(z, {S, w_z.rows()}) || !ensure(beta, {S, heads}) ||
      !ensure(g, {S, heads}))
    return;
  const Segments segs =
      in_proj_segments(w_qkv, w_z, w_b, w_a, dt_bias, decay_rate, qkv.data(), z, beta, g);
  const std::uint8_t* codebook = nullptr;
  if (packed && w_qkv.storage() == quant::QuantType::kIQ2_XXS && (codebook = iq2_grid()) == nullptr)
    return;
  if (walking()) return;  // a replay: outputs ensured, nothing queued
  if (packed)
    run_packed_multi_gemv(x, {&w_qkv, &w_z, &w_b, &w_a}, segs, codebook, stream());
  else
    run_multi_gemv(x, w_qkv.dtype, segs, stream());
  launched(kOp);
}

// The decode step's in-projections with the conv: gated_delta_net_in_proj's multi-GEMV, its qkv
// rows finished by the conv (ConvTail), so `mixed` is what causal_conv1d and silu make of qkv, and
// qkv itself is never stored. One token: a verify keeps its conv inputs (speculation_window.h) and
// runs the unfused ops.
void CudaBackend::gated_delta_net_in_proj_conv(const Tensor& x, const Weight& w_qkv,
                                               const Weight& w_z, const Weight& w_b,
                                               const Weight& w_a, const Weight& dt_bias,
                                               const Weight& decay_rate, const Weight& conv,
                                               Tensor& tail, Tensor& mixed, Tensor& z, Tensor& beta,
                                               Tensor& g) {
  constexpr const char* kOp = "gated_delta_net_in_proj_conv";
  if (failed() || !on_device(kOp, {&x, &tail})) return;
  const auto S = x.shape().empty() ? 0 : x.rows(), heads = w_a.rows();
  const auto C = w_qkv.rows(), K = conv.cols();
  const bool conv_ok = !env_flag("FLASHSERVE_CUDA_GDN_UNFUSED") && S == 1 && conv.rows() == C &&
                       K >= 1 && K <= 16 && matrix_dtype(conv) && tail.rows() == K - 1 &&
                       tail.cols() == C;
  const bool fused = conv_ok && in_proj_fusable(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate);
  const bool packed =
      conv_ok && !fused && in_proj_packed(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate);
  if (!fused && !packed) {
    Backend::gated_delta_net_in_proj_conv(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate, conv, tail,
                                          mixed, z, beta, g);
    return;
  }
  for (const Weight* w : {&w_qkv, &w_z, &w_b, &w_a, &dt_bias, &decay_rate, &conv})
    if (!on_device(kOp, *w, packed)) return;
  for (Tensor* t : {&mixed, &z, &beta, &g})
    if (!check(t != &x && t != &tail, kOp, "an output may not be x or the tail")) return;
  if (!ensure(mixed, {S, C}) || !ensure(z, {S, w_z.rows()}) || !ensure(beta, {S, heads}) ||
      !ensure(g, {S, heads}))
    return;
  Segments segs =
      in_proj_segments(w_qkv, w_z, w_b, w_a, dt_bias, decay_rate, mixed.data(), z, beta, g);
  segs.s[0].conv =
      ConvTail{conv.data, conv.dtype == DType::kBF16, tail.data(), static_cast<int>(K)};
  const std::uint8_t* codebook = nullptr;
  if (packed && w_qkv.storage() == quant::QuantType::kIQ2_XXS && (codebook = iq2_grid()) == nullptr)
    return;
  if (walking()) return;  // a replay: outputs ensured, nothing queued
  if (packed)
    run_packed_multi_gemv(x, {&w_qkv, &w_z, &w_b, &w_a}, segs, codebook, stream());
  else
    run_multi_gemv_conv(x, w_qkv.dtype, segs, stream());
  launched(kOp);
}

// --- QSA ------------------------------------------------------------------------------------

void CudaBackend::qsa_projections(const Tensor& x, const Weight& q_w, const Weight& k_w,
                                  const Weight& v_w, const Weight& index_w, const Weight& q_bias,
                                  const Weight& k_bias, const Weight& v_bias, Tensor& qg, Tensor& k,
                                  Tensor& v, Tensor& index_qk) {
  constexpr const char* kOp = "qsa_projections";
  if (failed() || !on_device(kOp, {&x})) return;
  const auto S = x.shape().empty() ? 0 : x.rows(), in = x.cols();
  const auto dtype = q_w.dtype;
  // A bias is none, or f32 with one entry per output row.
  const auto bias_ok = [](const Weight& b, const Weight& w) {
    return b.empty() || (b.dtype == DType::kF32 && !b.block_scaled() && b.numel() == w.rows());
  };
  const bool fused = !env_flag("FLASHSERVE_CUDA_QSA_UNFUSED") && S >= 1 && S <= kFusedRows &&
                     (matrix_dtype(q_w) || fp8_matrix(q_w)) &&
                     chunked(dtype, x.data(), {&q_w, &k_w, &v_w, &index_w}, in) &&
                     q_w.cols() == in && k_w.cols() == in && v_w.cols() == in &&
                     index_w.cols() == in && bias_ok(q_bias, q_w) && bias_ok(k_bias, k_w) &&
                     bias_ok(v_bias, v_w);
  // Packed projections of one format (cuda_fused_packed.cu; FLASHSERVE_CUDA_PACKED_FUSED=0: the
  // unfused sequence).
  const bool packed = !fused && !env_flag("FLASHSERVE_CUDA_QSA_UNFUSED") && S >= 1 &&
                      S <= kFusedRows && env_flag_default_on("FLASHSERVE_CUDA_PACKED_FUSED") &&
                      packed_segments_take(x, {&q_w, &k_w, &v_w, &index_w}) &&
                      bias_ok(q_bias, q_w) && bias_ok(k_bias, k_w) && bias_ok(v_bias, v_w);
  if (!fused && !packed) {
    Backend::qsa_projections(x, q_w, k_w, v_w, index_w, q_bias, k_bias, v_bias, qg, k, v, index_qk);
    return;
  }
  for (const Weight* w : {&q_w, &k_w, &v_w, &index_w, &q_bias, &k_bias, &v_bias})
    if (!w->empty() && !on_device(kOp, *w, packed)) return;
  for (Tensor* t : {&qg, &k, &v, &index_qk})
    if (!check(t != &x, kOp, "an output may not be x")) return;
  if (!ensure(qg, {S, q_w.rows()}) || !ensure(k, {S, k_w.rows()}) || !ensure(v, {S, v_w.rows()}) ||
      !ensure(index_qk, {S, index_w.rows()}))
    return;
  const auto with_bias = [](const Weight& b) {
    Epilogue ep;
    ep.bias = b.empty() ? nullptr : b.f32();
    return ep;
  };
  Segments segs;
  add_segment(segs, q_w, qg.data(), q_w.rows(), with_bias(q_bias));
  add_segment(segs, k_w, k.data(), k_w.rows(), with_bias(k_bias));
  add_segment(segs, v_w, v.data(), v_w.rows(), with_bias(v_bias));
  add_segment(segs, index_w, index_qk.data(), index_w.rows(), Epilogue{});
  const std::uint8_t* codebook = nullptr;
  if (packed && q_w.storage() == quant::QuantType::kIQ2_XXS && (codebook = iq2_grid()) == nullptr)
    return;
  if (walking()) return;  // a replay: outputs ensured, nothing queued
  if (packed)
    run_packed_multi_gemv(x, {&q_w, &k_w, &v_w, &index_w}, segs, codebook, stream());
  else
    run_multi_gemv(x, dtype, segs, stream());
  launched(kOp);
}

// --- GatedDeltaNet (continued) ------------------------------------------------------------------

void CudaBackend::gated_delta_net_conv(const Tensor& qkv, const Weight& conv, Tensor& tail,
                                       std::int64_t key_dim, std::int64_t head_dim, Tensor& q,
                                       Tensor& k, Tensor& v) {
  constexpr const char* kOp = "gated_delta_net_conv";
  if (failed() || !on_device(kOp, {&qkv, &tail})) return;
  constexpr std::int64_t kMaxFusedTokens = 64;  // a block walks the tokens one by one
  const auto S = qkv.shape().empty() ? 0 : qkv.rows(), C = qkv.cols(), K = conv.cols();
  const bool fused = S >= 1 && S <= kMaxFusedTokens && head_dim > 0 && key_dim > 0 &&
                     key_dim % head_dim == 0 && 2 * key_dim < C && conv.rows() == C && K >= 1 &&
                     matrix_dtype(conv) && tail.rows() == K - 1 && tail.cols() == C && &q != &qkv &&
                     &k != &qkv && &v != &qkv;
  if (!fused) {
    Backend::gated_delta_net_conv(qkv, conv, tail, key_dim, head_dim, q, k, v);
    return;
  }
  if (!on_device(kOp, conv)) return;
  const auto value_dim = C - 2 * key_dim;
  if (!ensure(q, {S, key_dim}) || !ensure(k, {S, key_dim}) || !ensure(v, {S, value_dim})) return;
  const int threads = fused_threads(head_dim);
  const auto blocks = 2 * (key_dim / head_dim) + (value_dim + threads - 1) / threads;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (walking()) return;  // a replay: outputs ensured, nothing queued
  if (conv.dtype == DType::kBF16) {
    launch_overlapped(gdn_conv_kernel<bf16_bits>, static_cast<unsigned>(blocks), threads, 0,
                      stream(), qkv.data(), as<bf16_bits>(conv), tail.data(), S, C, K, key_dim,
                      head_dim, q_scale, q.data(), k.data(), v.data());
  } else {
    launch_overlapped(gdn_conv_kernel<float>, static_cast<unsigned>(blocks), threads, 0, stream(),
                      qkv.data(), as<float>(conv), tail.data(), S, C, K, key_dim, head_dim, q_scale,
                      q.data(), k.data(), v.data());
  }
  launched(kOp);
}

// --- MoE -----------------------------------------------------------------------------------------

void CudaBackend::shared_expert(const Tensor& x, const Weight& gate, const Weight& up,
                                const Weight& down, const Weight& expert_gate, Tensor& y) {
  constexpr const char* kOp = "shared_expert";
  if (failed() || !on_device(kOp, {&x, &y})) return;
  const auto S = x.shape().empty() ? 0 : x.rows(), H = x.cols(), I = gate.rows();
  const auto dtype = gate.dtype;
  // FP8 (the releases' layout): gate, up and down block-scaled, the expert gate f32 or bf16.
  const bool fp8 = fp8_matrix(gate) && chunked(dtype, x.data(), {&gate, &up}, H) &&
                   matrix_dtype(expert_gate) &&
                   chunked(expert_gate.dtype, x.data(), {&expert_gate}, H) && fp8_matrix(down);
  const bool fused =
      S >= 1 && S <= kFusedRows && (matrix_dtype(gate) || fp8) && gate.cols() == H &&
      up.rows() == I && up.cols() == H && expert_gate.rows() == 1 && expert_gate.cols() == H &&
      down.rows() == y.cols() && down.cols() == I && y.rows() == S && &y != &x &&
      (fp8 || chunked(dtype, x.data(), {&gate, &up, &expert_gate}, H)) && down.dtype == dtype;
  // Packed gate, up and down (the GGUF mixes: gate and up of one format, the down of its own)
  // beside a float expert gate: four kernels instead of the sequence's eight. Gate and up as one
  // packed multi-GEMV, the expert gate's product, swiglu, then the down as a packed GEMV whose
  // epilogue is the sigmoid gate and the accumulation into y (mul_rows then add). Each row's sum
  // is packed linear's (cuda_fused_packed.cu), so the sequence's bits
  // (QuantOps.PackedFusedProjectionsEqualTheSequenceBitForBit).
  if (!fused) {
    const bool packed =
        S >= 1 && S <= kFusedRows && env_flag_default_on("FLASHSERVE_CUDA_PACKED_FUSED") &&
        packed_segments_take(x, {&gate, &up}) && up.rows() == I && down.is_packed() &&
        packed::decodable(down) && down.rows() == y.cols() && down.cols() == I &&
        down.shape.size() == 2 && !expert_gate.is_packed() && expert_gate.rows() == 1 &&
        expert_gate.cols() == H && y.rows() == S && &y != &x;
    if (!packed) {
      Backend::shared_expert(x, gate, up, down, expert_gate, y);
      return;
    }
    for (const Weight* w : {&gate, &up, &down})
      if (!on_device(kOp, *w, /*packed_ok=*/true)) return;
    if (!on_device(kOp, expert_gate)) return;
    Tensor g, u, act, logit;
    if (!ensure(g, {S, I}) || !ensure(u, {S, I})) return;
    const auto codebook = [&](const Weight& w, const std::uint8_t*& grid) {
      return w.storage() != quant::QuantType::kIQ2_XXS || (grid = iq2_grid()) != nullptr;
    };
    const std::uint8_t *gate_grid = nullptr, *down_grid = nullptr;
    if (!codebook(gate, gate_grid) || !codebook(down, down_grid)) return;
    Segments gate_up;
    add_segment(gate_up, gate.data, g.data(), I, Epilogue{});
    add_segment(gate_up, up.data, u.data(), I, Epilogue{});
    if (!walking()) {
      run_packed_multi_gemv(x, {&gate, &up}, gate_up, gate_grid, stream());
      if (!launched(kOp)) return;
    }
    linear(x, expert_gate, logit);
    swiglu(g, u, act);
    if (failed()) return;
    if (!check(packed_segments_take(act, {&down}), kOp, "act must be 16-byte aligned")) return;
    Epilogue down_ep;
    down_ep.token_gate = logit.data();
    down_ep.accumulate = true;
    Segments segs;
    add_segment(segs, down.data, y.data(), down.rows(), down_ep);
    if (walking()) return;  // a replay: outputs ensured, nothing queued
    run_packed_multi_gemv(act, {&down}, segs, down_grid, stream());
    launched(kOp);
    return;
  }
  for (const Weight* w : {&gate, &up, &down, &expert_gate})
    if (!on_device(kOp, *w)) return;
  Tensor act, logit;
  if (!ensure(act, {S, I}) || !ensure(logit, {S, 1})) return;
  if (!chunked(dtype, act.data(), {&down}, I)) {
    Backend::shared_expert(x, gate, up, down, expert_gate, y);
    return;
  }
  if (walking()) return;  // a replay: outputs ensured, nothing queued
  with_count<kFusedRows>(S, [&](auto tokens) {
    constexpr int kS = decltype(tokens)::value;
    if (fp8 && expert_gate.dtype == DType::kBF16)
      launch_shared_gate_up_fp8<bf16_bits, kS>(x.data(), gate, up, as<bf16_bits>(expert_gate), H, I,
                                               act.data(), logit.data(), stream());
    else if (fp8)
      launch_shared_gate_up_fp8<float, kS>(x.data(), gate, up, as<float>(expert_gate), H, I,
                                           act.data(), logit.data(), stream());
    else if (dtype == DType::kBF16)
      launch_shared_gate_up<bf16_bits, kS>(x.data(), as<bf16_bits>(gate), as<bf16_bits>(up),
                                           as<bf16_bits>(expert_gate), H, I, act.data(),
                                           logit.data(), stream());
    else
      launch_shared_gate_up<float, kS>(x.data(), as<float>(gate), as<float>(up),
                                       as<float>(expert_gate), H, I, act.data(), logit.data(),
                                       stream());
  });
  if (!launched(kOp)) return;
  Epilogue down_ep;
  down_ep.token_gate = logit.data();
  down_ep.accumulate = true;
  Segments segs;
  add_segment(segs, down, y.data(), down.rows(), down_ep);
  run_multi_gemv(act, dtype, segs, stream());
  launched(kOp);
}

}  // namespace fs::cuda
