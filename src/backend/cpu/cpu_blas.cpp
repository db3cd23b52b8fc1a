// OpenBLAS setup for the CPU backend, once per process, before its first product.
//
// Kernels for this CPU: a DYNAMIC_ARCH OpenBLAS picks its kernels by CPU model when it loads,
// and one older than the CPU does not know the model and falls back to SSE3 ("Prescott"):
// Debian 12's 0.3.21 does so on the 2-core development VM (Intel family 6 model 207), where its
// sgemm then runs 6-8x slower than the AVX-512 kernels the CPU has. So when OPENBLAS_CORETYPE
// is unset (the user's choice wins) and the kernels in use are of an older instruction set than
// the CPU supports, the library is re-initialised for the best core of that set it has. The
// re-initialisation uses OpenBLAS's own exported entry points (the same path its load-time
// constructor takes), declared weak: a build without DYNAMIC_ARCH lacks them and is left as is.
//
// Threads: one BLAS thread. The backend splits products over its own pool (cpu_threads.cpp),
// so OpenBLAS's workers do not spin beside ours on a small machine.
#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "backend/cpu/cpu_backend.h"

extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace fs {
namespace {

// Instruction-set level of an x86-64 OpenBLAS core: 1 SSE, 2 AVX, 3 AVX2+FMA, 4 AVX-512;
// 0 for a name not listed (left alone).
int core_level(const std::string& name) {
  static constexpr struct {
    const char* name;
    int level;
  } kCores[] = {{"prescott", 1},      {"core2", 1},      {"penryn", 1},      {"dunnington", 1},
                {"nehalem", 1},       {"atom", 1},       {"nano", 1},        {"opteron", 1},
                {"opteron_sse3", 1},  {"barcelona", 1},  {"bobcat", 1},      {"sandybridge", 2},
                {"bulldozer", 2},     {"piledriver", 2}, {"steamroller", 2}, {"excavator", 2},
                {"haswell", 3},       {"zen", 3},        {"skylakex", 4},    {"cooperlake", 4},
                {"sapphirerapids", 4}};
  for (const auto& c : kCores)
    if (strcasecmp(name.c_str(), c.name) == 0) return c.level;
  return 0;
}

void choose_blas_kernels() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
  __builtin_cpu_init();
  const char* want = nullptr;
  int want_level = 0;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    want = "SkylakeX";
    want_level = 4;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    want = "Haswell";
    want_level = 3;
  }
  const int have = core_level(openblas_get_corename());
  if (want == nullptr || have == 0 || have >= want_level) return;
  // gotoblas_dynamic_init reads OPENBLAS_CORETYPE; the variable is removed again so that child
  // processes choose for themselves.
  setenv("OPENBLAS_CORETYPE", want, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
#endif
}

}  // namespace

void cpu_blas_setup() {
  static std::once_flag once;
  std::call_once(once, [] {
    choose_blas_kernels();
    openblas_set_num_threads(1);
  });
}

namespace {
// Also at start-up, before main: the process has one thread then, so the setenv above cannot race
// another thread's getenv. (OpenBLAS, a shared library, is initialised before this runs.)
const bool kSetUpAtStart = (cpu_blas_setup(), true);
}  // namespace

std::string cpu_blas_kernels() {
  return openblas_get_corename();
}

}  // namespace fs
