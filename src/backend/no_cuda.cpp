// A build without nvcc: the CUDA backend is absent, and asking for it says so.
#include "backend/backend.h"

namespace fs {

Expected<std::unique_ptr<Backend>> make_cuda_backend(int) {
  return unsupported(
      "this flashserve was built without CUDA (no nvcc at configure time); use --backend cpu");
}

bool cuda_available() {
  return false;
}

}  // namespace fs
