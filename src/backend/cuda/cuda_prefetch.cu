// Backend::prefetch on the GPU (cuda_prefetch.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_prefetch.h"

namespace fs::cuda {

bool PrefetchRanges::add(const void* p, std::uint64_t n) {
  if (count == kMaxPrefetchRanges) return false;
  // A bulk prefetch takes a 16-byte aligned address and a multiple of 16 bytes: shrink inwards,
  // never past either end of the weight.
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto first = (a + 15) & ~std::uintptr_t{15}, last = (a + n) & ~std::uintptr_t{15};
  if (last <= first) return true;
  begin[count] = reinterpret_cast<const std::uint8_t*>(first);
  bytes[count] = last - first;
  ++count;
  return true;
}

std::uint64_t PrefetchRanges::total() const {
  std::uint64_t t = 0;
  for (int i = 0; i < count; ++i) t += bytes[i];
  return t;
}

namespace {

std::atomic<std::uint64_t> launches{0};

long env_number(const char* var, long fallback) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && n >= 0 ? n : fallback;
}

// Asks L2 for [p, p + bytes) (16-byte aligned, a multiple of 16): the copy engine of the SM fetches
// it from memory into L2 with nothing returned to the thread, which goes on at once.
__device__ __forceinline__ void prefetch_l2(const std::uint8_t* p, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Slice j of a range of `bytes`: kPrefetchSlice bytes at j * kPrefetchSlice (the last shorter).
__device__ __forceinline__ void prefetch_slice(const std::uint8_t* begin, std::uint64_t bytes,
                                               std::uint64_t j) {
  const std::uint64_t off = j * kPrefetchSlice;
  const std::uint64_t left = bytes - off;
  prefetch_l2(begin + off,
              static_cast<std::uint32_t>(left < kPrefetchSlice ? left : kPrefetchSlice));
}

// The slices of all ranges, in order, dealt to the threads round robin, so the first bytes of the
// first weight are asked for first. It reads nothing another kernel writes: it lets the next
// kernel be scheduled at once, issues its prefetches, and waits for the kernel before it only so
// that the chain's order holds (the next kernel's wait returns once this one has ended).
__global__ void prefetch_kernel(PrefetchRanges r) {
  release_dependents();
  const std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t threads = gridDim.x * static_cast<std::uint64_t>(blockDim.x);
  std::uint64_t first = 0;  // the index of range i's first slice among all
  for (int i = 0; i < r.count; ++i) {
    const std::uint64_t slices = (r.bytes[i] + kPrefetchSlice - 1) / kPrefetchSlice;
    // This thread's first slice at or after `first` (global index = t mod threads).
    for (std::uint64_t g = first + (t + threads - first % threads) % threads; g < first + slices;
         g += threads)
      prefetch_slice(r.begin[i], r.bytes[i], g - first);
    first += slices;
  }
  wait_for_inputs();
}

// The routed experts' rows: the ids are the routing's output, read after the wait.
__global__ void prefetch_experts_kernel(const std::int32_t* ids, int k, int E,
                                        const std::uint8_t* base, std::uint64_t stride,
                                        std::uint64_t bytes) {
  release_dependents();
  wait_for_inputs();
  const std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t threads = gridDim.x * static_cast<std::uint64_t>(blockDim.x);
  const std::uint64_t slices = (bytes + kPrefetchSlice - 1) / kPrefetchSlice;
  for (std::uint64_t g = t; g < slices * static_cast<std::uint64_t>(k); g += threads) {
    const int e = ids[g / slices];
    if (e < 0 || e >= E) continue;
    prefetch_slice(base + static_cast<std::uint64_t>(e) * stride, bytes, g % slices);
  }
}

}  // namespace

const PrefetchSettings& prefetch_settings() {
  static const PrefetchSettings s = [] {
    PrefetchSettings p;
    const char* mode = std::getenv("FLASHSERVE_CUDA_PREFETCH");
    const std::string m = mode != nullptr ? mode : "";
    p.on = m != "0";
    p.chain = m == "chain";
    p.max_bytes = static_cast<std::uint64_t>(env_number("FLASHSERVE_CUDA_PREFETCH_MB", 32)) << 20;
    p.blocks = static_cast<int>(
        std::clamp<long>(env_number("FLASHSERVE_CUDA_PREFETCH_BLOCKS", 32), 1, 1024));
    p.experts = env_number("FLASHSERVE_CUDA_PREFETCH_EXPERTS", 1) != 0;
    return p;
  }();
  return s;
}

std::uint64_t prefetch_launches() {
  return launches.load(std::memory_order_relaxed);
}

cudaError_t launch_prefetch(const PrefetchRanges& r, int blocks, bool chained,
                            cudaStream_t stream) {
  if (chained) return launch_overlapped(prefetch_kernel, blocks, kWarp, 0, stream, r);
  prefetch_kernel<<<blocks, kWarp, 0, stream>>>(r);
  return cudaGetLastError();
}

cudaError_t launch_prefetch_experts(const std::int32_t* ids, int k, int E, const std::uint8_t* base,
                                    std::uint64_t stride, std::uint64_t bytes, int blocks,
                                    bool chained, cudaStream_t stream) {
  if (chained)
    return launch_overlapped(prefetch_experts_kernel, blocks, kWarp, 0, stream, ids, k, E, base,
                             stride, bytes);
  prefetch_experts_kernel<<<blocks, kWarp, 0, stream>>>(ids, k, E, base, stride, bytes);
  return cudaGetLastError();
}

// --- the op --------------------------------------------------------------------------------------

namespace {

// The bytes of a weight's elements (all its rows; a stacked [E, R, C] weight is E * R rows). Its
// block scales are left out: a few KB, read by every chunk and so cached anyway.
std::uint64_t weight_bytes(const Weight& w) {
  return static_cast<std::uint64_t>(w.rows()) * w.row_bytes();
}

}  // namespace

void CudaBackend::prefetch(std::initializer_list<const Weight*> ws) {
  const auto& settings = prefetch_settings();
  if (failed() || walking() || !settings.on) return;
  PrefetchRanges r;
  std::uint64_t budget = settings.max_bytes;
  for (const Weight* w : ws) {
    if (w == nullptr || w->empty() || w->device != Device::kCuda || budget == 0) continue;
    const auto n = std::min(weight_bytes(*w), budget);
    if (!r.add(w->data, n)) break;
    budget -= n;
  }
  if (r.count == 0) return;
  const cudaStream_t s = prefetch_stream(settings.chain);
  if (s == nullptr) return;
  launch_prefetch(r, settings.blocks, settings.chain, s);
  if (launched("prefetch")) launches.fetch_add(1, std::memory_order_relaxed);
}

cudaStream_t CudaBackend::prefetch_stream(bool chained) {
  if (chained) return stream();
  // The fork: the prefetch stream waits for what the step's stream has queued so far, so the
  // kernel starts with the op queued last and nothing on the step's stream waits for it.
  if (!check(prefetch_stream_ != nullptr && prefetch_fork_ != nullptr, "prefetch",
             "no prefetch stream") ||
      !check(cudaEventRecord(prefetch_fork_, stream()) == cudaSuccess &&
                 cudaStreamWaitEvent(prefetch_stream_, prefetch_fork_, 0) == cudaSuccess,
             "prefetch", "fork failed"))
    return nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream(), &capture) == cudaSuccess &&
      capture == cudaStreamCaptureStatusActive)
    prefetch_forked_ = true;  // a recording must join it back before it ends
  return prefetch_stream_;
}

