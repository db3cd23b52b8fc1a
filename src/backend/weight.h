// A weight as a backend computes with it, row-major, viewed (not owned). On the host it points
// into the memory-mapped checkpoint (or a small widened vector the loader owns); on a device, into
// the buffer the backend uploaded it to at load (`Backend::upload`), which lives as long as the
// backend. Linear weights are torch's [out, in]; a 3-D expert tensor [E, out, in] is sliced per
// expert with `expert()`.
//
// Element types: float32 or bfloat16, or FP8 E4M3 as the official FP8 releases store it (the
// `weight_scale_inv` layout, tensor/quant/block_scaled.h): one e4m3 byte per weight and an f32
// scale per 128x128 block (`scales`), w = e4m3 * scale. The scales live where the weight lives
// (host or device) and are sliced with it: a stacked [E, out, in] tensor has [E, gr, gc] scales.
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/memory.h"
#include "tensor/quant/block_scaled.h"
#include "tensor/quant/quant_type.h"
#include "tensor/tensor_view.h"

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
  DType dtype = DType::kF32;
  Shape shape;
  const std::uint8_t* data = nullptr;
  Device device = Device::kHost;
  WeightScales scales{};  // non-empty only for block-scaled FP8 (dtype kF8E4M3)

  bool empty() const { return data == nullptr; }
  bool block_scaled() const { return !scales.empty(); }
  // The storage format in the quant table's terms (F32, BF16, F16 or F8_E4M3).
  quant::QuantType quant() const {
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
  std::int64_t numel() const { return shape.empty() ? 0 : shape_numel(shape); }
  std::int64_t rows() const { return shape.empty() ? 0 : numel() / shape.back(); }
  std::int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
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
    const std::int64_t per = shape.at(1) * shape.at(2);
    Weight w{dtype,
             {shape.at(1), shape.at(2)},
             data + static_cast<std::size_t>(e * per) * dtype_size(dtype),
             device,
             scales};
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
    return {dtype, {n, shape.back()}, data, device, scales};
  }
  // Scale of weight (row, col) of a 2-D host matrix (1 when not block-scaled).
  float scale_at(std::int64_t row, std::int64_t col) const {
    if (!block_scaled()) return 1.0f;
    const auto i = static_cast<std::size_t>((row / scales.block_rows) * scales.grid_cols(cols()) +
                                            col / scales.block_cols);
    float f;
    std::memcpy(&f, scales.data + i * sizeof(float), sizeof f);
    return f;
  }
  // The quant module's view of a 2-D block-scaled host matrix (for its row dequantiser).
  quant::ScaledMatrix scaled_matrix() const {
    quant::ScaledMatrix m;
    m.element = quant();
    m.rows = rows();
    m.cols = cols();
    m.weights = {data, bytes()};
    m.scales = {scales.format, scales.block_rows, scales.block_cols, {scales.data, scale_bytes()}};
    return m;
  }
  // f32 host vectors (norms, biases) read through this.
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  static Weight from_view(const TensorView& v) { return {v.dtype, v.shape, v.bytes.data()}; }
};

}  // namespace fs
