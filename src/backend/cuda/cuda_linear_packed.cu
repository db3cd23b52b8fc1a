// Dense products on packed weights (FP4 E2M1 + E8M0, GGUF blocks; backend/weight.h): the packed
// GEMV for up to kPackedGemvRows rows (every weight byte read once, decoded in registers), and
// for more rows the tensor-core tiles of cuda_grouped_packed.cu (the blocks decoded into shared
// memory). FLASHSERVE_CUDA_PREFILL_SGEMM=1, or a shape they do not take: tiles of weight rows
// dequantised into the pooled f32 scratch, one sgemm each, so no dequantised copy outlives the op.
#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_packed.cuh"
#include "backend/cuda/cuda_packed_gemv.cuh"

namespace fs::cuda {
namespace {

constexpr int kPackedGemvRows = 4;  // x rows up to which the packed GEMV runs (decode, MTP)
constexpr std::size_t kTileBytes = std::size_t{64} << 20;

// Rows [r0, r0 + n) of a packed matrix dequantised to f32 [n, in]: a thread per chunk.
template <typename F>
__global__ void packed_dequantize_kernel(const std::uint8_t* w, std::int64_t row_bytes,
                                         const std::uint8_t* scales, std::int64_t scale_row_bytes,
                                         std::int64_t r0, std::int64_t n, std::int64_t in,
                                         float* dst) {
  const std::int64_t per_row = F::chunks(in), count = n * per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / per_row, c = i % per_row;
    const auto raw = F::load(w + (r0 + r) * row_bytes,
                             scales != nullptr ? scales + (r0 + r) * scale_row_bytes : nullptr, c);
    float v[F::kChunk];
    packed::decode<F>(raw, v);
    float* row = dst + r * in;
#pragma unroll
    for (int run = 0; run < F::kChunk / 32; ++run) {
      float* o = row + F::column(c, run);
#pragma unroll
      for (int q = 0; q < 32; ++q) o[q] = v[32 * run + q];
    }
  }
}

template <typename F, int kS>
void launch_packed_gemv(const float* x, const Weight& w, packed::SideData side, float* y,
                        cudaStream_t stream) {
  const packed_gemv::MatrixRows src{w.data, static_cast<std::int64_t>(w.row_bytes()), side.base,
                                    side.row_bytes};
  packed_gemv::launch_rows<F, kS>(x, src, packed_gemv::StoreRows{y, w.rows()}, w.cols(), w.rows(),
                                  stream);
}

}  // namespace

void CudaBackend::linear_packed(const Tensor& x, const Weight& w, Tensor& y) {
  constexpr const char* kOp = "linear";
  const auto out = w.rows(), in = w.cols();
  if (!check(w.shape.size() == 2, kOp, "a packed weight must be a 2-D matrix")) return;
  if (auto st = w.check_storage(); !st.ok()) return fail(st.with_context("cuda: linear"));
  if (!packed::decodable(w))
    return fail(unsupported_format("cuda: linear", w,
                                   "F32/BF16, FP8, FP4 E2M1 in rows of whole 32-blocks and "
                                   "Q8_0/Q2_K/Q4_K/Q5_K/Q6_K/IQ2_XXS weights"));
  const std::uint8_t* codebook = nullptr;
  if (w.storage() == quant::QuantType::kIQ2_XXS && (codebook = iq2_grid()) == nullptr) return;
  const auto side = packed::side_data(w, codebook);
  if (!check(&x != &y, kOp, "y may not be x")) return;
  Shape shape = x.shape();
  shape.back() = out;
  if (!ensure(y, shape)) return;
  const auto S = x.rows();
  if (S == 0 || out == 0) return;
  if (in == 0) {
    memory_->zero(y.raw(), y.bytes());
    return;
  }
  // x rows of 32-float runs are read as float4: 16-byte aligned (pooled tensors are).
  if (!check(reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0, kOp,
             "x must be 16-byte aligned for a packed weight"))
    return;
  if (walking()) return;
  if (S <= kPackedGemvRows) {
    packed::with_format(w, [&](auto f) {
      using F = decltype(f);
      with_count<kPackedGemvRows>(S, [&](auto tokens) {
        launch_packed_gemv<F, decltype(tokens)::value>(x.data(), w, side, y.data(), stream());
      });
    });
    launched(kOp);
    return;
  }
  // A prefill: the tiles of cuda_grouped_packed.cu on the tensor cores.
  if (!env_flag("FLASHSERVE_CUDA_PREFILL_SGEMM") && packed_products_take(w, x.data()) &&
      dense_rows_fit(S)) {
    prefill_product(S, in, out, [&](DenseSplit split, float* partials) {
      return dense_product_packed(x.data(), S, w, codebook, y.data(), stream(), split, partials);
    });
    return;
  }
  const auto tile = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kTileBytes / (static_cast<std::size_t>(in) * sizeof(float))), 1,
      out);
  Tensor& widened = scratch(widened_);
  if (!ensure(widened, {tile, in})) return;
  const auto row_bytes = static_cast<std::int64_t>(w.row_bytes());
  for (std::int64_t r0 = 0; r0 < out && !failed(); r0 += tile) {
    const auto n = std::min(tile, out - r0);
    packed::with_format(w, [&](auto f) {
      using F = decltype(f);
      packed_dequantize_kernel<F>
          <<<std::min<unsigned>(grid_for(n * F::chunks(in), 256), 8192), 256, 0, stream()>>>(
              w.data, row_bytes, side.base, side.row_bytes, r0, n, in, widened.data());
    });
    if (!launched(kOp)) return;
    sgemm(x.data(), S, in, widened.data(), n, y.data() + r0, out);
  }
}

}  // namespace fs::cuda
