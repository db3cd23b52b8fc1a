// See cuda_backend.h: nvcc's warning 2810 on discarded [[nodiscard]] class values (backend.h
// comes in through the GEMV header).
#pragma nv_diag_suppress 2810
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>

#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/smoke.h"

namespace fs::cuda {
namespace {

__global__ void axpy_kernel(const float* a, const float* b, float scale, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * scale + b[i];
}

__global__ void e4m3_pairs_kernel(float2* kernels, float2* fields) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i > 0xffffu) return;
  kernels[i] = e4m3_pair(static_cast<unsigned short>(i));
  fields[i] = e4m3_pair_from_fields(static_cast<unsigned short>(i));
}

// __CUDA_ARCH__ of the code that runs (0 where it is undefined: never, on a device).
__global__ void compiled_arch_kernel(int* out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__;
#else
  *out = 0;
#endif
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

Status e4m3_pairs(std::span<float> kernels, std::span<float> fields) {
  constexpr std::size_t kFloats = 2 * 65536;
  if (kernels.size() != kFloats || fields.size() != kFloats)
    return invalid_argument("e4m3_pairs: each output holds 65536 pairs");
  if (device_count() == 0) return unsupported("no CUDA device");
  auto dk = device_alloc(kFloats), df = device_alloc(kFloats);
  for (auto* buf : {&dk, &df}) {
    if (!buf->ok()) return buf->status();
  }
  e4m3_pairs_kernel<<<256, 256>>>(reinterpret_cast<float2*>(dk->get()),
                                  reinterpret_cast<float2*>(df->get()));
  if (auto s = check(cudaGetLastError(), "launch"); !s.ok()) return s;
  if (auto s = check(
          cudaMemcpy(kernels.data(), dk->get(), kFloats * sizeof(float), cudaMemcpyDeviceToHost),
          "copy kernels' pairs");
      !s.ok())
    return s;
  return check(
      cudaMemcpy(fields.data(), df->get(), kFloats * sizeof(float), cudaMemcpyDeviceToHost),
      "copy fields' pairs");
}

Expected<int> device_code_arch() {
  if (device_count() == 0) return unsupported("no CUDA device");
  auto d = device_alloc(1);  // a float's four bytes hold the int
  if (!d.ok()) return d.status();
  compiled_arch_kernel<<<1, 1>>>(reinterpret_cast<int*>(d->get()));
  if (auto s = check(cudaGetLastError(), "launch"); !s.ok()) return s;
  int arch = 0;
  if (auto s = check(cudaMemcpy(&arch, d->get(), sizeof(int), cudaMemcpyDeviceToHost), "copy arch");
      !s.ok())
    return s;
  return arch;
}

bool overlapped_launches_here() {
  return overlapped_launches();
}

std::size_t shared_memory_limit_here() {
  return shared_memory_limit();
}

int lowest_compute_capability() {
  int lowest = 0;
  for (int d = 0; d < device_count(); ++d) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess)
      return 0;
    const int cc = major * 10 + minor;
    lowest = d == 0 ? cc : std::min(lowest, cc);
  }
  return lowest;
}

}  // namespace fs::cuda
