// A test-only kernel that proves the CUDA toolchain and the build wiring: it runs on the GPU
// machine and reports "no device" elsewhere.
#pragma once

#include <cstddef>
#include <span>

#include "util/status.h"

namespace fs::cuda {

// Number of visible CUDA devices; 0 when there is none or no driver.
int device_count();

// out[i] = a[i] * scale + b[i], computed by a kernel on device 0.
Status smoke_axpy(std::span<const float> a, std::span<const float> b, float scale,
                  std::span<float> out);

// Every pair of e4m3 bytes (index = high byte * 256 + low byte) converted on device 0 as the FP8
// kernels convert them (cuda_gemv.cuh e4m3_pair: the hardware's instruction where the build has
// it) and from the bytes' fields (e4m3_pair_from_fields), each as [65536][2] floats (low, high).
Status e4m3_pairs(std::span<float> kernels, std::span<float> fields);

// __CUDA_ARCH__ of the device code that runs on device 0 (a kernel reports it): 900 for the
// sm_90a build on a Hopper GPU, 800 for an 80-virtual build's PTX compiled there by the driver.
Expected<int> device_code_arch();

// The launch helpers' view of the GPUs (cuda_common.h): whether launches overlap, and the
// dynamic shared memory a block may opt into; and the lowest compute capability present (major *
// 10 + minor; 0 without a GPU).
bool overlapped_launches_here();
std::size_t shared_memory_limit_here();
int lowest_compute_capability();

}  // namespace fs::cuda
