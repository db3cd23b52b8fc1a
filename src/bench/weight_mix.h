// How `flashserve bench --dtype` stores the synthetic model's matrices, by role: the published
// checkpoints quantise the projections and the experts and keep the embedding, the lm_head, the
// routers and the hyper-connection matrices in bf16 (`convert --quantize fp8`, ds4's GGUF mixes).
//
//   bf16      everything bf16
//   fp8       projections and experts FP8 E4M3 with f32 128x128 block scales (the FP8 releases)
//   fp4       routed experts FP4 E2M1 with E8M0 scales per 32 (DeepSeek V4's release), the other
//             projections FP8 as `fp8`
//   q8_0, q4_k, q5_k, q6_k, q2_k
//             projections and experts in that GGUF type (llama.cpp's uniform mixes)
//   iq2_xxs   ds4's 2-bit mix: routed gate/up IQ2_XXS, routed down Q2_K, other projections Q8_0
//
// A matrix whose rows are not whole blocks of its type (the experts' 640-wide down rows against
// the K types' 256) takes Q8_0 instead, as llama.cpp's quantiser falls back; rows that are not
// whole 32-blocks either stay bf16.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tensor/dtype.h"
#include "tensor/quant/quant_type.h"
#include "util/status.h"

namespace fs::bench {

enum class MatrixRole : std::uint8_t { kOther, kProjection, kExpertGateUp, kExpertDown };

// One matrix's storage: elements of `dtype` (bf16, or FP8 E4M3 with f32 128x128 scales), or the
// packed format `packed` (FP4 with E8M0 1x32 scales, or a GGUF block type).
struct MatrixStorage {
  DType dtype = DType::kBF16;
  std::optional<quant::QuantType> packed;
  bool fp8() const { return !packed && dtype == DType::kF8E4M3; }
  // Bytes per weight, scales included.
  double bytes_per_weight() const;
  std::string name() const;
};

struct WeightMix {
  std::string name = "bf16";
  MatrixStorage other, projection, expert_gate_up, expert_down;
  // The storage of a `role` matrix with rows of `in` weights (after the fallbacks above).
  MatrixStorage storage(MatrixRole role, std::int64_t in) const;
  // One line for the bench's JSON and table.
  std::string note() const;
};

// The mix `--dtype name` names; the error lists the names.
Expected<WeightMix> weight_mix(std::string_view name);
// "bf16, fp8, fp4, q8_0, q4_k, q5_k, q6_k, q2_k, iq2_xxs"
std::string weight_mix_names();

}  // namespace fs::bench
