#include "model/deepseek_v4/official_experts.h"

#include <cstring>

#include "model/deepseek_v4/official_names.h"

namespace fs {
namespace {

constexpr std::int64_t kFp4Block = 32;  // inputs per E8M0 scale

struct Projection {
  DsExpertProjection which;
  std::int64_t rows, cols;  // [out, in] in weights
};

// w1 and w3 are [I, H], w2 is [H, I].
std::vector<Projection> projections(std::int64_t I, std::int64_t H) {
  return {{DsExpertProjection::kGate, I, H},
          {DsExpertProjection::kUp, I, H},
          {DsExpertProjection::kDown, H, I}};
}

Status check_tensor(const Checkpoint& ck, const std::string& name, DType dtype, const Shape& shape,
                    const char* what) {
  const auto v = ck.view(name);
  if (!v) return not_found("checkpoint lacks tensor " + name);
  if (v->dtype != dtype)
    return unsupported("tensor " + name + " has dtype " + std::string(dtype_name(v->dtype)) +
                       ", expected " + std::string(dtype_name(dtype)) + " (" + what + ")");
  if (v->shape != shape)
    return corrupt("tensor " + name + " has shape " + shape_to_string(v->shape) +
                   ", the config implies " + shape_to_string(shape) + " (" + what + ")");
  return {};
}

// Appends expert `e`'s projection `p` (codes, scales) to the stacked buffers at `codes`/`scales`.
void copy_projection(const Checkpoint& ck, const std::string& base, std::uint8_t*& codes,
                     std::uint8_t*& scales) {
  const auto w = *ck.view(base + ".weight");
  const auto s = *ck.view(base + ".scale");
  std::memcpy(codes, w.bytes.data(), w.bytes.size());
  std::memcpy(scales, s.bytes.data(), s.bytes.size());
  codes += w.bytes.size();
  scales += s.bytes.size();
}

Weight packed_fp4(Shape shape, const std::vector<std::uint8_t>& codes,
                  const std::vector<std::uint8_t>& scales) {
  Weight w{DType::kU8, std::move(shape), codes.data()};
  w.packed = quant::QuantType::kF4E2M1x2;
  w.scales = {scales.data(), quant::ScaleFormat::kE8M0, 1, kFp4Block};
  return w;
}

}  // namespace

std::uint64_t DsOfficialExperts::stacked_bytes() const {
  const auto weights = static_cast<std::uint64_t>(experts) * 3 *
                       static_cast<std::uint64_t>(intermediate) *
                       static_cast<std::uint64_t>(hidden);
  return weights / 2 + weights / kFp4Block;
}

Status check_official_experts(const Checkpoint& ck, const std::string& layer_prefix,
                              std::int64_t experts, std::int64_t intermediate,
                              std::int64_t hidden) {
  if (hidden % kFp4Block != 0 || intermediate % kFp4Block != 0)
    return unsupported("FP4 experts need hidden_size and moe_intermediate_size divisible by 32 (" +
                       std::to_string(hidden) + ", " + std::to_string(intermediate) + ")");
  for (std::int64_t e = 0; e < experts; ++e) {
    for (const auto& p : projections(intermediate, hidden)) {
      const auto base = official_expert_name(layer_prefix, e, p.which);
      if (auto st = check_tensor(ck, base + ".weight", DType::kI8, {p.rows, p.cols / 2},
                                 "FP4 E2M1, two codes a byte");
          !st.ok())
        return st;
      if (auto st = check_tensor(ck, base + ".scale", DType::kF8E8M0, {p.rows, p.cols / kFp4Block},
                                 "an E8M0 scale per 32 inputs");
          !st.ok())
        return st;
    }
  }
  return {};
}

DsStackedExperts stack_official_experts(
    const Checkpoint& ck, const std::string& layer_prefix, std::int64_t experts,
    std::int64_t intermediate, std::int64_t hidden,
    std::vector<std::unique_ptr<std::vector<std::uint8_t>>>& arena) {
  const auto E = experts, I = intermediate, H = hidden;
  auto buffer = [&](std::int64_t bytes) -> std::vector<std::uint8_t>& {
    arena.push_back(std::make_unique<std::vector<std::uint8_t>>(static_cast<std::size_t>(bytes)));
    return *arena.back();
  };
  auto& gu_codes = buffer(E * 2 * I * H / 2);
  auto& gu_scales = buffer(E * 2 * I * H / kFp4Block);
  auto& dn_codes = buffer(E * H * I / 2);
  auto& dn_scales = buffer(E * H * I / kFp4Block);
  std::uint8_t* gc = gu_codes.data();
  std::uint8_t* gs = gu_scales.data();
  std::uint8_t* dc = dn_codes.data();
  std::uint8_t* ds = dn_scales.data();
  for (std::int64_t e = 0; e < E; ++e) {
    // HF's gate_up_proj[e] is gate's rows then up's (DeepseekV4Experts chunks it in two).
    copy_projection(ck, official_expert_name(layer_prefix, e, DsExpertProjection::kGate), gc, gs);
    copy_projection(ck, official_expert_name(layer_prefix, e, DsExpertProjection::kUp), gc, gs);
    copy_projection(ck, official_expert_name(layer_prefix, e, DsExpertProjection::kDown), dc, ds);
  }
  return {packed_fp4({E, 2 * I, H}, gu_codes, gu_scales),
          packed_fp4({E, H, I}, dn_codes, dn_scales)};
}

}  // namespace fs
