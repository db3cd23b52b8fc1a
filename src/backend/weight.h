// A weight as a backend computes with it, row-major, viewed (not owned). On the host it points
// into the memory-mapped checkpoint (or a small widened vector the loader owns); on a device, into
// the buffer the backend uploaded it to at load (`Backend::upload`), which lives as long as the
// backend. Linear weights are torch's [out, in]; a 3-D expert tensor [E, out, in] is sliced per
// expert with `expert()`. `shape` always counts weights, whatever the storage.
//
// Storage formats (`storage()`, named by `format_name()`):
// - Elements of `dtype`: float32, bfloat16 (float16 on the host).
// - FP8 E4M3 as the official FP8 releases store it (tensor/quant/block_scaled.h): one e4m3 byte
//   per weight (`dtype` kF8E4M3) and a scale per 128x128 block (`scales`), w = e4m3 * scale; the
//   scales are f32 (`weight_scale_inv`, Qwen/DeepSeek V3) or E8M0 exponent bytes (DeepSeek V4).
// - Packed formats (`packed` set, `dtype` kU8 so no element path reads them as numbers): FP4
//   E2M1 two per byte with E8M0 scales per 32 inputs (`scales` 1x32 blocks, [out, in/32];
//   DeepSeek V4's routed experts), and the GGUF block types (Q8_0, Q4_K, Q5_K, Q6_K, Q2_K,
//   IQ2_XXS), whose scales are inside their blocks. The bytes are the file's, row after row,
//   each row `row_bytes()` long; nothing is dequantised ahead.
// The scales live where the weight lives (host or device) and are sliced with it: a stacked
// [E, out, in] tensor has [E, gr, gc] scales. An op that cannot read a format refuses the weight
// with an error naming it (`format_name()`); none reads one it does not know.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "tensor/memory.h"
#include "tensor/quant/block_scaled.h"
#include "tensor/quant/minifloat.h"
#include "tensor/quant/quant_type.h"
#include "tensor/tensor_view.h"
#include "util/status.h"

namespace fs {

// The block scales of one matrix (or of each matrix of a stacked tensor), row-major over the
// block grid [ceil(rows/block_rows), ceil(cols/block_cols)].
struct WeightScales {
  const std::uint8_t* data = nullptr;  // null: not block-scaled
  quant::ScaleFormat format = quant::ScaleFormat::kF32;
  std::int64_t block_rows = 128;
  std::int64_t block_cols = 128;

  bool empty() const { return data == nullptr; }
  std::int64_t grid_rows(std::int64_t rows) const { return (rows + block_rows - 1) / block_rows; }
  std::int64_t grid_cols(std::int64_t cols) const { return (cols + block_cols - 1) / block_cols; }
  std::size_t scale_size() const { return format == quant::ScaleFormat::kF32 ? 4 : 1; }
  // Bytes of the grid of one [rows, cols] matrix.
  std::size_t grid_bytes(std::int64_t rows, std::int64_t cols) const {
    return static_cast<std::size_t>(grid_rows(rows) * grid_cols(cols)) * scale_size();
  }
};

struct Weight {
  DType dtype = DType::kF32;  // the element type; kU8 for a packed format
  Shape shape;
  const std::uint8_t* data = nullptr;
  Device device = Device::kHost;
  WeightScales scales{};  // FP8 E4M3 (128x128 blocks) and FP4 E2M1 (1x32 blocks) only
  // The packed format (see the top of this file); unset for elements of `dtype`.
  std::optional<quant::QuantType> packed{};

