// Top-k by radix select: a block per row finds the k-th largest key over the float bits (four
// 8-bit digit passes with a shared-memory histogram), keeps the entries above it and the
// lowest-indexed entries equal to it (an index-ordered compaction), and sorts those k survivors
// with a bitonic sort in shared memory. The same order as the CPU's topk_row: value descending,
// ties to the lower index.
// nvcc reports discarded [[nodiscard]] class values in the headers (see cuda_backend.h).
#pragma nv_diag_suppress 2810

#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ranking.cuh"
#include "backend/cuda/cuda_select.h"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

constexpr int kSelectMaxThreads = 1024;
constexpr int kSelectMaxWarps = kSelectMaxThreads / kWarp;
constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr std::uint32_t kNoDigit = kBins;  // a lane with no entry to count

// Key in the high half, the index complemented in the low half: descending order of the packed
// value is the ranking (larger key first, then lower index). 0 ranks below every real entry
// (whose low half is at least 2^31), so it pads the sort.
__device__ __forceinline__ std::uint64_t pack(std::uint32_t key, std::int64_t c) {
  return (static_cast<std::uint64_t>(key) << 32) | (0xffffffffu - static_cast<std::uint32_t>(c));
}
__device__ __forceinline__ std::int32_t unpack_index(std::uint64_t packed) {
  return static_cast<std::int32_t>(0xffffffffu - static_cast<std::uint32_t>(packed));
}

