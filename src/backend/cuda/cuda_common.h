// Device helpers shared by the CUDA backend's kernels (included by its .cu files only).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/chain_trace.h"

namespace fs::cuda {

constexpr int kWarp = 32;

// Blocks of `threads` covering n items (n > 0).
inline unsigned grid_for(std::int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Whether the kernels were built with the chain trace (FLASHSERVE_CHAIN_TRACE, CMake option of the
// same name, off by default): when not, wait_for_inputs is the bare wait.
#ifndef FLASHSERVE_CHAIN_TRACE
#define FLASHSERVE_CHAIN_TRACE 0
#endif
inline constexpr bool kChainTrace = FLASHSERVE_CHAIN_TRACE != 0;

// The chain trace's switch (chain_trace.h): records null while off. Whole-program compilation
// gives each translation unit its own __constant__ copy; each registers a setter for its copy
// (below) and chain_trace_begin sets them all.
struct ChainTraceSink {
  ChainTraceRecord* records = nullptr;
  unsigned long long* count = nullptr;
  unsigned long long capacity = 0;
};
static __constant__ ChainTraceSink chain_trace_sink;
using ChainTraceSetter = cudaError_t (*)(const ChainTraceSink&);
bool register_chain_trace_setter(ChainTraceSetter set);
namespace {
cudaError_t set_chain_trace_sink(const ChainTraceSink& sink) {
  return cudaMemcpyToSymbol(chain_trace_sink, &sink, sizeof sink);
}
[[maybe_unused]] const bool chain_trace_registered =
    register_chain_trace_setter(&set_chain_trace_sink);
}  // namespace

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// wait_for_inputs of a block's thread 0 while the trace is on: a slot taken before the wait, so
// its round trip overlaps the wait, and the record stored after it.
__device__ __forceinline__ void traced_wait() {
  const std::uint64_t arrive = global_timer_ns();
  const unsigned long long slot = atomicAdd(chain_trace_sink.count, 1ull);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const std::uint64_t release = global_timer_ns();
  if (slot >= chain_trace_sink.capacity) return;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  ChainTraceRecord r;
  r.arrive = arrive;
  r.release = release;
  r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  r.blocks = gridDim.x * gridDim.y * gridDim.z;
  r.threads = blockDim.x * blockDim.y * blockDim.z;
  r.sm = sm;
  chain_trace_sink.records[slot] = r;
}
#endif

// Overlapped launches (programmatic dependent launch, sm_90; docs/GPU.md "Step 4"). A decode step
// is hundreds of kernels, and each one used to start only once the one before had finished and
// its launch had gone through. A kernel launched with `launch_overlapped` is scheduled while the
// kernel before it still runs (as soon as that one calls `release_dependents`), does its setup,
// and waits in `wait_for_inputs` until the kernel before it has finished and its writes are
// visible; only then does it read or write memory. Kernels call `release_dependents` after their
// own wait (or first thing, when launched the ordinary way), so at most one kernel runs ahead.
// Both are no-ops for a kernel launched the ordinary way. FLASHSERVE_CUDA_OVERLAP=0 launches
// everything the ordinary way. (Fetching the next kernel's weights into L2 before its wait was
// measured too: slower, bench/NOTES.md 2026-12-02.) Before sm_90 there are no overlapped launches
// (launch_overlapped launches the ordinary way there), so the two compile to nothing.
__device__ __forceinline__ void wait_for_inputs() {
#if __CUDA_ARCH__ >= 900
  if constexpr (kChainTrace) {
    if (chain_trace_sink.records != nullptr && threadIdx.x == 0 && threadIdx.y == 0 &&
        threadIdx.z == 0) {
      traced_wait();
      return;
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void release_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 16 bytes global -> shared by cp.async (L2 only), zero-filled without a read when !fill; then
// the group's commit and the wait for all but kPending groups.
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool fill) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = fill ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(gmem)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

bool overlap_enabled();  // FLASHSERVE_CUDA_OVERLAP, read once (default on)
// Whether launch_overlapped overlaps: overlap_enabled(), every GPU of compute capability 9.0 or
// later (programmatic dependent launch), and device code compiled for 9.0 or later (so that
// wait_for_inputs waits: a PTX build for 8.0 that the driver compiles for a Hopper GPU has no
// wait). Read once.
bool overlapped_launches();

// The dynamic shared memory a block may opt into on every GPU
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on H100/H200 and B200, 163 KB on A100, 99 KB
// on Ada and the RTX Blackwells), or less where FLASHSERVE_CUDA_SHARED_LIMIT (bytes) says so,
// which lets one GPU run the fallbacks a smaller one takes.
std::size_t shared_memory_limit();
// The multiprocessors of the smallest visible GPU (132 on an H200, where the split counts were
// tuned at two blocks each): what the ops that split work across the device aim at. Read once.
std::int64_t multiprocessors();

// A host step that must succeed once per device, such as raising kernels' dynamic shared memory
// limits (cudaFuncSetAttribute is per device): `run(step)` calls step() on the current device
// until it has returned true there, then returns true at once. A failed step clears the CUDA error
// it left (its caller falls back or reports it) and is tried again on the next call.
class OncePerDevice {
 public:
  template <typename Step>
  bool run(Step&& step) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto d = static_cast<std::size_t>(device);
    if (d < done_.size() && done_[d]) return true;
    if (!step()) {
      (void)cudaGetLastError();
      return false;
    }
    if (done_.size() <= d) done_.resize(d + 1, false);
    done_[d] = true;
    return true;
  }

 private:
  std::mutex mutex_;
  std::vector<bool> done_;
};

// Raises `kernel`'s dynamic shared memory limit to `bytes` (past the default 48 KB); false where
// the device refuses or `bytes` exceeds shared_memory_limit() (then nothing is asked of CUDA).
// (The limit counts the kernel's static shared memory too, as the device's does.)
template <typename Kernel>
bool raise_dynamic_shared(Kernel kernel, std::size_t bytes) {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess ||
      bytes + attributes.sharedSizeBytes > shared_memory_limit())
    return false;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes)) == cudaSuccess;
}

// raise_dynamic_shared(kernel, kBytes), once per device.
template <auto kernel, std::size_t kBytes>
bool allow_dynamic_shared() {
  static OncePerDevice once;
  return once.run([] { return raise_dynamic_shared(kernel, kBytes); });
}
// The blocks of `threads` threads and `smem` bytes of dynamic shared memory a multiprocessor holds
// at once for `kernel` (the occupancy calculator, asked once per kernel and size; at least 1).
std::int64_t resident_blocks(const void* kernel, int threads, std::size_t smem);
// The grid of a kernel whose warps walk `units` work units (a row, a group of rows, an item)
// warp, warp + warps, ... (docs/GPU.md step 21): the blocks the multiprocessors hold at once, or
// fewer where the units need fewer; 0 where a multiprocessor holds fewer than `min_blocks`
// (too few warps to hide a unit's round trip: the caller takes its one-unit-a-warp kernel).
unsigned streamed_grid(const void* kernel, int threads, std::size_t smem, std::int64_t units,
                       std::int64_t min_blocks);
// FLASHSERVE_CUDA_MOE_BLOCK, read once (default on): =0 runs moe_block as its sequence of ops.
bool moe_block_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the kernel before it as
// described above (the kernel must call wait_for_inputs before it touches memory).
template <typename... Params, typename... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                              cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = overlapped_launches() ? 1 : 0;
  if (chain_launch_logging())
    log_chain_launch(reinterpret_cast<const void*>(kernel), grid.x * grid.y * grid.z,
                     block.x * block.y * block.z);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The sum of v over this lane and the lanes below it. The whole warp calls it.
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const T n = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += n;
  }
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum over the block of every thread's v, returned to all threads. `shared` holds 32 values.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T r = lane < warps ? shared[lane] : T(0);
    r = warp_sum(r);
    if (lane == 0) shared[0] = r;
  }
  __syncthreads();
  const T r = shared[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? shared[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) shared[0] = r;
  }
  __syncthreads();
  const float r = shared[0];
  __syncthreads();
  return r;
}

