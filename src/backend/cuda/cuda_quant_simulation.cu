// The official graph's numerics on the device (backend.h; backend/quant_simulation.h holds the
// rounding the CPU shares, so both give the same bits). A warp per FP8 block; a thread block per
// Hadamard group, whose butterflies run in shared memory in the CPU's order, each an exactly
// rounded add or subtract.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/quant_simulation.h"

namespace fs::cuda {
namespace {

// Warp w takes block w % per_row of row w / per_row: columns [b0, min(cols, b0 + block)).
__global__ void fp8_e4m3_simulate_kernel(float* x, std::int64_t row_width, std::int64_t cols,
                                         std::int64_t block, std::int64_t per_row,
                                         std::int64_t warps) {
  const std::int64_t w = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (w >= warps) return;  // whole warps: blockDim is a multiple of 32
  const int lane = threadIdx.x % kWarp;
  float* p = x + (w / per_row) * row_width;
  const std::int64_t b0 = (w % per_row) * block, end = min(cols, b0 + block);
  float amax = 0;
  for (std::int64_t c = b0 + lane; c < end; c += kWarp) amax = fmaxf(amax, fabsf(p[c]));
  const int k = quant_sim::fp8_block_exponent(warp_max(amax));
  for (std::int64_t c = b0 + lane; c < end; c += kWarp) p[c] = quant_sim::fp8_simulate(p[c], k);
}

// Thread block g transforms x[g * block, (g + 1) * block) (the groups tile the rows); then each
// thread rounds whole FP4 blocks.
__global__ void hadamard_fp4_simulate_kernel(float* x, std::int64_t block, float norm,
                                             std::int64_t fp4_block) {
  extern __shared__ float s[];
  float* g = x + static_cast<std::int64_t>(blockIdx.x) * block;
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) s[i] = g[i];
  __syncthreads();
  for (std::int64_t stride = 1; stride < block; stride *= 2) {
    for (std::int64_t i = threadIdx.x; i < block / 2; i += blockDim.x) {
      const std::int64_t j = (i / stride) * 2 * stride + i % stride;
      const float a = s[j], b = s[j + stride];
      s[j] = __fadd_rn(a, b);
      s[j + stride] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) s[i] = __fmul_rn(s[i], norm);
  __syncthreads();
  if (fp4_block > 0) {
    for (std::int64_t b = threadIdx.x * fp4_block; b < block;
         b += static_cast<std::int64_t>(blockDim.x) * fp4_block) {
      const std::int64_t end = min(block, b + fp4_block);
      float amax = 0;
      for (std::int64_t c = b; c < end; ++c) amax = fmaxf(amax, fabsf(s[c]));
      const int k = quant_sim::fp4_block_exponent(amax);
      for (std::int64_t c = b; c < end; ++c) s[c] = quant_sim::fp4_simulate(s[c], k);
    }
    __syncthreads();
  }
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) g[i] = s[i];
}

}  // namespace

void CudaBackend::fp8_e4m3_simulate(Tensor& x, std::int64_t cols, std::int64_t block) {
  constexpr const char* kOp = "fp8_e4m3_simulate";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(block > 0 && cols >= 0 && cols <= x.cols(), kOp,
             "cols must lie in the row and block be positive"))
    return;
  if (x.rows() == 0 || cols == 0 || walking()) return;
  const auto per_row = (cols + block - 1) / block, warps = x.rows() * per_row;
  constexpr int kThreads = 128;
  fp8_e4m3_simulate_kernel<<<grid_for(warps * kWarp, kThreads), kThreads, 0, stream()>>>(
      x.data(), x.cols(), cols, block, per_row, warps);
  launched(kOp);
}

void CudaBackend::hadamard_fp4_simulate(Tensor& x, std::int64_t block, std::int64_t fp4_block) {
  constexpr const char* kOp = "hadamard_fp4_simulate";
  if (failed() || !on_device(kOp, {&x})) return;
  const bool power_of_two = block > 0 && (block & (block - 1)) == 0;
  if (!check(power_of_two && x.cols() % block == 0 && fp4_block >= 0, kOp,
             "block must be a power of two dividing the row"))
    return;
  const auto smem = static_cast<std::size_t>(block) * sizeof(float);
  if (!check(smem <= 48 * 1024, kOp, "the Hadamard block does not fit in shared memory")) return;
  const auto groups = x.rows() * (x.cols() / block);
  if (groups == 0 || walking()) return;
  const auto norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  hadamard_fp4_simulate_kernel<<<static_cast<unsigned>(groups), 128, smem, stream()>>>(
      x.data(), block, norm, fp4_block);
  launched(kOp);
}

}  // namespace fs::cuda