// blockDim.x is a multiple of 32 in [32, 1024]; sort_size a power of two >= k, with
// sort_size * 8 bytes of dynamic shared memory.
// kPer > 0 (session 20): entry c = tid + j * threads, j < kPer, is read once into thread tid's
// registers (when n <= kPer * threads), where the form before (kPer = 0,
// FLASHSERVE_CUDA_OLD_RADIX=1, and live rows longer than that) read the row from global memory in
// each of its five passes, a round trip per tile of `threads` entries on one multiprocessor (53 us
// at 64k context's 16,384 block scores, bench/NOTES.md session 13). The kept entries are also
// placed in one scan of the tiles' counts instead of three barriers a tile. The same tiles in the
// same order, so the same kept set, sort and output. Launched overlapped: the row is read after the
// wait.
template <int kPer>
__global__ void __launch_bounds__(kSelectMaxThreads)
    radix_topk_kernel(const float* x, StepScalar live_cols, std::int64_t k, StepScalar live_first,
                      std::int64_t block, int sort_size, std::int32_t* idx, float* val) {
  extern __shared__ std::uint64_t kept[];  // [sort_size]
  __shared__ std::uint32_t hist[kBins];
  __shared__ std::uint32_t warp_gt[kSelectMaxWarps], warp_eq[kSelectMaxWarps];
  __shared__ std::uint32_t s_digit, s_remaining, s_gt_base, s_eq_base;
  // kPer > 0: tile j's per-warp counts, then their exclusive prefix in entry order.
  __shared__ std::uint32_t tile_gt[kPer > 0 ? kPer * kSelectMaxWarps : 1],
      tile_eq[kPer > 0 ? kPer * kSelectMaxWarps : 1];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  const int threads = static_cast<int>(blockDim.x), warps = threads / kWarp;
  for (int i = tid; i < sort_size; i += threads) kept[i] = 0;
  if (tid == 0) {
    s_gt_base = 0;
    s_eq_base = 0;
  }
  wait_for_inputs();  // the scores are the kernel before's
  release_dependents();
  const std::int64_t row = blockIdx.x, cols = live_cols.get(), first = live_first.get();
  const float* p = x + row * cols;
  std::int64_t n = cols;
  if (block > 0 && (first + row + 1) / block < cols) n = (first + row + 1) / block;
  const auto want = static_cast<std::uint32_t>(n < k ? n : k);
  const bool take_all = n <= k;
  // Tiles of `threads` entries: tile j holds entries [j * threads, (j + 1) * threads).
  const int tiles = static_cast<int>((n + threads - 1) / threads);
  // The row in registers when it fits (a step graph sizes the launch for the scores' capacity;
  // the live row may be shorter or, past the registers, longer: then it is read in each pass).
  const bool regs = kPer > 0 && n <= static_cast<std::int64_t>(kPer) * threads;
  [[maybe_unused]] std::uint32_t keys[kPer > 0 ? kPer : 1];
  if constexpr (kPer > 0) {
    if (regs) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const std::int64_t c = static_cast<std::int64_t>(j) * threads + tid;
        keys[j] = c < n ? rank_key(p[c]) : 0u;
      }
    }
  }
  // Entry j * threads + tid's key (from the registers where they hold the row).
  const auto key_at = [&](int j, std::int64_t c) {
    if constexpr (kPer > 0) {
      if (regs) return keys[j];
    }
    return rank_key(p[c]);
  };

  // The k-th largest key: digits from the top; `remaining` counts how many of the entries that
  // share the digits found so far are still to be taken (always >= 1 and <= their number).
  // When every entry is taken they all count as "above" and none as equal.
  std::uint32_t prefix = 0, mask = 0, remaining = take_all ? 0u : want;
  if (!take_all) {
    for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
      for (int b = tid; b < kBins; b += threads) hist[b] = 0;
      __syncthreads();
      // A uniform loop (every lane reaches the match): lanes with the same digit add once.
      const auto count = [&](int j) {
        const std::int64_t c = static_cast<std::int64_t>(j) * threads + tid;
        std::uint32_t digit = kNoDigit;
        if (c < n) {
          const std::uint32_t key = key_at(j, c);
          if ((key & mask) == prefix) digit = (key >> shift) & (kBins - 1);
        }
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (digit != kNoDigit && lane == __ffs(peers) - 1)
          atomicAdd(&hist[digit], static_cast<std::uint32_t>(__popc(peers)));
      };
      if (regs) {
#pragma unroll
        for (int j = 0; j < (kPer > 0 ? kPer : 1); ++j)
          if (j < tiles) count(j);
      } else {
        for (int j = 0; j < tiles; ++j) count(j);
      }
      __syncthreads();
      if (warp == 0) {
        // Lane l owns digits 255 - 8l - j (j = 0..7): descending digit order across the warp.
        constexpr int kPerLane = kBins / kWarp;
        std::uint32_t h[kPerLane];
        std::uint32_t sum = 0;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          h[j] = hist[kBins - 1 - kPerLane * lane - j];
          sum += h[j];
        }
        std::uint32_t incl = sum;
#pragma unroll
        for (int o = 1; o < kWarp; o <<= 1) {
          const std::uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += t;
        }
        std::uint32_t before = incl - sum;  // entries with a larger digit
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          if (before < remaining && before + h[j] >= remaining) {
            s_digit = static_cast<std::uint32_t>(kBins - 1 - kPerLane * lane - j);
            s_remaining = remaining - before;
          }
          before += h[j];
        }
      }
      __syncthreads();
      prefix |= s_digit << shift;
      mask |= static_cast<std::uint32_t>(kBins - 1) << shift;
      remaining = s_remaining;
      __syncthreads();
    }
  }
  // Now prefix is the k-th largest key: the entries above it (want - remaining of them) are all
  // taken, and of those equal to it the `remaining` lowest-indexed.
  const std::uint32_t count_gt = want - remaining;

  // Compaction in index order: ballots give each entry its rank among its tile's equals, the
  // counts of earlier warps and tiles the rest.
  __syncthreads();
  const unsigned lower = (1u << lane) - 1u;
  if (regs) {
    // Each warp's counts of every tile, then one exclusive scan over (tile, warp) in entry order.
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (j >= tiles) break;
      const std::int64_t c = static_cast<std::int64_t>(j) * threads + tid;
      const bool live = c < n;
      const unsigned bal_gt = __ballot_sync(0xffffffffu, live && (take_all || keys[j] > prefix));
      const unsigned bal_eq = __ballot_sync(0xffffffffu, live && !take_all && keys[j] == prefix);
      if (lane == 0) {
        tile_gt[j * warps + warp] = static_cast<std::uint32_t>(__popc(bal_gt));
        tile_eq[j * warps + warp] = static_cast<std::uint32_t>(__popc(bal_eq));
      }
    }
    __syncthreads();
    if (warp == 0) {
      const int m = tiles * warps, per = (m + kWarp - 1) / kWarp;
      std::uint32_t sg = 0, se = 0;
      for (int i = lane * per; i < (lane + 1) * per && i < m; ++i) {
        sg += tile_gt[i];
        se += tile_eq[i];
      }
      std::uint32_t ig = sg, ie = se;
#pragma unroll
      for (int o = 1; o < kWarp; o <<= 1) {
        const std::uint32_t tg = __shfl_up_sync(0xffffffffu, ig, o);
        const std::uint32_t te = __shfl_up_sync(0xffffffffu, ie, o);
        if (lane >= o) {
          ig += tg;
          ie += te;
        }
      }
      std::uint32_t bg = ig - sg, be = ie - se;  // exclusive: the entries before this lane's
      for (int i = lane * per; i < (lane + 1) * per && i < m; ++i) {
        const std::uint32_t g = tile_gt[i], e = tile_eq[i];
        tile_gt[i] = bg;
        tile_eq[i] = be;
        bg += g;
        be += e;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (j >= tiles) break;
      const std::int64_t c = static_cast<std::int64_t>(j) * threads + tid;
      const bool live = c < n;
      const bool gt = live && (take_all || keys[j] > prefix);
      const bool eq = live && !take_all && keys[j] == prefix;
      const unsigned bal_gt = __ballot_sync(0xffffffffu, gt),
                     bal_eq = __ballot_sync(0xffffffffu, eq);
      const std::uint32_t gt_at =
          tile_gt[j * warps + warp] + static_cast<std::uint32_t>(__popc(bal_gt & lower));
      const std::uint32_t eq_at =
          tile_eq[j * warps + warp] + static_cast<std::uint32_t>(__popc(bal_eq & lower));
      if (gt && gt_at < count_gt) kept[gt_at] = pack(keys[j], c);
      if (eq && eq_at < remaining) kept[count_gt + eq_at] = pack(keys[j], c);
    }
    __syncthreads();
  } else {
    for (std::int64_t c0 = 0; c0 < n; c0 += threads) {
      const std::int64_t c = c0 + tid;
      bool gt = false, eq = false;
      std::uint32_t key = 0;
      if (c < n) {
        key = rank_key(p[c]);
        gt = take_all || key > prefix;
        eq = !take_all && key == prefix;
      }
      const unsigned bal_gt = __ballot_sync(0xffffffffu, gt),
                     bal_eq = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) {
        warp_gt[warp] = static_cast<std::uint32_t>(__popc(bal_gt));
        warp_eq[warp] = static_cast<std::uint32_t>(__popc(bal_eq));
      }
      __syncthreads();
      std::uint32_t gt_at = s_gt_base, eq_at = s_eq_base;
      for (int w = 0; w < warp; ++w) {
        gt_at += warp_gt[w];
        eq_at += warp_eq[w];
      }
      gt_at += static_cast<std::uint32_t>(__popc(bal_gt & lower));
      eq_at += static_cast<std::uint32_t>(__popc(bal_eq & lower));
      if (gt && gt_at < count_gt) kept[gt_at] = pack(key, c);
      if (eq && eq_at < remaining) kept[count_gt + eq_at] = pack(key, c);
      __syncthreads();
      if (tid == 0) {
        std::uint32_t tg = 0, te = 0;
        for (int w = 0; w < warps; ++w) {
          tg += warp_gt[w];
          te += warp_eq[w];
        }
        s_gt_base += tg;
        s_eq_base += te;
      }
      __syncthreads();
    }
  }

  // Bitonic sort of kept[0, sort_size) into descending order (the zero padding sinks).
  for (int size = 2; size <= sort_size; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int t = tid; t < sort_size / 2; t += threads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const bool descending = (i & size) == 0;
        const std::uint64_t a = kept[i], b = kept[j];
        if ((a < b) == descending) {
          kept[i] = b;
          kept[j] = a;
        }
      }
      __syncthreads();
    }
  }

  for (std::int64_t r = tid; r < k; r += threads) {
    const bool have = r < static_cast<std::int64_t>(want);
    const std::int32_t c = have ? unpack_index(kept[r]) : -1;
    idx[row * k + r] = c;
    if (val != nullptr) val[row * k + r] = have ? p[c] : 0.0f;
  }
}

}  // namespace

