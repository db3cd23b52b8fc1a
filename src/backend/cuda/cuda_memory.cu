#include "backend/cuda/cuda_memory.h"

namespace fs::cuda {
namespace {

constexpr std::size_t kSmallStep = 512;
constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
constexpr std::size_t kLargeStep = std::size_t{2} << 20;

}  // namespace

Expected<std::shared_ptr<CudaMemory>> CudaMemory::create(int device) {
  if (const auto e = cudaSetDevice(device); e != cudaSuccess)
    return internal_error("cuda: select device " + std::to_string(device) + ": " +
                          cudaGetErrorString(e));
  cudaStream_t stream = nullptr;
  if (const auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    return internal_error(std::string("cuda: create stream: ") + cudaGetErrorString(e));
  return std::shared_ptr<CudaMemory>(new CudaMemory(device, stream));
}

CudaMemory::~CudaMemory() {
  cudaStreamSynchronize(stream_);
  {
    std::lock_guard lock(mu_);
    trim_locked();
    // Blocks still handed out belong to tensors that outlived every owner of this memory, which
    // the shared_ptr in each tensor rules out; free them anyway.
    for (const auto& [p, size] : live_) cudaFree(p);
    live_.clear();
  }
  cudaStreamDestroy(stream_);
}

std::size_t CudaMemory::size_class(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < kSmallLimit) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
}

void* CudaMemory::allocate(std::size_t bytes) {
  const auto size = size_class(bytes);
  std::lock_guard lock(mu_);
  if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    live_.emplace(p, size);
    stats_.bytes_in_use += static_cast<std::int64_t>(size);
    return p;
  }
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) {
    cudaGetLastError();              // clear the (non-sticky) allocation error
    if (capturing_) return nullptr;  // trimming would cudaFree inside the recording
    trim_locked();
    if (cudaMalloc(&p, size) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
  }
  ++stats_.system_allocations;
  stats_.bytes_reserved += static_cast<std::int64_t>(size);
  stats_.bytes_in_use += static_cast<std::int64_t>(size);
  live_.emplace(p, size);
  return p;
}

void CudaMemory::release(void* p, std::size_t) {
  if (p == nullptr) return;
  std::lock_guard lock(mu_);
  const auto it = live_.find(p);
  if (it == live_.end()) return;
  const auto size = it->second;
  live_.erase(it);
  stats_.bytes_in_use -= static_cast<std::int64_t>(size);
  free_[size].push_back(p);
}

void CudaMemory::trim() {
  std::lock_guard lock(mu_);
  if (capturing_) return;
  trim_locked();
}

void CudaMemory::trim_locked() {
  bool any = false;
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) {
      if (!any) cudaStreamSynchronize(stream_);  // cudaFree would wait anyway; be explicit
      any = true;
      cudaFree(p);
      stats_.bytes_reserved -= static_cast<std::int64_t>(size);
    }
  }
  free_.clear();
}

void CudaMemory::note(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::lock_guard lock(mu_);
  if (error_.empty()) error_ = std::string("cuda: ") + what + ": " + cudaGetErrorString(e);
}

void CudaMemory::set_capturing(bool on) {
  std::lock_guard lock(mu_);
  capturing_ = on;
}

bool CudaMemory::may_synchronize(const char* what) {
  std::lock_guard lock(mu_);
  if (!capturing_) return true;
  if (error_.empty())
    error_ = std::string("cuda: ") + what +
             " inside a step graph (the host would wait on work not yet launched)";
  return false;
}

void CudaMemory::to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || !may_synchronize("copy to host")) return;
  note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  note(cudaStreamSynchronize(stream_), "copy to host");
}

void CudaMemory::from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || !may_synchronize("copy from host")) return;
  note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy from host");
  note(cudaStreamSynchronize(stream_), "copy from host");
}

void CudaMemory::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
}

void CudaMemory::zero(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  note(cudaMemsetAsync(p, 0, bytes, stream_), "device fill");
}

MemoryStats CudaMemory::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::string CudaMemory::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

}  // namespace fs::cuda
