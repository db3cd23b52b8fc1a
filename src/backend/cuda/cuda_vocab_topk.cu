// Top-k of a vocabulary-wide row on the whole GPU (docs/GPU.md "After session 27", item 5). The
// radix select (cuda_select.cu) gives a row one block of one multiprocessor; past 32,768 entries
// it reads the row from memory in each of its passes and walks it a tile of 1,024 entries at a
// time, which is what sampled decoding pays for the top 1,024 of 248,320 logits every token.
// Here the grid narrows the row first and the same select finishes it:
//   1. slice_best_kernel: each warp takes a slice of 256 entries and offers its 8 largest keys
//      (repeats kept: they are entries of the row);
//   2. threshold_kernel: a block a row finds t, the k-th largest of those offers, by bisection on
//      the key's bits. At least k entries of the row are at or above t (the offers are), so every
//      entry of the top k is; a row's long tail of unlikely ids cannot lower t (a minimum of
//      slice maxima would let one such slice admit the whole row);
//   3. filter_kernel: each warp copies its slice's entries at or above t, in index order, to the
//      slice's own list (as long as the slice, so it never overflows);
//   4. gather_kernel: one block joins the lists in slice order into one row of candidates a row,
//      padded with -inf to the longest row's count (a pad ranks below every candidate, or equal
//      and later); a row with more candidates than the registers hold (its entries nearly all
//      equal) takes its whole row instead;
//   5. the radix select over the candidates (cuda_select.cu, the row in registers), then
//      map_kernel takes each pick's index in the row from its list.
// The candidates keep the row's index order and values, so the picks, their order (value
// descending, ties to the lower index) and values are the radix select's over the whole row.
// On by default since session 30 (H100: 33 us for one 248,320-entry row and k 1,024, 48 us for
// four, against the radix select's 621 us, cuda_kernel_bench --sampling);
// FLASHSERVE_CUDA_VOCAB_TOPK=0 keeps the whole-row radix select. nvcc reports discarded
// [[nodiscard]] class values in the headers (see cuda_backend.h).
#pragma nv_diag_suppress 2810

#include "backend/cuda/cuda_vocab_topk.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ranking.cuh"
#include "backend/cuda/cuda_select.h"

namespace fs::cuda {
namespace {

constexpr int kSlice = 256;                  // entries a warp's slice: 8 a lane
constexpr int kPerLane = kSlice / kWarp;     // 8
constexpr int kOffers = 8;                   // keys a slice offers to the threshold
constexpr int kWarpsPerBlock = 8;            // slices a block in kernels 1 and 3
constexpr int kThresholdThreads = 256;       // kernel 2's block
constexpr int kThresholdPer = 32;            // offers a thread holds in kernel 2
constexpr int kGatherThreads = 1024;         // kernel 4's block
constexpr std::int64_t kCandidates = 32768;  // the select's row in registers (1,024 x 32)

// Kernels 1 and 3: a warp a slice of a row (grid: slices / kWarpsPerBlock x rows).
struct WarpSlice {
  int lane;
  std::int64_t slice, row;
};
__device__ __forceinline__ WarpSlice warp_slice() {
  return {static_cast<int>(threadIdx.x % kWarp),
          static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp,
          static_cast<std::int64_t>(blockIdx.y)};
}

// Kernel 1. offers[row][slice][r]: the slice's r-th largest key (0 past its entries).
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp)
    slice_best_kernel(const float* x, std::int64_t cols, std::int64_t slices,
                      std::uint32_t* offers) {
  wait_for_inputs();
  release_dependents();
  const WarpSlice w = warp_slice();
  if (w.slice >= slices) return;
  const float* p = x + w.row * cols;
  std::uint32_t keys[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const std::int64_t c = w.slice * kSlice + j * kWarp + w.lane;
    keys[j] = c < cols ? rank_key(p[c]) : 0u;
  }
  for (int r = 0; r < kOffers; ++r) {
    std::uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) mine = max(mine, keys[j]);
    const std::uint32_t best = __reduce_max_sync(0xffffffffu, mine);
    // One instance leaves: the lowest lane holding it drops its first copy.
    const unsigned holders = __ballot_sync(0xffffffffu, mine == best);
    if (w.lane == __ffs(static_cast<int>(holders)) - 1) {
      bool dropped = false;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        if (!dropped && keys[j] == best) {
          keys[j] = 0;
          dropped = true;
        }
      }
    }
    if (w.lane == 0) offers[(w.row * slices + w.slice) * kOffers + r] = best;
  }
}