void launch_radix_topk(const float* x, std::int64_t rows, std::int64_t max_cols, StepScalar cols,
                       std::int64_t k, StepScalar first, std::int64_t block, std::int32_t* idx,
                       float* val, cudaStream_t stream) {
  int sort_size = 2;
  while (sort_size < k) sort_size <<= 1;
  // Threads: the row's width (rounded to warps), at least 4 warps, at most 1024.
  const int threads = static_cast<int>(std::clamp<std::int64_t>(
      (max_cols + kWarp - 1) / kWarp * kWarp, 4 * kWarp, kSelectMaxThreads));
  const auto smem = static_cast<std::size_t>(sort_size) * sizeof(std::uint64_t);
  // Entries a thread holds in registers: the row's capacity over the threads, a power of two.
  const auto per = (max_cols + threads - 1) / threads;
  const auto launch = [&](auto kernel) {
    launch_overlapped(kernel, dim3(static_cast<unsigned>(rows)), dim3(threads), smem, stream, x,
                      cols, k, first, block, sort_size, idx, val);
  };
  // At most 32 a thread (1,024 threads at 64 registers, no spill: ptxas -v); a longer live row is
  // read in each pass. (A decode step at 64k context selects over its 16,384 blocks and more: 17+
  // a thread.)
  if (env_flag("FLASHSERVE_CUDA_OLD_RADIX"))
    launch(radix_topk_kernel<0>);
  else if (per <= 1)
    launch(radix_topk_kernel<1>);
  else if (per <= 2)
    launch(radix_topk_kernel<2>);
  else if (per <= 4)
    launch(radix_topk_kernel<4>);
  else if (per <= 8)
    launch(radix_topk_kernel<8>);
  else if (per <= 16)
    launch(radix_topk_kernel<16>);
  else
    launch(radix_topk_kernel<32>);
}

}  // namespace fs::cuda
