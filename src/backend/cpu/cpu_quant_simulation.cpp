// The official graph's numerics (backend.h; backend/quant_simulation.h holds the rounding both
// backends share). Plain loops over rows: the results are exact functions of the inputs (a max,
// butterflies in a fixed order, power-of-two scaling), so they do not depend on the threads.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_simulation.h"

namespace fs {
namespace {

bool power_of_two(std::int64_t n) {
  return n > 0 && (n & (n - 1)) == 0;
}

// The normalised Walsh-Hadamard transform of x[0, n), n a power of two, in place.
void hadamard(float* x, std::int64_t n, float norm) {
  for (std::int64_t stride = 1; stride < n; stride *= 2) {
    for (std::int64_t base = 0; base < n; base += 2 * stride) {
      for (std::int64_t i = base; i < base + stride; ++i) {
        const float a = x[i], b = x[i + stride];
        x[i] = a + b;
        x[i + stride] = a - b;
      }
    }
  }
  for (std::int64_t i = 0; i < n; ++i) x[i] *= norm;
}

}  // namespace

void CpuBackend::fp8_e4m3_simulate(Tensor& x, std::int64_t cols, std::int64_t block) {
  if (failed() || !check(block > 0 && cols >= 0 && cols <= x.cols(), "fp8_e4m3_simulate",
                         "cols must lie in the row and block be positive"))
    return;
  cpu_parallel_ranges(x.rows(), static_cast<double>(x.rows() * cols) * 8,
                      [&](std::int64_t r0, std::int64_t r1) {
                        for (auto r = r0; r < r1; ++r) {
                          float* p = x.row(r);
                          for (std::int64_t b = 0; b < cols; b += block) {
                            const auto end = std::min(cols, b + block);
                            float amax = 0;
                            for (auto c = b; c < end; ++c) amax = std::fmax(amax, std::fabs(p[c]));
                            const int k = quant_sim::fp8_block_exponent(amax);
                            for (auto c = b; c < end; ++c) p[c] = quant_sim::fp8_simulate(p[c], k);
                          }
                        }
                      });
}

void CpuBackend::hadamard_fp4_simulate(Tensor& x, std::int64_t block, std::int64_t fp4_block) {
  if (failed() || !check(power_of_two(block) && x.cols() % block == 0 && fp4_block >= 0,
                         "hadamard_fp4_simulate", "block must be a power of two dividing the row"))
    return;
  const auto norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  const auto groups = x.cols() / block;
  cpu_parallel_ranges(x.rows(), static_cast<double>(x.numel()) * 16,
                      [&](std::int64_t r0, std::int64_t r1) {
                        for (auto r = r0; r < r1; ++r) {
                          for (std::int64_t g = 0; g < groups; ++g) {
                            float* p = x.row(r) + g * block;
                            hadamard(p, block, norm);
                            for (std::int64_t b = 0; fp4_block > 0 && b < block; b += fp4_block) {
                              const auto end = std::min(block, b + fp4_block);
                              float amax = 0;
                              for (auto c = b; c < end; ++c)
                                amax = std::fmax(amax, std::fabs(p[c]));
                              const int k = quant_sim::fp4_block_exponent(amax);
                              for (auto c = b; c < end; ++c)
                                p[c] = quant_sim::fp4_simulate(p[c], k);
                            }
                          }
                        }
                      });
}

}  // namespace fs
