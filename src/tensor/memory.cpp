#include "tensor/memory.h"

#include <cstdlib>
#include <cstring>

namespace fs {
namespace {

class HostMemory final : public Memory {
 public:
  Device device() const override { return Device::kHost; }
  void* allocate(std::size_t bytes) override {
    // 64-byte alignment suits every SIMD load the CPU kernels issue.
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void release(void* p, std::size_t) override { std::free(p); }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void from_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0) std::memmove(dst, src, bytes);
  }
  void zero(void* p, std::size_t bytes) override {
    if (bytes != 0) std::memset(p, 0, bytes);
  }
};

}  // namespace

std::string device_name(Device d) {
  return d == Device::kCuda ? "cuda" : "host";
}

const std::shared_ptr<Memory>& host_memory() {
  static const std::shared_ptr<Memory> memory = std::make_shared<HostMemory>();
  return memory;
}

}  // namespace fs