void CudaBackend::join_prefetches() {
  if (!prefetch_forked_) return;
  prefetch_forked_ = false;
  if (cudaEventRecord(prefetch_join_, prefetch_stream_) != cudaSuccess ||
      cudaStreamWaitEvent(stream(), prefetch_join_, 0) != cudaSuccess)
    fail(internal_error("cuda: prefetch: join failed"));
}

void CudaBackend::prefetch_routed(const Tensor& experts, const Weight& w) {
  const auto& settings = prefetch_settings();
  if (failed() || walking() || !settings.on || !settings.experts) return;
  if (w.shape.size() != 3 || w.device != Device::kCuda || w.empty()) return;
  const auto stride = static_cast<std::uint64_t>(w.shape[1]) * w.row_bytes();
  const auto base = reinterpret_cast<std::uintptr_t>(w.data);
  // Whole 16-byte units at 16-byte aligned addresses for every expert, or no prefetch.
  if (stride == 0 || stride % 16 != 0 || base % 16 != 0) return;
  const cudaStream_t s = prefetch_stream(settings.chain);
  if (s == nullptr) return;
  launch_prefetch_experts(experts.data_as<std::int32_t>(), static_cast<int>(experts.numel()),
                          static_cast<int>(w.shape[0]), w.data, stride, stride, settings.blocks,
                          settings.chain, s);
  if (launched("prefetch")) launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace fs::cuda
