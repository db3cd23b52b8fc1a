// Dense products on OpenBLAS. f32 weights are read in place from the checkpoint mapping; bf16
// weights are widened in tiles of at most 1 MiB (exact: bf16 -> f32 is a shift) into a
// thread-local scratch buffer, then multiplied, so the CPU path never doubles the weight memory.
// Block-scaled FP8/FP4 and the GGUF block types take the same tiles, each row dequantised by the
// quant module (Weight::dequantize_row: e4m3 * its block's scale, a GGUF block by its definition),
// so a product equals the f32 product with the matrix dequantised whole.
// Also: `upload`, and the routed experts of a MoE (a product per expert).
#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "tensor/quant/block_scaled.h"

namespace fs {
namespace {

// A bf16 weight is widened in tiles of at most kTileFloats floats (1 MiB), at least kTileRows
// rows, per thread: large enough that sgemm runs at full speed, small enough to stay in cache.
constexpr std::int64_t kTileRows = 64;
constexpr std::int64_t kTileFloats = 1 << 18;

// y[r, col0 : col0+n] = x[r, :] · w_rows^T for the `rows` rows of x from x_row0, w_rows [n, in]
// f32 contiguous.
void gemm_block(const Tensor& x, std::int64_t x_row0, std::int64_t rows, const float* w,
                std::int64_t n, std::int64_t col0, Tensor& y) {
  const auto in = x.cols(), out = y.cols();
  // sgemm for every row count (no gemv special case): a row's result then depends less on
  // how many rows share the call, which keeps split and one-call states closer.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(n),
              static_cast<int>(in), 1.0f, x.data() + x_row0 * in, static_cast<int>(in), w,
              static_cast<int>(in), 0.0f, y.data() + x_row0 * out + col0, static_cast<int>(out));
}

// Elements converted per parallel job by `upload` (a load-time pass over whole matrices).
constexpr std::int64_t kConvertChunk = 1 << 20;

}  // namespace

Expected<Weight> CpuBackend::upload(const Weight& w, DType matrix_dtype) {
  if (w.empty()) return w;
  if (w.device != Device::kHost)
    return invalid_argument("cpu backend: cannot upload a weight held in " + device_name(w.device) +
                            " memory");
  // Index tables (DeepSeek V4's tid2eid) are read as they are stored, int32 or int64.
  if (w.dtype == DType::kI32 || w.dtype == DType::kI64) return w;
  // Packed and block-scaled matrices stay as stored: `linear`, `moe_experts` and `embedding`
  // dequantise their rows as they go; the other ops refuse them by name.
  if (w.is_packed() || w.block_scaled()) {
    if (auto st = w.check_storage(); !st.ok()) return st.with_context("cpu upload");
    if (w.shape.size() < 2)
      return unsupported("cpu upload: a " + w.format_name() + " vector of shape " +
                         shape_to_string(w.shape) + " (vectors are F32, BF16 or F16)");
    return w;
  }
  if (matrix_dtype != DType::kF32 && matrix_dtype != DType::kBF16)
    return invalid_argument("cpu backend: matrices are stored as F32 or BF16, not " +
                            std::string(dtype_name(matrix_dtype)));
  if (!dtype_is_float(w.dtype))
    return invalid_argument("cpu backend: weight of shape " + shape_to_string(w.shape) +
                            " has the non-float dtype " + std::string(dtype_name(w.dtype)));
  const auto n = w.numel();
  const auto chunks = (n + kConvertChunk - 1) / kConvertChunk;
  if (w.shape.size() >= 2) {
    // bf16 (and f16/f8) matrices are widened per tile by `linear`, so they stay as they are even
    // when f32 is asked for; only an f32 matrix stored as bf16 is converted.
    if (w.dtype != DType::kF32 || matrix_dtype != DType::kBF16) return w;
    std::vector<std::uint16_t>* dst;
    {
      const std::lock_guard lock(owned_mutex_);
      dst = &owned_bf16_.emplace_back(static_cast<std::size_t>(n));
    }
    const float* src = w.f32();
    cpu_parallel_for(chunks, static_cast<double>(n), [&](std::int64_t c) {
      const auto end = std::min(n, (c + 1) * kConvertChunk);
      for (auto i = c * kConvertChunk; i < end; ++i)
        (*dst)[static_cast<std::size_t>(i)] = f32_to_bf16(src[i]);
    });
    return Weight{DType::kBF16, w.shape, reinterpret_cast<const std::uint8_t*>(dst->data()),
                  Device::kHost};
  }
  // Vectors stay (or become) f32.
  if (w.dtype == DType::kF32 && reinterpret_cast<std::uintptr_t>(w.data) % alignof(float) == 0)
    return Weight{w.dtype, Shape(w.shape.begin(), w.shape.end()), w.data, w.device};
  std::vector<float>* dst;
  {
    const std::lock_guard lock(owned_mutex_);
    dst = &owned_f32_.emplace_back(static_cast<std::size_t>(n));
  }
  convert_to_f32(w.dtype, w.data, dst->data(), static_cast<std::size_t>(n));
  return Weight{DType::kF32, w.shape, reinterpret_cast<const std::uint8_t*>(dst->data()),
                Device::kHost};
}

