// cuBLAS, opened when the first CUDA backend is created instead of when the program starts.
//
// Linked at load time, libcublas (and the libcublasLt it needs) ran its static initialisers in
// every process: 0.47 s before main on the 2-core CI machine, whatever the process did. That was
// the cost of `flashserve --version`, of every CPU-only command, and of each of the ~1,500 test
// processes ctest starts (~6 minutes of a CI run). The backend calls seven cuBLAS functions; they
// are looked up once, by their exported names, from the library of the major version the build
// compiled against.
#pragma once

#include <cublas_v2.h>

#include <string>

#include "util/status.h"

namespace fs::cuda {

// The cuBLAS functions the CUDA backend calls (the _v2 entry points that cublas_v2.h's macros
// name).
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The library's file name: libcublas.so.<major of the headers built against>.
std::string cublas_library_name();

// The functions, loaded on the first call (thread-safe) and kept for the process. An error names
// the library that could not be opened or the function it lacks; it is returned again on later
// calls.
Expected<const CublasApi*> cublas();

}  // namespace fs::cuda