// Kernel 2. threshold[row]: the k-th largest of the row's offers (slices * kOffers <=
// kThresholdThreads * kThresholdPer), found bit by bit from the top.
__global__ void __launch_bounds__(kThresholdThreads)
    threshold_kernel(const std::uint32_t* offers, std::int64_t n, std::int64_t k,
                     std::uint32_t* threshold) {
  __shared__ std::uint32_t warp_count[2][kThresholdThreads / kWarp];
  wait_for_inputs();
  release_dependents();
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  const std::uint32_t* p = offers + static_cast<std::int64_t>(blockIdx.x) * n;
  std::uint32_t keys[kThresholdPer];
#pragma unroll
  for (int j = 0; j < kThresholdPer; ++j) {
    const std::int64_t c = static_cast<std::int64_t>(j) * kThresholdThreads + tid;
    keys[j] = c < n ? p[c] : 0u;
  }
  // A step: the keys at or above the candidate, a warp's sum, then every warp's (two arrays in
  // turn, so a step never overwrites counts another thread may still read).
  std::uint32_t t = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const std::uint32_t candidate = t | (1u << bit);
    std::uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kThresholdPer; ++j) mine += keys[j] >= candidate ? 1u : 0u;
    const std::uint32_t in_warp = __reduce_add_sync(0xffffffffu, mine);
    if (lane == 0) warp_count[bit & 1][warp] = in_warp;
    __syncthreads();
    std::uint32_t total = 0;
#pragma unroll
    for (int w = 0; w < kThresholdThreads / kWarp; ++w) total += warp_count[bit & 1][w];
    if (total >= static_cast<std::uint32_t>(k)) t = candidate;
  }
  if (tid == 0) threshold[blockIdx.x] = t;
}

// Kernel 3. The slice's entries whose key is at least the row's threshold, in index order:
// values and indices into the slice's list (kSlice long), their count into counts.
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp)
    filter_kernel(const float* x, std::int64_t cols, std::int64_t slices,
                  const std::uint32_t* threshold, float* list_val, std::int32_t* list_idx,
                  std::int32_t* counts) {
  wait_for_inputs();
  release_dependents();
  const WarpSlice w = warp_slice();
  if (w.slice >= slices) return;
  const float* p = x + w.row * cols;
  const std::uint32_t t = threshold[w.row];
  const std::int64_t at = (w.row * slices + w.slice) * kSlice;
  const unsigned lower = (1u << w.lane) - 1u;
  int kept = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const std::int64_t c = w.slice * kSlice + j * kWarp + w.lane;
    const float v = c < cols ? p[c] : 0.0f;
    const bool keep = c < cols && rank_key(v) >= t;
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (keep) {
      const int pos = kept + __popc(ballot & lower);
      list_val[at + pos] = v;
      list_idx[at + pos] = static_cast<std::int32_t>(c);
    }
    kept += __popc(ballot);
  }
  if (w.lane == 0) counts[w.row * slices + w.slice] = kept;
}

// The exclusive prefix of v over the block's threads in thread order, and the block's total in
// *total. Every thread calls it; `warp_sums` holds kGatherThreads / kWarp values.
__device__ std::uint32_t block_exclusive_scan(std::uint32_t v, std::uint32_t* warp_sums,
                                              std::uint32_t* total) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int warp = static_cast<int>(threadIdx.x / kWarp);
  const std::uint32_t incl = warp_inclusive_scan(v);
  if (lane == kWarp - 1) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const std::uint32_t w = lane < kGatherThreads / kWarp ? warp_sums[lane] : 0u;
    const std::uint32_t wi = warp_inclusive_scan(w);
    if (lane < kGatherThreads / kWarp) warp_sums[lane] = wi - w;  // the warps before it
    if (lane == kWarp - 1) *total = wi;
  }
  __syncthreads();
  const std::uint32_t before = warp_sums[warp] + incl - v;
  __syncthreads();  // warp_sums is the next call's
  return before;
}

