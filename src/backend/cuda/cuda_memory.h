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
// While the backend records a step graph (`set_capturing(true)`), the memory keeps working in
// stream order (a block freed and handed out again is reused by later recorded nodes, which run
// in the same order), but it never returns blocks to the system (cudaFree is illegal while the
// stream records) and refuses the synchronous copies to and from the host, recording an error
// that names the step graph instead of invalidating the recording.
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
  // Whether the stream is recording a step graph (see above).
  void set_capturing(bool on);

  // The size a request of `bytes` is served with.
  static std::size_t size_class(std::size_t bytes);

 private:
  CudaMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  void note(cudaError_t e, const char* what);
  // False (and an error recorded) when the stream is recording: `what` would synchronise.
  bool may_synchronize(const char* what);
  void trim_locked();

  int device_;
  cudaStream_t stream_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, std::size_t> live_;     // block handed out -> its size class
  MemoryStats stats_;
  std::string error_;
  bool capturing_ = false;
};

}  // namespace fs::cuda
