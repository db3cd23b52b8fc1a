// Device memory for the CUDA backend: a caching pool over cudaMalloc, and the one stream that every
// copy, fill and kernel of the backend is ordered on.
//
// Blocks are rounded to a size class (512 B steps below 1 MiB, 2 MiB granules above) and kept on a
// free list per class when released; a later request of the same class takes one back without a
// cudaMalloc. Since all work runs on the single stream, a block released by one op and handed to
// the next is only touched after the earlier work in stream order, so no event is needed. Cached
// blocks go back to the system when an allocation fails (then the allocation is retried once), on
// `trim()`, and on destruction.
//
// While the backend records a step graph (`begin_record`), every block handed out is also noted
// in that graph's arena, in order, and stays owned by the graph: releasing it (inside the step or
// after) does not return it to the free lists, so no later step or eager op can take a block the
// graph's nodes write. A replay's walk (`begin_replay`) is served the arena's blocks in the same
// order instead of allocating; a request that does not fit the next block is a divergence (by the
// key's construction it never happens): it is served from the pool as usual and reported by
// `end_step`, so the step fails naming it instead of running the graph. `free_arena` gives a
// dropped graph's blocks back. Inside a step the memory never returns blocks to the system
// (cudaFree is illegal while the stream records) and refuses the synchronous copies to and from
// the host, recording an error that names the step graph; during a walk it queues no copy or fill
// (the recorded graph holds them).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/memory.h"
#include "util/status.h"

namespace fs::cuda {

// The blocks one step graph owns, in the order its recording took them.
struct StepArena {
  std::vector<void*> blocks;
  std::vector<std::size_t> sizes;  // size classes
  std::size_t next = 0;            // the replay's cursor
};

class CudaMemory final : public Memory {
 public:
  // Makes device `device` current and creates the stream.
  static Expected<std::shared_ptr<CudaMemory>> create(int device);
  ~CudaMemory() override;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  Device device() const override { return Device::kCuda; }
  void* allocate(std::size_t bytes) override;
  void release(void* p, std::size_t bytes) override;
  void to_host(void* dst, const void* src, std::size_t bytes) override;
  void from_host(void* dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void zero(void* p, std::size_t bytes) override;
  MemoryStats stats() const override;

  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_; }
  // Returns every cached (free) block to the system.
  void trim();
  // The first CUDA error a copy or fill met (they return nothing); empty when none.
  std::string error() const;
  // Step graphs (see above). begin_record / begin_replay start a step on `arena`; end_step ends
  // it and returns the replay's divergence, if any (empty when none).
  void begin_record(StepArena& arena);
  void begin_replay(StepArena& arena);
  std::string end_step();
  // Gives a dropped graph's blocks back to the free lists (their last use is queued before any
  // later one on the stream).
  void free_arena(StepArena& arena);

  // The size a request of `bytes` is served with.
  static std::size_t size_class(std::size_t bytes);

 private:
  CudaMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  void note(cudaError_t e, const char* what);
  // False (and an error recorded) when the stream is recording: `what` would synchronise.
  bool may_synchronize(const char* what);
  void trim_locked();
  void* allocate_locked(std::size_t size);
  bool walking() const;  // a replay's walk: copies and fills are already in the graph

  int device_;
  cudaStream_t stream_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, std::size_t> live_;     // block handed out -> its size class
  MemoryStats stats_;
  std::string error_;
  enum class StepMode { kNone, kRecord, kReplay };
  StepMode mode_ = StepMode::kNone;
  StepArena* arena_ = nullptr;
  std::string divergence_;                        // the first of this replay
  std::unordered_map<void*, std::size_t> owned_;  // blocks some step graph owns
};

}  // namespace fs::cuda