bool CpuBackend::check_vector(const Weight& w, const char* op) {
  if (w.dtype == DType::kF32 && !w.is_packed() && w.device == Device::kHost) return true;
  fail(invalid_argument(std::string("cpu backend: ") + op + " needs an f32 host vector, got " +
                        w.format_name() + " in " + device_name(w.device) +
                        " memory (upload it first)"));
  return false;
}

bool CpuBackend::check_elements(const Weight& w, const char* op) {
  if (!w.is_packed() && !w.block_scaled() && dtype_is_float(w.dtype)) return true;
  fail(unsupported_format(std::string("cpu backend: ") + op, w, "F32/BF16/F16 weights"));
  return false;
}

// The product is split over the pool by output columns (weight rows) when there are enough of
// them, so each thread widens only its own part of a bf16 weight, else by rows of x. Either way
// every output element is one sgemm dot product over `in`, whatever the split.
void CpuBackend::linear(const Tensor& x, const Weight& w, Tensor& y) {
  if (failed()) return;
  const auto out = w.rows(), in = w.cols(), S = x.rows();
  assert(x.cols() == in && w.device == Device::kHost);
  Shape shape = x.shape();
  shape.back() = out;
  if (!ensure(y, std::move(shape))) return;
  if (S == 0) return;
  // f32 weights are used in place when aligned (safetensors does not promise alignment of a
  // tensor that follows an odd-sized bf16 one); otherwise they take the tile path as bf16 does.
  const bool in_place =
      w.dtype == DType::kF32 && reinterpret_cast<std::uintptr_t>(w.data) % alignof(float) == 0;
  const auto esize = dtype_size(w.dtype);
  // Scaled or packed rows go through the quant module's dequantiser, the others are converted.
  const bool decode = w.block_scaled() || w.is_packed();
  if (decode && w.shape.size() != 2)
    return fail(invalid_argument("cpu linear: a " + w.format_name() +
                                 " weight must be a 2-D matrix, not " + shape_to_string(w.shape)));
  if (decode) {
    if (auto st = w.check_storage(); !st.ok()) return fail(st.with_context("cpu linear"));
  } else if (!dtype_is_float(w.dtype)) {
    return fail(unsupported_format("cpu linear", w, "float weights"));
  }
  const auto tile_rows = std::max(kTileRows, kTileFloats / std::max<std::int64_t>(in, 1));
  // Weight rows [n0, n1) times rows [r0, r1) of x.
  auto part = [&](std::int64_t r0, std::int64_t r1, std::int64_t n0, std::int64_t n1) {
    if (in_place) return gemm_block(x, r0, r1 - r0, w.f32() + n0 * in, n1 - n0, n0, y);
    thread_local std::vector<float> tile;
    for (auto t0 = n0; t0 < n1; t0 += tile_rows) {
      const auto n = std::min(tile_rows, n1 - t0);
      tile.resize(static_cast<std::size_t>(n * in));
      if (decode) {
        for (std::int64_t r = 0; r < n; ++r) {
          auto row = std::span<float>(tile).subspan(static_cast<std::size_t>(r * in),
                                                    static_cast<std::size_t>(in));
          if (auto st = w.dequantize_row(t0 + r, row); !st.ok()) {
            const std::lock_guard lock(owned_mutex_);
            fail(st.with_context("cpu linear"));
            return;
          }
        }
      } else {
        convert_to_f32(w.dtype, w.data + static_cast<std::size_t>(t0 * in) * esize, tile.data(),
                       static_cast<std::size_t>(n * in));
      }
      gemm_block(x, r0, r1 - r0, tile.data(), n, t0, y);
    }
  };
  const double work = 2.0 * static_cast<double>(S) * static_cast<double>(out * in);
  constexpr std::int64_t kAlign = 16;  // column parts start on a multiple of 16 weight rows
  if (out >= 2 * kTileRows) {
    const auto groups = (out + kAlign - 1) / kAlign;
    cpu_parallel_ranges(
        groups, work,
        [&](std::int64_t g0, std::int64_t g1) {
          part(0, S, g0 * kAlign, std::min(out, g1 * kAlign));
        },
        /*per_thread=*/1);
  } else {
    cpu_parallel_ranges(
        S, work, [&](std::int64_t r0, std::int64_t r1) { part(r0, r1, 0, out); },
        /*per_thread=*/1);
  }
}

void CpuBackend::add_bias(Tensor& y, const Weight& bias) {
  if (failed() || !check_vector(bias, "add_bias")) return;
  const float* b = bias.f32();
  for (std::int64_t r = 0; r < y.rows(); ++r) {
    float* row = y.row(r);
    for (std::int64_t c = 0; c < y.cols(); ++c) row[c] += b[c];
  }
}

