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
  if (mode_ == StepMode::kReplay) {
    auto& a = *arena_;
    if (a.next < a.blocks.size() && a.sizes[a.next] >= size) return a.blocks[a.next++];
    if (divergence_.empty())
      divergence_ =
          "cuda: step graph: allocation " + std::to_string(a.next) + " of the replay (" +
          std::to_string(bytes) + " bytes) " +
          (a.next < a.blocks.size()
               ? "is larger than the recording's (" + std::to_string(a.sizes[a.next]) + " bytes)"
               : "has none in the recording (" + std::to_string(a.blocks.size()) + " blocks)") +
          ": the step's key does not fix its allocations";
    a.next = a.blocks.size() + 1;  // every later request diverges too
  }
  void* p = allocate_locked(size);
  if (p != nullptr && mode_ == StepMode::kRecord) {
    arena_->blocks.push_back(p);
    arena_->sizes.push_back(size);
    owned_.emplace(p, size);
  }
  return p;
}

void* CudaMemory::allocate_locked(std::size_t size) {
  if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    live_.emplace(p, size);
    stats_.bytes_in_use += static_cast<std::int64_t>(size);
    return p;
  }
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) {
    cudaGetLastError();                            // clear the (non-sticky) allocation error
    if (mode_ != StepMode::kNone) return nullptr;  // trimming would cudaFree inside the recording
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
  if (owned_.count(p) != 0) return;  // a step graph's block: it stays with the graph
  const auto it = live_.find(p);
  if (it == live_.end()) return;
  const auto size = it->second;
  live_.erase(it);
  stats_.bytes_in_use -= static_cast<std::int64_t>(size);
  free_[size].push_back(p);
}

void CudaMemory::begin_record(StepArena& arena) {
  std::lock_guard lock(mu_);
  mode_ = StepMode::kRecord;
  arena_ = &arena;
}

void CudaMemory::begin_replay(StepArena& arena) {
  std::lock_guard lock(mu_);
  mode_ = StepMode::kReplay;
  arena_ = &arena;
  arena.next = 0;
  divergence_.clear();
}

std::string CudaMemory::end_step() {
  std::lock_guard lock(mu_);
  std::string d;
  if (mode_ == StepMode::kReplay) {
    d = std::move(divergence_);
    divergence_.clear();
    if (d.empty() && arena_->next != arena_->blocks.size())
      d = "cuda: step graph: the replay took " + std::to_string(arena_->next) + " of the " +
          std::to_string(arena_->blocks.size()) +
          " blocks the recording did: the step's key does not fix its allocations";
  }
  mode_ = StepMode::kNone;
  arena_ = nullptr;
  return d;
}

void CudaMemory::free_arena(StepArena& arena) {
  std::lock_guard lock(mu_);
  for (void* p : arena.blocks) {
    const auto it = owned_.find(p);
    if (it == owned_.end()) continue;
    owned_.erase(it);
    if (const auto l = live_.find(p); l != live_.end()) {
      stats_.bytes_in_use -= static_cast<std::int64_t>(l->second);
      free_[l->second].push_back(p);
      live_.erase(l);
    }
  }
  arena = StepArena{};
}

void CudaMemory::trim() {
  std::lock_guard lock(mu_);
  if (mode_ != StepMode::kNone) return;
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

bool CudaMemory::may_synchronize(const char* what) {
  std::lock_guard lock(mu_);
  if (mode_ == StepMode::kNone) return true;
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

bool CudaMemory::walking() const {
  std::lock_guard lock(mu_);
  return mode_ == StepMode::kReplay;
}

void CudaMemory::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src || walking()) return;
  note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
}

void CudaMemory::zero(void* p, std::size_t bytes) {
  if (bytes == 0 || walking()) return;
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
