// Proves the CUDA toolchain and build wiring: a kernel runs on the GPU machine. Machines with no
// GPU (CI) skip it, and say so.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_blas.h"
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

// Whether a file whose name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}

// cuBLAS is opened by the first CUDA backend, not at program start (cuda_blas.h): linked, its
// static initialisers took ~0.5 s of every process. A process that has not asked for it (this
// test binary creates no backend) has not mapped it; asked, the loader finds every function the
// backend calls, with or without a GPU.
TEST(CudaBlas, OpenedOnFirstUseNotAtStart) {
  EXPECT_FALSE(mapped("libcublas")) << "cuBLAS was loaded with the program";
  const auto api = cuda::cublas();
  if (!api.ok()) GTEST_SKIP() << api.status().to_string();  // a toolkit without cuBLAS
  EXPECT_TRUE(mapped(cuda::cublas_library_name()));
  const cuda::CublasApi& a = **api;
  EXPECT_NE(a.create, nullptr);
  EXPECT_NE(a.destroy, nullptr);
  EXPECT_NE(a.set_stream, nullptr);
  EXPECT_NE(a.set_math_mode, nullptr);
  EXPECT_NE(a.set_workspace, nullptr);
  EXPECT_NE(a.sgemm, nullptr);
  ASSERT_NE(a.status_string, nullptr);
  EXPECT_STREQ(a.status_string(CUBLAS_STATUS_NOT_INITIALIZED), "the library was not initialized");
  // Loaded once: the same table again.
  const auto again = cuda::cublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *api);
}

}  // namespace
}  // namespace fs
