#include "tensor/quant/block_scaled.h"

#include <cstring>
#include <string>

#include "tensor/quant/minifloat.h"

namespace fs::quant {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

std::int64_t grid_cols(const ScaledMatrix& m) {
  return ceil_div(m.cols, m.scales.block_cols);
}

float scale_at(const BlockScales& s, std::size_t index) {
  if (s.format == ScaleFormat::kE8M0) return e8m0_to_f32(s.bytes[index]);
  float f;
  std::memcpy(&f, s.bytes.data() + index * sizeof(float), sizeof f);
  return f;
}

std::string shape_text(std::int64_t r, std::int64_t c) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on the chained operator+.
  std::string s = "[";
  s += std::to_string(r);
  s += ", ";
  s += std::to_string(c);
  s += "]";
  return s;
}

}  // namespace

Status validate(const ScaledMatrix& m) {
  if (m.element != QuantType::kF8E4M3 && m.element != QuantType::kF4E2M1x2) {
    return invalid_argument("block-scaled weights must be F8_E4M3 or F4_E2M1, not " +
                            std::string(quant_name(m.element)));
  }
  if (m.rows < 0 || m.cols < 0)
    return invalid_argument("negative shape " + shape_text(m.rows, m.cols));
  if (m.scales.block_rows <= 0 || m.scales.block_cols <= 0) {
    return invalid_argument("scale blocks of " +
                            shape_text(m.scales.block_rows, m.scales.block_cols) +
                            " weights are empty");
  }
  auto per_row = row_bytes(m.element, m.cols);
  if (!per_row.ok()) return per_row.status();
  const auto want = *per_row * static_cast<std::uint64_t>(m.rows);
  if (m.weights.size() != want) {
    return invalid_argument(std::string(quant_name(m.element)) + " weights " +
                            shape_text(m.rows, m.cols) + " need " + std::to_string(want) +
                            " bytes, have " + std::to_string(m.weights.size()));
  }
  const std::int64_t gr = ceil_div(m.rows, m.scales.block_rows);
  const std::int64_t gc = grid_cols(m);
  const std::uint64_t scale_size = m.scales.format == ScaleFormat::kF32 ? 4 : 1;
  const auto want_scales = static_cast<std::uint64_t>(gr * gc) * scale_size;
  if (m.scales.bytes.size() != want_scales) {
    return invalid_argument("scales of " + shape_text(m.rows, m.cols) + " weights in " +
                            shape_text(m.scales.block_rows, m.scales.block_cols) +
                            " blocks form a " + shape_text(gr, gc) + " grid of " +
                            (m.scales.format == ScaleFormat::kF32 ? "F32" : "E8M0") + " (" +
                            std::to_string(want_scales) + " bytes), have " +
                            std::to_string(m.scales.bytes.size()) + " bytes");
  }
  return Status::ok_status();
}

Status dequantize_row(const ScaledMatrix& m, std::int64_t row, std::span<float> out) {
  if (auto st = validate(m); !st.ok()) return st;
  if (row < 0 || row >= m.rows) {
    return invalid_argument("row " + std::to_string(row) + " of a matrix of " +
                            std::to_string(m.rows) + " rows");
  }
  if (out.size() != static_cast<std::size_t>(m.cols)) {
    return invalid_argument("output of " + std::to_string(out.size()) + " floats for a row of " +
                            std::to_string(m.cols));
  }
  const auto cols = static_cast<std::size_t>(m.cols);
  const std::size_t scale_row =
      static_cast<std::size_t>(row / m.scales.block_rows) * static_cast<std::size_t>(grid_cols(m));
  const auto block_cols = static_cast<std::size_t>(m.scales.block_cols);
  if (m.element == QuantType::kF8E4M3) {
    const std::uint8_t* w = m.weights.data() + static_cast<std::size_t>(row) * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      out[c] = e4m3_to_f32(w[c]) * scale_at(m.scales, scale_row + c / block_cols);
    }
  } else {
    const std::uint8_t* w = m.weights.data() + static_cast<std::size_t>(row) * (cols / 2);
    for (std::size_t c = 0; c < cols; ++c) {
      const std::uint8_t pair = w[c / 2];
      const std::uint8_t code = (c % 2 == 0) ? (pair & 0x0f) : (pair >> 4);
      out[c] = e2m1_to_f32(code) * scale_at(m.scales, scale_row + c / block_cols);
    }
  }
  return Status::ok_status();
}

Expected<std::vector<float>> dequantize(const ScaledMatrix& m) {
  if (auto st = validate(m); !st.ok()) return st;
  std::vector<float> out(static_cast<std::size_t>(m.rows * m.cols));
  for (std::int64_t r = 0; r < m.rows; ++r) {
    auto row = std::span<float>(out).subspan(static_cast<std::size_t>(r * m.cols),
                                             static_cast<std::size_t>(m.cols));
    if (auto st = dequantize_row(m, r, row); !st.ok()) return st;
  }
  return out;
}

}  // namespace fs::quant
