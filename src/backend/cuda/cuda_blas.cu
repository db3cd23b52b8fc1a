// cuBLAS opened on first use (cuda_blas.h).
#include <dlfcn.h>

#include <string>

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
  const char* missing = nullptr;  // the first function the library lacks
  const auto need = [&](const char* symbol, auto& fn) {
    if (!find(library, symbol, fn) && missing == nullptr) missing = symbol;
  };
  need("cublasCreate_v2", a.create);
  need("cublasDestroy_v2", a.destroy);
  need("cublasSetStream_v2", a.set_stream);
  need("cublasSetMathMode", a.set_math_mode);
  need("cublasSetWorkspace_v2", a.set_workspace);
  need("cublasSgemm_v2", a.sgemm);
  need("cublasGetStatusString", a.status_string);
  if (missing != nullptr) return {CublasApi{}, unsupported("cuda: " + name + " has no " + missing)};
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
