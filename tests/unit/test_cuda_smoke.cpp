// Proves the CUDA toolchain and build wiring: a kernel runs on the GPU machine. Machines with no
// GPU (CI) skip it, and say so.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_blas.h"
#include "backend/cuda/smoke.h"
#include "tensor/dtype.h"

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

// The FP8 kernels' e4m3 pairs (the hardware's conversion on sm_89 and later) equal the pairs built
// from the bytes' fields (what the kernels compute before sm_89) and the CPU's decode, for all
// 65,536 pairs: a build for an older GPU computes the same weights.
TEST(CudaFp8, ThePairConversionEqualsTheFields) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  std::vector<float> kernels(2 * 65536), fields(2 * 65536);
  const Status s = cuda::e4m3_pairs(kernels, fields);
  ASSERT_TRUE(s.ok()) << s.to_string();
  int nan_pairs = 0;
  for (unsigned i = 0; i < 65536; ++i)
    for (unsigned half = 0; half < 2; ++half) {
      const float k = kernels[2 * i + half], f = fields[2 * i + half];
      const float cpu = f8e4m3_to_f32(static_cast<std::uint8_t>(half == 0 ? i & 0xff : i >> 8));
      if (std::isnan(cpu)) {
        ASSERT_TRUE(std::isnan(k) && std::isnan(f)) << i << " " << half;
        ++nan_pairs;
        continue;
      }
      ASSERT_EQ(std::bit_cast<std::uint32_t>(k), std::bit_cast<std::uint32_t>(cpu))
          << i << " " << half;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(f), std::bit_cast<std::uint32_t>(cpu))
          << i << " " << half;
    }
  EXPECT_EQ(nan_pairs, 2 * 2 * 256);  // 0x7f and 0xff in either byte
}

// FLASHSERVE_CUDA_SHARED_LIMIT lowers the shared memory the kernels may opt into (so one GPU runs
// the fallbacks a smaller one takes), and launches overlap on Hopper and later only, with device
// code that can wait for them (an 80-virtual build on a Hopper GPU launched its kernels
// overlapped without the wait; GLM 5's split prefill diverged there, session 29).
TEST(CudaDevice, TheSharedMemoryLimitCanBeLowered) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  ::unsetenv("FLASHSERVE_CUDA_SHARED_LIMIT");
  const std::size_t device = cuda::shared_memory_limit_here();
  EXPECT_GE(device, std::size_t{99} * 1024);  // every GPU of compute capability 8.0 or later
  ::setenv("FLASHSERVE_CUDA_SHARED_LIMIT", "101376", 1);
  EXPECT_EQ(cuda::shared_memory_limit_here(), std::min<std::size_t>(device, 101376));
  ::unsetenv("FLASHSERVE_CUDA_SHARED_LIMIT");
  EXPECT_EQ(cuda::shared_memory_limit_here(), device);
  const char* overlap = std::getenv("FLASHSERVE_CUDA_OVERLAP");
  if (overlap == nullptr || std::string(overlap) != "0") {
    const auto arch = cuda::device_code_arch();
    ASSERT_TRUE(arch.ok()) << arch.status().to_string();
    EXPECT_GE(*arch, 800);
    EXPECT_EQ(cuda::overlapped_launches_here(),
              cuda::lowest_compute_capability() >= 90 && *arch >= 900)
        << "compute capability " << cuda::lowest_compute_capability() << ", device code " << *arch;
  }
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
