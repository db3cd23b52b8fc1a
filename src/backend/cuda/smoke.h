// A test-only kernel that proves the CUDA toolchain and the build wiring: it runs on the GPU
// machine and reports "no device" elsewhere.
#pragma once

#include <span>

#include "util/status.h"

namespace fs::cuda {

// Number of visible CUDA devices; 0 when there is none or no driver.
int device_count();

// out[i] = a[i] * scale + b[i], computed by a kernel on device 0.
Status smoke_axpy(std::span<const float> a, std::span<const float> b, float scale,
                  std::span<float> out);

}  // namespace fs::cuda
