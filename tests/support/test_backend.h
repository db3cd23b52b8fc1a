// The backend a model test runs on. The same test sources build twice: as `test_x` on the CPU,
// and as `test_x_cuda` (compiled with FLASHSERVE_TEST_BACKEND="cuda", ctest label `gpu`, test
// names prefixed `cuda.`) on the GPU, where every test is skipped, saying why, when no CUDA
// device is present. Weights load as f32 so that both answer to the same fixtures and bounds.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "backend/backend.h"
#include "model/loader.h"

#ifndef FLASHSERVE_TEST_BACKEND
#define FLASHSERVE_TEST_BACKEND "cpu"
#endif

namespace fs::test {

inline std::string test_backend() {
  return FLASHSERVE_TEST_BACKEND;
}

inline LoadOptions test_load_options(const std::string& dtype = "f32") {
  return {test_backend(), dtype};
}

// Skips the whole binary when it targets a GPU that is not there.
class BackendPresent : public ::testing::Environment {
 public:
  void SetUp() override {
    if (test_backend() == "cuda" && !cuda_available())
      GTEST_SKIP() << "no CUDA device: the gpu-labelled tests run on a machine with a GPU";
  }
};

// gtest owns registered environments (its API takes a raw pointer and deletes it at exit).
inline ::testing::Environment* const kBackendPresent =
    ::testing::AddGlobalTestEnvironment(new BackendPresent);

}  // namespace fs::test