// Kernel 4, one block. Each row's lists joined in slice order into cand_val / cand_idx [rows,
// width], padded with -inf (index -1) to width = the longest row's count, written to *width; a
// row past kCandidates takes its whole row (width = cols for every row then).
__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t slices,
                  const float* list_val, const std::int32_t* list_idx, const std::int32_t* counts,
                  float* cand_val, std::int32_t* cand_idx, std::int64_t* width) {
  __shared__ std::uint32_t warp_sums[kGatherThreads / kWarp];
  __shared__ std::uint32_t s_total;
  wait_for_inputs();
  release_dependents();
  const int tid = static_cast<int>(threadIdx.x);
  // Thread i takes the slices [i * per, (i + 1) * per) of a row: its lists start at the sum of
  // the counts before them.
  const std::int64_t per = (slices + kGatherThreads - 1) / kGatherThreads;
  const std::int64_t s0 = tid * per, s1 = min(s0 + per, slices);
  const auto row_sum = [&](std::int64_t r) {
    std::uint32_t sum = 0;
    for (std::int64_t s = s0; s < s1; ++s)
      sum += static_cast<std::uint32_t>(counts[r * slices + s]);
    return sum;
  };
  std::int64_t widest = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::uint32_t total = 0;
    block_exclusive_scan(row_sum(r), warp_sums, &s_total);
    total = s_total;
    widest = max(widest, static_cast<std::int64_t>(total));
    __syncthreads();  // s_total is the next row's
  }
  const bool whole = widest > kCandidates;
  const std::int64_t w = whole ? cols : widest;
  if (tid == 0) *width = w;
  for (std::int64_t r = 0; r < rows; ++r) {
    float* out_v = cand_val + r * w;
    std::int32_t* out_i = cand_idx + r * w;
    if (whole) {
      for (std::int64_t c = tid; c < cols; c += kGatherThreads) {
        out_v[c] = x[r * cols + c];
        out_i[c] = static_cast<std::int32_t>(c);
      }
      continue;
    }
    std::int64_t at = block_exclusive_scan(row_sum(r), warp_sums, &s_total);
    const std::int64_t total = s_total;
    for (std::int64_t s = s0; s < s1; ++s) {
      const std::int32_t n = counts[r * slices + s];
      const std::int64_t from = (r * slices + s) * kSlice;
      for (std::int32_t i = 0; i < n; ++i) {
        out_v[at + i] = list_val[from + i];
        out_i[at + i] = list_idx[from + i];
      }
      at += n;
    }
    for (std::int64_t c = total + tid; c < w; c += kGatherThreads) {
      out_v[c] = -INFINITY;
      out_i[c] = -1;
    }
    __syncthreads();  // s_total is the next row's
  }
}

// Kernel 6. idx[row][j] <- the row index of candidate idx[row][j].
__global__ void map_kernel(std::int32_t* idx, std::int64_t rows, std::int64_t k,
                           const std::int32_t* cand_idx, const std::int64_t* width) {
  wait_for_inputs();
  release_dependents();
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * k) return;
  const std::int64_t r = i / k;
  const std::int32_t c = idx[i];
  idx[i] = c < 0 ? -1 : cand_idx[r * *width + c];
}

}  // namespace

bool vocab_topk_fits(std::int64_t rows, std::int64_t cols, std::int64_t k) {
  const std::int64_t slices = (cols + kSlice - 1) / kSlice;
  // Past 32,768 entries (where the radix select leaves its registers), offers for at least
  // twice k (so that t is the median offer or above, not a tail slice's), and what kernel 2
  // holds (up to 262,144 entries: Qwen's 248,320, GLM 5's and DeepSeek V4's vocabularies).
  return rows >= 1 && rows <= 8 && k >= 1 && k <= 1024 && cols > kCandidates &&
         slices * kOffers >= 2 * k &&
         slices * kOffers <= std::int64_t{kThresholdThreads} * kThresholdPer;
}

VocabTopkScratch vocab_topk_scratch(std::int64_t rows, std::int64_t cols) {
  const std::int64_t slices = (cols + kSlice - 1) / kSlice;
  return {.offers = rows * slices * kOffers,
          .thresholds = rows,
          .list = rows * slices * kSlice,
          .counts = rows * slices,
          .candidates = rows * cols};
}

void launch_vocab_topk(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t k,
                       const VocabTopkBuffers& b, std::int32_t* idx, float* val,
                       cudaStream_t stream) {
  const std::int64_t slices = (cols + kSlice - 1) / kSlice;
  const dim3 slice_grid(static_cast<unsigned>((slices + kWarpsPerBlock - 1) / kWarpsPerBlock),
                        static_cast<unsigned>(rows));
  launch_overlapped(slice_best_kernel, slice_grid, kWarpsPerBlock * kWarp, 0, stream, x, cols,
                    slices, b.offers);
  launch_overlapped(threshold_kernel, dim3(static_cast<unsigned>(rows)), kThresholdThreads, 0,
                    stream, b.offers, slices * kOffers, k, b.thresholds);
  launch_overlapped(filter_kernel, slice_grid, kWarpsPerBlock * kWarp, 0, stream, x, cols, slices,
                    b.thresholds, b.list_val, b.list_idx, b.counts);
  launch_overlapped(gather_kernel, 1, kGatherThreads, 0, stream, x, rows, cols, slices, b.list_val,
                    b.list_idx, b.counts, b.cand_val, b.cand_idx, b.width);
  // The select sized for the registers; a whole-row fallback is longer and reads its row in
  // each pass, as the radix select always did past them.
  launch_radix_topk(b.cand_val, rows, kCandidates, StepScalar{b.width, 0}, k, StepScalar{}, 0, idx,
                    val, stream);
  launch_overlapped(map_kernel, grid_for(rows * k, 256), 256, 0, stream, idx, rows, k, b.cand_idx,
                    b.width);
}

}  // namespace fs::cuda
