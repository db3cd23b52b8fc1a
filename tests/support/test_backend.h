// The backend a model test runs on: the environment's FLASHSERVE_TEST_BACKEND, else the CPU. ctest
// runs each backend test binary twice, plainly and, where CUDA is built, with
// FLASHSERVE_TEST_BACKEND=cuda (label `gpu`, test names prefixed `cuda.`), where every test is
// skipped, saying why, when no CUDA device is present. By hand:
//   FLASHSERVE_TEST_BACKEND=cuda build/tests/unit/test_qwen
// Weights load as f32 so that both answer to the same fixtures and bounds.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/backend.h"
#include "model/loader.h"

namespace fs::test {

inline std::string test_backend() {
  const char* chosen = std::getenv("FLASHSERVE_TEST_BACKEND");
  return chosen != nullptr && *chosen != '\0' ? chosen : "cpu";
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
