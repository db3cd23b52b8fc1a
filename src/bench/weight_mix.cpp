#include "bench/weight_mix.h"

#include <array>

namespace fs::bench {
namespace {

using quant::QuantType;

constexpr std::array<std::string_view, 9> kNames = {"bf16", "fp8",  "fp4",  "q8_0",   "q4_k",
                                                    "q5_k", "q6_k", "q2_k", "iq2_xxs"};

MatrixStorage elements(DType d) {
  return {d, std::nullopt};
}
MatrixStorage packed(QuantType q) {
  return {DType::kU8, q};
}

// Weights per scale or block of a storage (1: elements).
std::int64_t block_of(const MatrixStorage& s) {
  if (!s.packed) return 1;
  if (*s.packed == QuantType::kF4E2M1x2) return 32;  // its E8M0 scales
  return quant::quant_info(*s.packed).block_elements;
}

}  // namespace

double MatrixStorage::bytes_per_weight() const {
  if (!packed) return dtype == DType::kF8E4M3 ? 1.0 + 4.0 / (128 * 128) : dtype_size(dtype);
  if (*packed == QuantType::kF4E2M1x2) return 0.5 + 1.0 / 32;
  const auto& info = quant::quant_info(*packed);
  return static_cast<double>(info.block_bytes) / static_cast<double>(info.block_elements);
}

std::string MatrixStorage::name() const {
  if (packed) return std::string(quant::quant_name(*packed));
  return dtype == DType::kF8E4M3 ? "F8_E4M3" : "BF16";
}

MatrixStorage WeightMix::storage(MatrixRole role, std::int64_t in) const {
  const MatrixStorage* s = &projection;
  if (role == MatrixRole::kOther) return other;
  if (role == MatrixRole::kExpertGateUp) s = &expert_gate_up;
  if (role == MatrixRole::kExpertDown) s = &expert_down;
  if (in % block_of(*s) == 0) return *s;
  if (in % 32 == 0) return packed(QuantType::kQ8_0);
  return other;
}

std::string WeightMix::note() const {
  if (name == "bf16") return "every matrix bf16";
  return "projections " + projection.name() + ", routed experts gate/up " + expert_gate_up.name() +
         " and down " + expert_down.name() +
         " (rows that are not whole blocks: Q8_0); embedding, lm_head, routers, shared-expert "
         "gates and hyper-connection matrices bf16";
}

Expected<WeightMix> weight_mix(std::string_view name) {
  WeightMix m;
  m.name = std::string(name);
  auto all = [&](MatrixStorage s) { m.projection = m.expert_gate_up = m.expert_down = s; };
  if (name == "bf16") {
    all(elements(DType::kBF16));
  } else if (name == "fp8") {
    all(elements(DType::kF8E4M3));
  } else if (name == "fp4") {
    m.projection = elements(DType::kF8E4M3);
    m.expert_gate_up = m.expert_down = packed(QuantType::kF4E2M1x2);
  } else if (name == "iq2_xxs") {
    m.projection = packed(QuantType::kQ8_0);
    m.expert_gate_up = packed(QuantType::kIQ2_XXS);
    m.expert_down = packed(QuantType::kQ2_K);
  } else {
    constexpr std::array<std::pair<std::string_view, QuantType>, 5> kGguf = {{
        {"q8_0", QuantType::kQ8_0},
        {"q4_k", QuantType::kQ4_K},
        {"q5_k", QuantType::kQ5_K},
        {"q6_k", QuantType::kQ6_K},
        {"q2_k", QuantType::kQ2_K},
    }};
    bool found = false;
    for (const auto& [n, q] : kGguf)
      if (n == name) {
        all(packed(q));
        found = true;
      }
    if (!found)
      return invalid_argument("bench: --dtype '" + std::string(name) + "' is not one of " +
                              weight_mix_names());
  }
  return m;
}

std::string weight_mix_names() {
  std::string s;
  for (const auto n : kNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

}  // namespace fs::bench