namespace {
// gate <= L and up in [-L, L], the two halves of each row of gu (the clamped SwiGLU).
void clamp_gate_up(Tensor& gu, float limit) {
  const auto half = gu.cols() / 2;
  for (std::int64_t r = 0; r < gu.rows(); ++r) {
    float* p = gu.row(r);
    for (std::int64_t c = 0; c < half; ++c) p[c] = std::min(p[c], limit);
    for (std::int64_t c = half; c < 2 * half; ++c) p[c] = std::min(std::max(p[c], -limit), limit);
  }
}
}  // namespace

// The per-expert loop the model ran before this op existed, kept so the result is bit-identical:
// each expert gathers its tokens in increasing order, runs gate_up, swiglu_packed and down as
// products over just those rows, and its weighted rows are added into y in increasing expert id.
// Tokens are bucketed by expert in one pass (stable, so the row order is unchanged).
void CpuBackend::moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                             const Tensor& experts, const Tensor& weights, float swiglu_limit,
                             Tensor& y) {
  if (failed()) return;
  assert(experts.dtype() == DType::kI32 && weights.dtype() == DType::kF32);
  assert(experts.shape() == weights.shape() && experts.rows() == x.rows());
  assert(gate_up.shape.size() == 3 && down.shape.size() == 3);
  const auto S = x.rows(), H = x.cols(), k = experts.cols(), E = gate_up.shape[0];
  if (!ensure(y, {S, H})) return;
  std::fill(y.data(), y.data() + y.numel(), 0.0f);
  const auto* ids = experts.data_as<std::int32_t>();
  const float* wts = weights.data();
  // CSR of (token, weight) per expert.
  std::vector<std::int64_t> start(static_cast<std::size_t>(E + 1), 0);
  for (std::int64_t i = 0; i < S * k; ++i) {
    const auto e = ids[i];
    if (e >= 0 && e < E) ++start[static_cast<std::size_t>(e) + 1];
  }
  for (std::int64_t e = 0; e < E; ++e)
    start[static_cast<std::size_t>(e + 1)] += start[static_cast<std::size_t>(e)];
  std::vector<std::int64_t> fill(start.begin(), start.end() - 1);
  std::vector<std::int32_t> rows(static_cast<std::size_t>(start.back()));
  std::vector<float> row_w(rows.size());
  for (std::int64_t i = 0; i < S * k; ++i) {
    const auto e = ids[i];
    if (e < 0 || e >= E) continue;
    const auto at = static_cast<std::size_t>(fill[static_cast<std::size_t>(e)]++);
    rows[at] = static_cast<std::int32_t>(i / k);
    row_w[at] = wts[i];
  }
  // Experts run on the pool, one job each (their products then run inline on that thread); each
  // writes its weighted rows to its own slice of `out`, and the rows are added into y afterwards
  // in increasing expert id, so y is the same sum in the same order as the per-expert loop.
  std::vector<float> out(static_cast<std::size_t>(start.back() * H));
  std::vector<Status> errors(static_cast<std::size_t>(E));
  const double work = 2.0 * static_cast<double>(start.back()) *
                      static_cast<double>(gate_up.shape[1] * H + H * down.shape[2]);
  cpu_parallel_for(E, work, [&](std::int64_t e) {
    const auto b = start[static_cast<std::size_t>(e)],
               n = start[static_cast<std::size_t>(e) + 1] - b;
    if (n == 0) return;
    // A backend of its own per job: the products' failures are recorded there, then collected.
    CpuBackend local;
    Tensor xe, gu, act, he;
    if (!local.ensure(xe, {n, H})) return;
    for (std::int64_t i = 0; i < n; ++i)
      std::copy_n(x.row(rows[static_cast<std::size_t>(b + i)]), H, xe.row(i));
    local.linear(xe, gate_up.expert(e), gu);
    if (swiglu_limit > 0) clamp_gate_up(gu, swiglu_limit);
    local.swiglu_packed(gu, act);
    local.linear(act, down.expert(e), he);
    if (!local.status().ok()) {
      errors[static_cast<std::size_t>(e)] = local.status();
      return;
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const float* src = he.row(i);
      float* dst = out.data() + (b + i) * H;
      const float wi = row_w[static_cast<std::size_t>(b + i)];
      for (std::int64_t c = 0; c < H; ++c) dst[c] = wi * src[c];
    }
  });
  for (const auto& st : errors)
    if (!st.ok()) return fail(st);
  for (std::int64_t e = 0; e < E; ++e)
    for (auto i = start[static_cast<std::size_t>(e)]; i < start[static_cast<std::size_t>(e) + 1];
         ++i) {
      const float* src = out.data() + i * H;
      float* dst = y.row(rows[static_cast<std::size_t>(i)]);
      for (std::int64_t c = 0; c < H; ++c) dst[c] += src[c];
    }
}

std::unique_ptr<Backend> make_cpu_backend() {
  cpu_blas_setup();
  return std::make_unique<CpuBackend>();
}

}  // namespace fs
