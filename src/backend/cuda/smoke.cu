#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backend/cuda/smoke.h"

namespace fs::cuda {
namespace {

__global__ void axpy_kernel(const float* a, const float* b, float scale, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * scale + b[i];
}

struct DeviceFree {
  void operator()(float* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<float, DeviceFree>;

Expected<DeviceBuffer> device_alloc(std::size_t n) {
  float* p = nullptr;
  if (const auto e = cudaMalloc(&p, n * sizeof(float)); e != cudaSuccess) {
    return internal_error(std::string("cudaMalloc: ") + cudaGetErrorString(e));
  }
  return DeviceBuffer(p);
}

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

Status smoke_axpy(std::span<const float> a, std::span<const float> b, float scale,
                  std::span<float> out) {
  if (a.size() != b.size() || a.size() != out.size())
    return invalid_argument("smoke_axpy: sizes differ");
  if (device_count() == 0) return unsupported("no CUDA device");
  const std::size_t n = a.size();
  auto da = device_alloc(n), db = device_alloc(n), dout = device_alloc(n);
  for (auto* buf : {&da, &db, &dout}) {
    if (!buf->ok()) return buf->status();
  }
  if (auto s = check(cudaMemcpy(da->get(), a.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                     "copy a");
      !s.ok())
    return s;
  if (auto s = check(cudaMemcpy(db->get(), b.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                     "copy b");
      !s.ok())
    return s;
  const int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads);
  axpy_kernel<<<blocks, threads>>>(da->get(), db->get(), scale, dout->get(), static_cast<int>(n));
  if (auto s = check(cudaGetLastError(), "launch"); !s.ok()) return s;
  return check(cudaMemcpy(out.data(), dout->get(), n * sizeof(float), cudaMemcpyDeviceToHost),
               "copy out");
}

}  // namespace fs::cuda
