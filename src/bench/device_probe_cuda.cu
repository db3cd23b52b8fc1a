// nvcc reports every discarded [[nodiscard]] class value, assignments included (as in
// backend/cuda/cuda_backend.h); the host compiler checks the real cases.
#pragma nv_diag_suppress 2810

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "bench/device_probe.h"

namespace fs::bench {
namespace {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return internal_error(std::string("bench: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

Expected<std::size_t> device_free_bytes() {
  std::size_t free = 0, total = 0;
  if (auto s = cuda_status(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"); !s.ok()) return s;
  return free;
}

Expected<double> copy_bandwidth(std::size_t bytes, int repeats) {
  void* a = nullptr;
  void* b = nullptr;
  if (auto s = cuda_status(cudaMalloc(&a, bytes), "cudaMalloc"); !s.ok()) return s;
  if (auto s = cuda_status(cudaMalloc(&b, bytes), "cudaMalloc"); !s.ok()) {
    cudaFree(a);
    return s;
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaMemsetAsync(a, 1, bytes, stream);
  float best = 1e30f;
  Status status;
  for (int i = 0; i < repeats + 1 && status.ok(); ++i) {  // the first copy warms up
    cudaEventRecord(t0, stream);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(t1, stream);
    status = cuda_status(cudaEventSynchronize(t1), "copy");
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    if (i > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(stream);
  cudaFree(a);
  cudaFree(b);
  if (!status.ok()) return status;
  return 2.0 * static_cast<double>(bytes) / (1e-3 * static_cast<double>(best));
}

// Errors are ignored: with no profiler attached the calls have nothing to do.
void profiler_range_begin() {
  static_cast<void>(cudaProfilerStart());
}
void profiler_range_end() {
  static_cast<void>(cudaProfilerStop());
}

}  // namespace fs::bench
