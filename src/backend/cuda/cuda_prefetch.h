// Asking L2 for weights ahead of the op that reads them (Backend::prefetch, docs/GPU.md step 10).
//
// At batch 1 the step is a chain of kernels, each waiting for the one before; the weight-streaming
// ones keep the memory busy, the small ones between them (norms, the stream mix, the conv, the
// delta rule, the routing) leave it idle. A prefetch kernel placed in the chain one weight-reading
// op ahead issues bulk L2 prefetches (cp.async.bulk.prefetch.L2, fire and forget) for the weights
// of the op after next and returns: their bytes stream in while the ops between run, and the op
// that reads them finds them in L2. It writes nothing, so it changes no result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fs::cuda {

// The byte ranges of one prefetch kernel (weights in device memory).
constexpr int kMaxPrefetchRanges = 8;
struct PrefetchRanges {
  const std::uint8_t* begin[kMaxPrefetchRanges] = {};
  std::uint64_t bytes[kMaxPrefetchRanges] = {};
  int count = 0;

  // Adds [p, p + bytes) shrunk to whole 16-byte units (what a bulk prefetch takes); false when
  // full. Ranges of under 16 bytes are skipped.
  bool add(const void* p, std::uint64_t bytes);
  std::uint64_t total() const;
};

// How the prefetch kernels run (read once per process from the environment, for measuring):
//   FLASHSERVE_CUDA_PREFETCH=0          no prefetch kernel at all (Backend::prefetch does nothing)
//   FLASHSERVE_CUDA_PREFETCH=chain      the kernel in the step's own stream (measured slower: the
//                                       next kernel waits for it, and it ends only once its
//                                       prefetches have landed); default: on a second stream
//                                       forked from the step's (an event), so nothing waits for it
//   FLASHSERVE_CUDA_PREFETCH_MB=N       at most N MB asked for by one call (default 32: L2 holds
//                                       50 MB, and the op that runs meanwhile needs some of it)
//   FLASHSERVE_CUDA_PREFETCH_BLOCKS=N   blocks of one warp issuing the slices (default 32)
//   FLASHSERVE_CUDA_PREFETCH_EXPERTS=0  no prefetch of the routed experts' down rows (moe_block)
struct PrefetchSettings {
  bool on = true;
  bool chain = false;
  std::uint64_t max_bytes = std::uint64_t{32} << 20;
  int blocks = 32;
  bool experts = true;
};
const PrefetchSettings& prefetch_settings();

// Prefetch kernels queued by Backend::prefetch and the routed experts' prefetch in this process
// (the tests' proof that the prefetch ran).
std::uint64_t prefetch_launches();

// Bytes one thread asks for with one bulk prefetch.
constexpr std::uint32_t kPrefetchSlice = 64 * 1024;

// Queues the prefetch of `r` on `stream`, `blocks` of one warp. `chained`: launched overlapped
// (cuda_common.h) in the step's stream: it lets the next kernel be scheduled at once and ends only
// after the kernel before it, so the chain's order stands.
cudaError_t launch_prefetch(const PrefetchRanges& r, int blocks, bool chained, cudaStream_t stream);

// Queues the prefetch of the routed experts that `ids` (k int32 in device memory, written by the
// kernel before) names: for each, `bytes` bytes at base + id * stride. It reads the ids after its
// wait, so it ends after the routing; E bounds the ids (others are skipped).
cudaError_t launch_prefetch_experts(const std::int32_t* ids, int k, int E, const std::uint8_t* base,
                                    std::uint64_t stride, std::uint64_t bytes, int blocks,
                                    bool chained, cudaStream_t stream);

}  // namespace fs::cuda
