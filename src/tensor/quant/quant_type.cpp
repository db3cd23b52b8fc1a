#include "tensor/quant/quant_type.h"

#include <array>
#include <cctype>
#include <limits>
#include <string>

namespace fs::quant {
namespace {

using Q = QuantType;

// Geometry of ggml's types as its block structs define them (ggml/src/ggml-common.h): for each,
// the weights per block and the bytes of the struct. Checked against ggml's own type traits by
// tests/fixtures/quant/ggml_geometry.txt (tools/quant/ggml_known_answers.c writes it).
constexpr std::array<QuantTypeInfo, 38> kTable = {{
    {Q::kF32, "F32", 0, 1, 4, true, true},
    {Q::kF16, "F16", 1, 1, 2, true, true},
    {Q::kBF16, "BF16", 30, 1, 2, true, true},
    {Q::kF64, "F64", 28, 1, 8, false, true},
    {Q::kI8, "I8", 24, 1, 1, false, false},
    {Q::kI16, "I16", 25, 1, 2, false, false},
    {Q::kI32, "I32", 26, 1, 4, false, false},
    {Q::kI64, "I64", 27, 1, 8, false, false},
    {Q::kQ4_0, "Q4_0", 2, 32, 18, false, true},
    {Q::kQ4_1, "Q4_1", 3, 32, 20, false, true},
    {Q::kQ5_0, "Q5_0", 6, 32, 22, false, true},
    {Q::kQ5_1, "Q5_1", 7, 32, 24, false, true},
    {Q::kQ8_0, "Q8_0", 8, 32, 34, true, true},
    {Q::kQ8_1, "Q8_1", 9, 32, 36, false, true},
    {Q::kIQ4_NL, "IQ4_NL", 20, 32, 18, false, true},
    {Q::kMXFP4, "MXFP4", 39, 32, 17, false, true},
    {Q::kNVFP4, "NVFP4", 40, 64, 36, false, true},
    {Q::kQ1_0, "Q1_0", 41, 128, 18, false, true},
    {Q::kQ2_0, "Q2_0", 42, 64, 18, false, true},
    {Q::kQ2_K, "Q2_K", 10, 256, 84, true, true},
    {Q::kQ3_K, "Q3_K", 11, 256, 110, false, true},
    {Q::kQ4_K, "Q4_K", 12, 256, 144, true, true},
    {Q::kQ5_K, "Q5_K", 13, 256, 176, true, true},
    {Q::kQ6_K, "Q6_K", 14, 256, 210, true, true},
    {Q::kQ8_K, "Q8_K", 15, 256, 292, false, true},
    {Q::kIQ2_XXS, "IQ2_XXS", 16, 256, 66, true, true},
    {Q::kIQ2_XS, "IQ2_XS", 17, 256, 74, false, true},
    {Q::kIQ2_S, "IQ2_S", 22, 256, 82, false, true},
    {Q::kIQ3_XXS, "IQ3_XXS", 18, 256, 98, false, true},
    {Q::kIQ3_S, "IQ3_S", 21, 256, 110, false, true},
    {Q::kIQ1_S, "IQ1_S", 19, 256, 50, false, true},
    {Q::kIQ1_M, "IQ1_M", 29, 256, 56, false, true},
    {Q::kIQ4_XS, "IQ4_XS", 23, 256, 136, false, true},
    {Q::kTQ1_0, "TQ1_0", 34, 256, 54, false, true},
    {Q::kTQ2_0, "TQ2_0", 35, 256, 66, false, true},
    {Q::kF8E4M3, "F8_E4M3", -1, 1, 1, true, true},
    {Q::kF8E8M0, "F8_E8M0", -1, 1, 1, true, true},
    {Q::kF4E2M1x2, "F4_E2M1", -1, 2, 1, true, true},
}};

constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<std::size_t>(kTable[i].type) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kTable rows must follow the QuantType enum");

}  // namespace

const QuantTypeInfo& quant_info(QuantType t) {
  return kTable[static_cast<std::size_t>(t)];
}
std::string_view quant_name(QuantType t) {
  return quant_info(t).name;
}
const QuantTypeInfo* quant_table_begin() {
  return kTable.data();
}
const QuantTypeInfo* quant_table_end() {
  return kTable.data() + kTable.size();
}

std::optional<QuantType> quant_type_from_ggml(std::uint32_t ggml_id) {
  for (const auto& row : kTable) {
    if (row.ggml_id >= 0 && static_cast<std::uint32_t>(row.ggml_id) == ggml_id) return row.type;
  }
  return std::nullopt;
}

std::optional<QuantType> quant_type_from_name(std::string_view name) {
  for (const auto& row : kTable) {
    if (row.name.size() != name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i) {
      same = std::toupper(static_cast<unsigned char>(name[i])) == row.name[i];
    }
    if (same) return row.type;
  }
  return std::nullopt;
}

Expected<std::uint64_t> row_bytes(QuantType t, std::int64_t elements) {
  const auto& info = quant_info(t);
  if (elements < 0) return invalid_argument("negative row length " + std::to_string(elements));
  if (elements % info.block_elements != 0) {
    return invalid_argument("a row of " + std::to_string(elements) + " " + std::string(info.name) +
                            " weights is not a whole number of its " +
                            std::to_string(info.block_elements) + "-weight blocks");
  }
  const auto blocks = static_cast<std::uint64_t>(elements / info.block_elements);
  const auto per = static_cast<std::uint64_t>(info.block_bytes);
  if (blocks > std::numeric_limits<std::uint64_t>::max() / per) {
    return invalid_argument("a row of " + std::to_string(elements) + " " + std::string(info.name) +
                            " weights overflows a byte count");
  }
  return blocks * per;
}

}  // namespace fs::quant