// bf16 weights are handled as their 16-bit patterns; widening is exact.
using bf16_bits = std::uint16_t;

__device__ __forceinline__ float widen(float v) {
  return v;
}
__device__ __forceinline__ float widen(bf16_bits h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

// fs::f32_to_bf16 on the device: round to nearest even, NaN stays NaN (same bits).
__device__ __forceinline__ bf16_bits narrow_bf16(float f) {
  const std::uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_bits>((bits + rounding) >> 16);
}

// The CPU's activation formulas (cpu_elementwise.cpp apply_act).
__device__ __forceinline__ float apply_act(float v, Activation act) {
  switch (act) {
    case Activation::kIdentity:
      return v;
    case Activation::kSilu:
      return v / (1.0f + expf(-v));
    case Activation::kSigmoid:
      return 1.0f / (1.0f + expf(-v));
    case Activation::kSoftplus:
      return v > 20.0f ? v : log1pf(expf(v));
    case Activation::kRelu:
      return v > 0.0f ? v : 0.0f;
    case Activation::kSqrtSoftplus:
      return sqrtf(v > 20.0f ? v : log1pf(expf(v)));
  }
  return v;
}

// a / b for non-negative indices below 2^32, in 32 bits: a 64-bit division by a runtime value is
// a software routine of dozens of instructions, and the decode step's small kernels are bound by
// their instructions' latency (ncu, session 35; docs/GPU.md step 24).
__device__ __forceinline__ std::int64_t index_quotient(std::int64_t a, std::int64_t b) {
  return static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(b);
}

// a * b + c rounded twice (no fused multiply-add), as the CPU computes it.
__device__ __forceinline__ float mul_add(float a, float b, float c) {
  return __fadd_rn(__fmul_rn(a, b), c);
}

}  // namespace fs::cuda
