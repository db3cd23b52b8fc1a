#include "tensor/quant/dequantize.h"

#include <cstring>
#include <string>

#include "tensor/quant/blocks.h"
#include "tensor/quant/minifloat.h"

namespace fs::quant {
namespace {

void dequantize_elements(QuantType t, const std::uint8_t* src, std::int64_t n, float* out) {
  using detail::load_u16;
  switch (t) {
    case QuantType::kF32:
      std::memcpy(out, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case QuantType::kF16:
      for (std::int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case QuantType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case QuantType::kF8E4M3:
      for (std::int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(src[i]);
      return;
    case QuantType::kF8E8M0:
      for (std::int64_t i = 0; i < n; ++i) out[i] = e8m0_to_f32(src[i]);
      return;
    case QuantType::kF4E2M1x2:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint8_t pair = src[i / 2];
        out[i] = e2m1_to_f32(i % 2 == 0 ? (pair & 0x0f) : (pair >> 4));
      }
      return;
    default:
      return;
  }
}

}  // namespace

Status dequantize(QuantType t, std::span<const std::uint8_t> blocks, std::span<float> out) {
  const auto& info = quant_info(t);
  if (!info.dequantizable) {
    return unsupported("dequantisation of " + std::string(info.name) + " is not implemented");
  }
  const auto n = static_cast<std::int64_t>(out.size());
  auto want = row_bytes(t, n);
  if (!want.ok()) return want.status();
  if (blocks.size() != *want) {
    return invalid_argument(std::to_string(n) + " " + std::string(info.name) + " weights need " +
                            std::to_string(*want) + " bytes, have " +
                            std::to_string(blocks.size()));
  }
  const std::int64_t n_blocks = n / info.block_elements;
  const std::uint8_t* src = blocks.data();
  switch (t) {
    case QuantType::kQ8_0:
      detail::dequantize_q8_0(src, n_blocks, out.data());
      break;
    case QuantType::kQ2_K:
      detail::dequantize_q2_k(src, n_blocks, out.data());
      break;
    case QuantType::kQ4_K:
      detail::dequantize_q4_k(src, n_blocks, out.data());
      break;
    case QuantType::kQ5_K:
      detail::dequantize_q5_k(src, n_blocks, out.data());
      break;
    case QuantType::kQ6_K:
      detail::dequantize_q6_k(src, n_blocks, out.data());
      break;
    case QuantType::kIQ2_XXS:
      detail::dequantize_iq2_xxs(src, n_blocks, out.data());
      break;
    default:
      dequantize_elements(t, src, n, out.data());
      break;
  }
  return Status::ok_status();
}

Status dequantize_row(QuantType t, std::span<const std::uint8_t> matrix, std::int64_t cols,
                      std::int64_t row, std::span<float> out) {
  auto per_row = row_bytes(t, cols);
  if (!per_row.ok()) return per_row.status();
  if (row < 0) return invalid_argument("negative row " + std::to_string(row));
  const auto r = static_cast<std::uint64_t>(row);
  if (*per_row != 0 && r >= matrix.size() / *per_row) {
    return invalid_argument("row " + std::to_string(row) + " is past the end of a " +
                            std::to_string(matrix.size()) + "-byte matrix of " +
                            std::to_string(*per_row) + "-byte rows");
  }
  if (out.size() != static_cast<std::size_t>(cols)) {
    return invalid_argument("output of " + std::to_string(out.size()) + " floats for a row of " +
                            std::to_string(cols));
  }
  return dequantize(t, matrix.subspan(r * *per_row, *per_row), out);
}

Expected<std::vector<float>> dequantize_tensor(QuantType t, const Shape& shape,
                                               std::span<const std::uint8_t> bytes) {
  for (const auto d : shape) {
    if (d < 0) return invalid_argument("negative dimension in " + shape_to_string(shape));
  }
  const std::int64_t n = shape.empty() ? 1 : shape_numel(shape);
  const std::int64_t cols = shape.empty() ? 1 : shape.back();
  if (auto per_row = row_bytes(t, cols); !per_row.ok()) return per_row.status();
  std::vector<float> out(static_cast<std::size_t>(n));
  if (auto st = dequantize(t, bytes, out); !st.ok()) return st;
  return out;
}

}  // namespace fs::quant
