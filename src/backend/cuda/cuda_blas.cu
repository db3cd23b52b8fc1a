// cuBLAS opened on first use (cuda_blas.h).
#include <dlfcn.h>

#include <mutex>

#include "backend/cuda/cuda_blas.h"

namespace fs::cuda {
namespace {

// The looked-up functions, or the reason there are none. The library stays open for the process:
// backends created later, on any thread, use the same entry points.
struct Loaded {
  CublasApi api;
  Status error;
};

// Sets `fn` to the library's exported `name`; false when it lacks it.
template <typename F>
bool find(void* library, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(library, name));
  return fn != nullptr;
}

Loaded load() {
  const std::string name = cublas_library_name();
  // RTLD_LOCAL: its symbols are reached only through the table; RTLD_NOW: a broken install is
  // found here, not at the first product.
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return {CublasApi{}, unsupported("cuda: cannot open " + name +
                                     " (cuBLAS): " + (why != nullptr ? why : "unknown error"))};
  }
  CublasApi a;
  const std::pair<const char*, bool> symbols[] = {
      {"cublasCreate_v2", find(library, "cublasCreate_v2", a.create)},
      {"cublasDestroy_v2", find(library, "cublasDestroy_v2", a.destroy)},
      {"cublasSetStream_v2", find(library, "cublasSetStream_v2", a.set_stream)},
      {"cublasSetMathMode", find(library, "cublasSetMathMode", a.set_math_mode)},
      {"cublasSetWorkspace_v2", find(library, "cublasSetWorkspace_v2", a.set_workspace)},
      {"cublasSgemm_v2", find(library, "cublasSgemm_v2", a.sgemm)},
      {"cublasGetStatusString", find(library, "cublasGetStatusString", a.status_string)},
  };
  for (const auto& [symbol, found] : symbols)
    if (!found) return {CublasApi{}, unsupported("cuda: " + name + " has no " + symbol)};
  return {a, Status{}};
}

}  // namespace

std::string cublas_library_name() {
  return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
}

Expected<const CublasApi*> cublas() {
  static const Loaded loaded = load();  // once, thread-safe (a function-local static)
  if (!loaded.error.ok()) return loaded.error;
  return &loaded.api;
}

}  // namespace fs::cuda
