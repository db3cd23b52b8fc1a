// The device half of fill_uniform: the same hash as uniform_value, one thread per element.
// nvcc reports every discarded [[nodiscard]] class value, assignments included (as in
// backend/cuda/cuda_backend.h); the host compiler checks the real cases.
#pragma nv_diag_suppress 2810

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_memory.h"
#include "bench/fill.h"

namespace fs::bench {
namespace {

__device__ float device_uniform(std::uint64_t seed, std::uint64_t index, float scale,
                                float offset) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return offset + scale * (2.0f * u - 1.0f);
}

// Round to nearest even, as fs::f32_to_bf16 (the values are finite).
__device__ std::uint16_t to_bf16(float f) {
  const std::uint32_t b = __float_as_uint(f);
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// Element types: 0 f32, 1 bf16, 2 e4m3 (round to nearest even, saturated, as the host's
// quant::f32_to_e4m3_saturate).
__global__ void fill_kernel(void* out, int type, std::uint64_t n, std::uint64_t seed, float scale,
                            float offset) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float v = device_uniform(seed, i, scale, offset);
    if (type == 1) {
      static_cast<std::uint16_t*>(out)[i] = to_bf16(v);
    } else if (type == 2) {
      static_cast<std::uint8_t*>(out)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

// A thread per block of f.block_bytes bytes: hashed bytes, then the block's f16 factors.
__global__ void fill_packed_kernel(std::uint8_t* out, std::uint64_t blocks, PackedFill f,
                                   std::uint64_t seed) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const auto bytes = static_cast<std::uint64_t>(f.block_bytes);
  for (std::uint64_t b = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
       b < blocks; b += stride) {
    std::uint8_t* p = out + b * bytes;
    for (std::uint64_t i = 0; i < bytes; ++i) {
      const float u = device_uniform(seed, b * bytes + i, 1.0f, 1.0f);  // [0, 2)
      p[i] = f.constant >= 0 ? static_cast<std::uint8_t>(f.constant)
                             : static_cast<std::uint8_t>(static_cast<int>(u * 128.0f) & 0xff);
    }
    for (int k = 0; k < 2; ++k)
      if (f.f16_offset[k] >= 0) {
        p[f.f16_offset[k]] = static_cast<std::uint8_t>(f.f16_bits[k] & 0xff);
        p[f.f16_offset[k] + 1] = static_cast<std::uint8_t>(f.f16_bits[k] >> 8);
      }
  }
}

}  // namespace

Status fill_packed_cuda(Tensor& t, const PackedFill& f, std::uint64_t seed) {
  auto* memory = dynamic_cast<cuda::CudaMemory*>(t.memory().get());
  if (memory == nullptr) return invalid_argument("bench: fill_packed: not CUDA memory");
  const auto blocks =
      static_cast<std::uint64_t>(t.bytes()) / static_cast<std::uint64_t>(f.block_bytes);
  if (blocks == 0) return {};
  fill_packed_kernel<<<132 * 16, 256, 0, memory->stream()>>>(static_cast<std::uint8_t*>(t.raw()),
                                                             blocks, f, seed);
  if (const auto e = cudaGetLastError(); e != cudaSuccess)
    return internal_error(std::string("bench: fill_packed kernel: ") + cudaGetErrorString(e));
  return {};
}

Status fill_uniform_cuda(Tensor& t, std::uint64_t seed, float scale, float offset) {
  auto* memory = dynamic_cast<cuda::CudaMemory*>(t.memory().get());
  if (memory == nullptr) return invalid_argument("bench: fill_uniform: not CUDA memory");
  const auto n = static_cast<std::uint64_t>(t.numel());
  if (n == 0) return {};
  const int type = t.dtype() == DType::kBF16 ? 1 : (t.dtype() == DType::kF8E4M3 ? 2 : 0);
  fill_kernel<<<132 * 16, 256, 0, memory->stream()>>>(t.raw(), type, n, seed, scale, offset);
  if (const auto e = cudaGetLastError(); e != cudaSuccess)
    return internal_error(std::string("bench: fill kernel: ") + cudaGetErrorString(e));
  return {};
}

}  // namespace fs::bench
