// Where a tensor's bytes live, and the only ways to move them (DESIGN "On the GPU", rule 1).
//
// A backend supplies the `Memory` its tensors are allocated from; host memory is the default and
// what tests build by hand. Data crosses between host and device only through `to_host` and
// `from_host`; there is no implicit access to device bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fs {

enum class Device : std::uint8_t { kHost, kCuda };

std::string device_name(Device d);  // "host", "cuda"

// Counters of one memory's allocations. `system_allocations` counts the calls that reached the
// system allocator (cudaMalloc on the GPU): a pooled memory serves steady-state work from its
// free lists, so this stays flat once a workload is warm.
struct MemoryStats {
  std::int64_t system_allocations = 0;
  std::int64_t bytes_reserved = 0;  // held from the system, in use or pooled
  std::int64_t bytes_in_use = 0;
};

class Memory {
 public:
  virtual ~Memory() = default;
  virtual Device device() const = 0;
  // nullptr when the memory is exhausted (the caller reports it; nothing is thrown).
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p, std::size_t bytes) = 0;
  // Copies complete before they return: the host may use `dst` (or reuse `src`) at once.
  virtual void to_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void from_host(void* dst, const void* src, std::size_t bytes) = 0;
  // Within this memory.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void zero(void* p, std::size_t bytes) = 0;
  virtual MemoryStats stats() const { return {}; }
};

// The process's host memory (malloc/free, plain memcpy).
const std::shared_ptr<Memory>& host_memory();

}  // namespace fs
