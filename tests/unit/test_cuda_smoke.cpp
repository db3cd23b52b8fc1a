// Proves the CUDA toolchain and build wiring: a kernel runs on the GPU machine. Machines with no
// GPU (CI) skip it, and say so.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/smoke.h"

namespace fs {
namespace {

TEST(CudaSmoke, AxpyKernelRuns) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const std::size_t n = 100'003;  // not a multiple of the block size
  std::vector<float> a(n), b(n), out(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 97);
    b[i] = static_cast<float>(i % 13);
  }
  const Status s = cuda::smoke_axpy(a, b, 2.0f, out);
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] * 2.0f + b[i]) << i;
}

TEST(CudaSmoke, NoDeviceIsAnErrorNotACrash) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a device is present";
  std::vector<float> a(4), out(4);
  EXPECT_FALSE(cuda::smoke_axpy(a, a, 1.0f, out).ok());
}

}  // namespace
}  // namespace fs