  bool empty() const { return data == nullptr; }
  bool block_scaled() const { return !scales.empty(); }
  bool is_packed() const { return packed.has_value(); }
  // The storage format in the quant table's terms: the packed format, else dtype's (F32, BF16,
  // F16 or F8_E4M3).
  quant::QuantType storage() const {
    if (packed) return *packed;
    switch (dtype) {
      case DType::kBF16:
        return quant::QuantType::kBF16;
      case DType::kF16:
        return quant::QuantType::kF16;
      case DType::kF8E4M3:
        return quant::QuantType::kF8E4M3;
      default:
        return quant::QuantType::kF32;
    }
  }
  // Elements of F32 or BF16 with no scales: what most ops read.
  bool plain() const {
    return !packed && !block_scaled() && (dtype == DType::kF32 || dtype == DType::kBF16);
  }
  std::int64_t numel() const { return shape.empty() ? 0 : shape_numel(shape); }
  std::int64_t rows() const { return shape.empty() ? 0 : numel() / shape.back(); }
  std::int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  // Bytes of one stored row of `cols()` weights (whole blocks for a packed format; a shape whose
  // rows are not whole blocks is refused by `check_storage`, and gives 0 here).
  std::size_t row_bytes() const {
    if (!packed) return static_cast<std::size_t>(cols()) * dtype_size(dtype);
    const auto& info = quant::quant_info(*packed);
    if (cols() % info.block_elements != 0) return 0;
    return static_cast<std::size_t>(cols() / info.block_elements * info.block_bytes);
  }
  std::size_t bytes() const { return static_cast<std::size_t>(rows()) * row_bytes(); }
  // Rows of one matrix ([.., out, in]: out) and how many matrices are stacked.
  std::int64_t matrix_rows() const { return shape.size() >= 2 ? shape[shape.size() - 2] : 1; }
  std::int64_t matrices() const {
    const auto per = matrix_rows() * cols();
    return per == 0 ? 0 : numel() / per;
  }
  // Bytes of the scales of every stacked matrix (0 when not block-scaled).
  std::size_t scale_bytes() const {
    if (!block_scaled()) return 0;
    return static_cast<std::size_t>(matrices()) * scales.grid_bytes(matrix_rows(), cols());
  }
  // The 2-D [out, in] matrix of expert `e` of a 3-D [E, out, in] weight (its scales with it).
  Weight expert(std::int64_t e) const {
    Weight w = *this;
    w.shape = {shape.at(1), shape.at(2)};
    w.data = data + static_cast<std::size_t>(e * shape.at(1)) * row_bytes();
    if (block_scaled())
      w.scales.data += static_cast<std::size_t>(e) * scales.grid_bytes(shape.at(1), shape.at(2));
    return w;
  }
  // The first `n` rows of a matrix [out, in] (rows are contiguous): a smaller output range. Any n
  // works for a block-scaled matrix too: the grid is row-major with whole block rows, so the
  // first n rows use exactly the grid's first ceil(n / block_rows) rows, which the same scale
  // pointer already addresses (a partial last block row keeps its full-block scale, as the
  // quantiser computed it).
  Weight first_rows(std::int64_t n) const {
    Weight w = *this;
    w.shape = {n, shape.back()};
    return w;
  }
  // Scale of weight (row, col) of a 2-D host matrix (1 when not block-scaled).
  float scale_at(std::int64_t row, std::int64_t col) const {
    if (!block_scaled()) return 1.0f;
    const auto i = static_cast<std::size_t>((row / scales.block_rows) * scales.grid_cols(cols()) +
                                            col / scales.block_cols);
    if (scales.format == quant::ScaleFormat::kE8M0) return quant::e8m0_to_f32(scales.data[i]);
    float f;
    std::memcpy(&f, scales.data + i * sizeof(float), sizeof f);
    return f;
  }
  // The quant module's view of a 2-D block-scaled host matrix (for its row dequantiser).
  quant::ScaledMatrix scaled_matrix() const {
    quant::ScaledMatrix m;
    m.element = storage();
    m.rows = rows();
    m.cols = cols();
    m.weights = {data, bytes()};
    m.scales = {scales.format, scales.block_rows, scales.block_cols, {scales.data, scale_bytes()}};
    return m;
  }
  // f32 host vectors (norms, biases) read through this.
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  static Weight from_view(const TensorView& v) { return {v.dtype, v.shape, v.bytes.data()}; }

  // "BF16", "Q4_K", "F8_E4M3 with 128x128 E8M0 scales", "F4_E2M1 with 1x32 E8M0 scales".
  std::string format_name() const;
  // That the bytes and scales agree with the shape and the format (a packed row is whole blocks,
  // the scale grid covers the matrix); the error names the format and what disagrees.
  Status check_storage() const;
  // Row `row` of a host weight's rows (all stacked matrices counted) as f32: each format through
  // the quant module's dequantiser, the reference every kernel is compared to.
  Status dequantize_row(std::int64_t row, std::span<float> out) const;
};

// The error an op gives for a weight whose format it does not read, e.g. "cuda: grouped_linear:
// Q4_K weights are not supported (it reads F32/BF16 weights)".
Status unsupported_format(const std::string& who, const Weight& w, const std::string& reads);

}  // namespace fs
