// Dense products on OpenBLAS. f32 weights are read in place from the checkpoint mapping; bf16
// weights are widened in tiles of kTileRows rows (exact: bf16 -> f32 is a shift) into a
// thread-local scratch buffer, then multiplied, so the CPU path never doubles the weight memory.
#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace fs {
namespace {

constexpr std::int64_t kTileRows = 64;

// y[:, col0 : col0+n] = x · w_rows^T, w_rows [n, in] f32 contiguous.
void gemm_block(const Tensor& x, const float* w, std::int64_t n, std::int64_t col0, Tensor& y) {
  const auto S = x.rows(), in = x.cols(), out = y.cols();
  // sgemm for every row count (no gemv special case): a row's result then depends less on
  // how many rows share the call, which keeps split and one-call states closer.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(S), static_cast<int>(n),
              static_cast<int>(in), 1.0f, x.data(), static_cast<int>(in), w, static_cast<int>(in),
              0.0f, y.data() + col0, static_cast<int>(out));
}

}  // namespace

void CpuBackend::linear(const Tensor& x, const Weight& w, Tensor& y) {
  const auto out = w.rows(), in = w.cols();
  assert(x.cols() == in);
  Shape shape = x.shape();
  shape.back() = out;
  if (y.shape() != shape) y.reset(shape);
  if (x.rows() == 0) return;
  // f32 weights are used in place when aligned (safetensors does not promise alignment of a
  // tensor that follows an odd-sized bf16 one); otherwise they take the tile path as bf16 does.
  if (w.dtype == DType::kF32 && reinterpret_cast<std::uintptr_t>(w.data) % alignof(float) == 0) {
    gemm_block(x, reinterpret_cast<const float*>(w.data), out, 0, y);
    return;
  }
  thread_local std::vector<float> tile;
  tile.resize(static_cast<std::size_t>(kTileRows * in));
  const auto esize = dtype_size(w.dtype);
  for (std::int64_t r0 = 0; r0 < out; r0 += kTileRows) {
    const auto n = std::min(kTileRows, out - r0);
    convert_to_f32(w.dtype, w.data + static_cast<std::size_t>(r0 * in) * esize, tile.data(),
                   static_cast<std::size_t>(n * in));
    gemm_block(x, tile.data(), n, r0, y);
  }
}

void CpuBackend::add_bias(Tensor& y, std::span<const float> bias) {
  for (std::int64_t r = 0; r < y.rows(); ++r) {
    float* row = y.row(r);
    for (std::int64_t c = 0; c < y.cols(); ++c) row[c] += bias[static_cast<std::size_t>(c)];
  }
}

void cpu_parallel_for(std::int64_t n, double work, const std::function<void(std::int64_t)>& fn) {
  const auto hw = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  // Below ~1 Mflop a thread start costs more than it saves.
  const auto threads = std::min<std::int64_t>({hw, n, work < 1e6 ? 1 : hw});
  if (threads <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::jthread> pool;
  for (std::int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::int64_t i = t; i < n; i += threads) fn(i);
    });
  }
}

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace fs
