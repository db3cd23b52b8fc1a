#include "backend/weight.h"

#include "tensor/quant/dequantize.h"

namespace fs {
namespace {

const char* scale_format_name(quant::ScaleFormat f) {
  return f == quant::ScaleFormat::kF32 ? "F32" : "E8M0";
}

}  // namespace

std::string Weight::format_name() const {
  std::string name(quant::quant_name(storage()));
  if (!block_scaled()) return name;
  name += " with ";
  name += std::to_string(scales.block_rows);
  name += "x";
  name += std::to_string(scales.block_cols);
  name += " ";
  name += scale_format_name(scales.format);
  name += " scales";
  return name;
}

Status Weight::check_storage() const {
  const auto t = storage();
  if (packed) {
    if (dtype != DType::kU8)
      return invalid_argument(format_name() + " weight of shape " + shape_to_string(shape) +
                              " must have dtype U8 (its bytes), not " +
                              std::string(dtype_name(dtype)));
    if (!quant::quant_info(t).dequantizable)
      return unsupported(format_name() + " weights are not implemented");
    if (auto per_row = quant::row_bytes(t, cols()); !per_row.ok())
      return per_row.status().with_context(format_name() + " weight " + shape_to_string(shape));
  }
  const bool wants_scales = t == quant::QuantType::kF4E2M1x2;
  if (wants_scales && !block_scaled())
    return invalid_argument(format_name() + " weight of shape " + shape_to_string(shape) +
                            " has no scales");
  if (block_scaled()) {
    if (t != quant::QuantType::kF8E4M3 && t != quant::QuantType::kF4E2M1x2)
      return invalid_argument(format_name() + ": only F8_E4M3 and F4_E2M1 weights take scales");
    // Each stacked matrix against its grid (matrix by matrix: the grid restarts per matrix).
    Weight one = *this;
    if (shape.size() == 3) one = expert(0);
    if (shape.size() > 3)
      return invalid_argument(format_name() + " weight of shape " + shape_to_string(shape) +
                              " has more than 3 dimensions");
    if (auto st = quant::validate(one.scaled_matrix()); !st.ok())
      return st.with_context(format_name() + " weight " + shape_to_string(shape));
  }
  return Status::ok_status();
}

Status Weight::dequantize_row(std::int64_t row, std::span<float> out) const {
  if (device != Device::kHost)
    return invalid_argument("dequantize_row: the " + format_name() + " weight is in " +
                            device_name(device) + " memory");
  if (row < 0 || row >= rows())
    return invalid_argument("dequantize_row: row " + std::to_string(row) + " of " +
                            std::to_string(rows()));
  if (out.size() != static_cast<std::size_t>(cols()))
    return invalid_argument("dequantize_row: " + std::to_string(out.size()) +
                            " floats for a row of " + std::to_string(cols()));
  if (block_scaled()) {
    // The row within its matrix, against that matrix's grid.
    const auto per = matrix_rows();
    Weight m = *this;
    if (shape.size() == 3) m = expert(row / per);
    return quant::dequantize_row(m.scaled_matrix(), shape.size() == 3 ? row % per : row, out);
  }
  if (!packed && !dtype_is_float(dtype))
    return invalid_argument("dequantize_row: " + std::string(dtype_name(dtype)) +
                            " is not a float type");
  const auto per_row = row_bytes();
  return quant::dequantize(storage(), {data + static_cast<std::size_t>(row) * per_row, per_row},
                           out);
}

Status unsupported_format(const std::string& who, const Weight& w, const std::string& reads) {
  return unsupported(who + ": " + w.format_name() + " weights are not supported (it reads " +
                     reads + ")");
}

}  // namespace fs
