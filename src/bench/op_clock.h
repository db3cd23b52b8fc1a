// Times backend ops by group for TimingBackend. On the GPU each op is bracketed by CUDA events on
// the backend's stream (no synchronisation per op; the elapsed times are read in batches); on a
// host backend by the wall clock.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "tensor/memory.h"

namespace fs::bench {

enum class OpGroup {
  kLinear,       // GEMV / GEMM of dense projections (router included)
  kExperts,      // routed experts (and their top-k routing)
  kGdn,          // conv + delta rule + GDN l2 norms
  kAttention,    // QSA attention, the indexer's scores/selection, RoPE, cache appends
  kNormsHc,      // RMS norms and hyper-connection stream ops
  kLmHead,       // the vocabulary product
  kEmbedding,    // token and PLE row gathers (PLE rows come from host memory)
  kElementwise,  // activations, products, slices and other layout ops
  kCount,
};
inline constexpr std::size_t kOpGroups = static_cast<std::size_t>(OpGroup::kCount);
const char* op_group_name(OpGroup g);

class OpClock {
 public:
  virtual ~OpClock() = default;
  virtual void start() = 0;
  virtual void stop(OpGroup g) = 0;
  // stop, with the op also counted under `key` (an index the caller gives each op name).
  virtual void stop_keyed(OpGroup g, std::size_t key) = 0;
  // Waits for outstanding timings and returns seconds per group since the last reset.
  virtual std::array<double, kOpGroups> totals() = 0;
  // Seconds per key since the last reset (index = key; waits as totals does).
  virtual std::vector<double> key_totals() = 0;
  virtual void reset() = 0;
};

// Events on the stream of `memory` when it is CUDA memory, else the wall clock.
std::unique_ptr<OpClock> make_op_clock(const std::shared_ptr<Memory>& memory);

#if FLASHSERVE_HAVE_CUDA
std::unique_ptr<OpClock> make_cuda_op_clock(const std::shared_ptr<Memory>& memory);
#endif

}  // namespace fs::bench
