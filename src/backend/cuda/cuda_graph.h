// Executable graphs of the decode step (DESIGN "On the GPU" rule 5, docs/GPU.md), recorded once
// per key and replayed unchanged.
//
// A step graph owns everything its recorded nodes point at that must not change or be shared
// between replays:
// - its blocks of pooled device memory (the arena: every block the pool handed out while the step
//   was recorded, in order; a replay's walk is served the same blocks in the same order);
// - a parameter block: the per-step scalars (positions, cache lengths) that kernels read from
//   device memory, a pinned host mirror the walk writes and a device array the graph's first node
//   copies the mirror into when the graph runs;
// - pinned staging buffers that its host-to-device copies read (the embedding's row descriptors
//   and the PLE rows gathered on the host);
// - an event recorded after each of its launches, waited on before the next walk writes the
//   mirror or the staging.
// At most kKept graphs are kept, the least recently used evicted (its arena back to the pool).
#pragma once

// See cuda_backend.h: nvcc's warning 2810 on discarded [[nodiscard]] class values.
#pragma nv_diag_suppress 2810

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_memory.h"
#include "util/status.h"

namespace fs::cuda {

// A per-step scalar kernel argument: eagerly its value; inside a step graph a slot of the graph's
// parameter block, which each replay rewrites (the value is what the recording saw).
struct StepScalar {
  const std::int64_t* dev = nullptr;
  std::int64_t value = 0;
  __host__ __device__ std::int64_t get() const { return dev != nullptr ? *dev : value; }
};

// Slots of one graph's parameter block: a QSA layer takes about a dozen per step.
constexpr std::size_t kStepScalars = 2048;
// Pinned staging made with each graph: a step stages its token descriptors and PLE rows.
constexpr std::size_t kStepStagingBytes = std::size_t{64} << 10;

struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using PinnedBuffer = std::unique_ptr<void, PinnedFree>;

struct StepGraph {
  Backend::StepGraphKey key;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t done = nullptr;
  std::uint64_t last_used = 0;
  StepArena arena;
  std::int64_t* params_host = nullptr;  // pinned, kStepScalars
  std::int64_t* params_dev = nullptr;   // a pool block, kStepScalars
  std::size_t params_used = 0;          // slots the recording took
  std::size_t params_next = 0;          // the walk's cursor
  // Pinned staging, carved from `staging_block` (made with the graph, so a recording need not
  // allocate pinned memory) or, past its end, from buffers of their own.
  struct Staging {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  PinnedBuffer staging_block;
  std::size_t staging_used = 0;  // bytes of the block taken
  std::vector<PinnedBuffer> staging_extra;
  std::vector<Staging> staging;  // in the order the recording took them
  std::size_t staging_next = 0;  // the walk's cursor
};

class StepGraphs {
 public:
  explicit StepGraphs(CudaMemory& memory) : memory_(memory) {}
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // The kept graph of `key` (marked used), or nullptr.
  StepGraph* find(const Backend::StepGraphKey& key);
  // A new, empty graph for `key` (its parameter block and event made), evicting the least
  // recently used one when kKept are kept. Outside any recording: it may synchronise.
  Expected<StepGraph*> create(const Backend::StepGraphKey& key);
  // Forgets `g` (a failed recording or walk): its arena goes back to the pool.
  void drop(StepGraph* g);

  Backend::StepGraphStats& stats() { return stats_; }
  const Backend::StepGraphStats& stats() const { return stats_; }
  std::size_t size() const { return kept_.size(); }

  // Graphs kept: keys differ by position within a QSA block (4), the state's cache buffers (two
  // states alternate in a session; a regrowth makes a new identity) and the token count.
  static constexpr std::size_t kKept = 32;

 private:
  void destroy(StepGraph& g);

  CudaMemory& memory_;
  std::vector<std::unique_ptr<StepGraph>> kept_;
  std::uint64_t clock_ = 0;
  Backend::StepGraphStats stats_;
};

}  // namespace fs::cuda
