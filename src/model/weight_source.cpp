#include "model/weight_source.h"

#include <cstring>

#include "model/convert.h"
#include "model/gguf_tensors.h"

namespace fs {

namespace {

// The FP8 releases' per-block scales beside each F8_E4M3 matrix (quant/block_scaled.h).
constexpr const char* kScaleSuffix = "_scale_inv";
constexpr std::int64_t kFp8Block = 128;

// An F8_E4M3 matrix needs its scales of [.., ceil(out/128), ceil(in/128)]: `<name>_scale_inv`
// (HF names) or `<base>.scale` (DeepSeek V4's official names), F32 or F8_E8M0 either way.
Status check_fp8_scales(const TensorSpec& spec, const TensorView& v, const Checkpoint& ck,
                        const TensorNaming& naming) {
  const auto name = naming.describe(spec.name);
  // The tensors the FP8 releases (and `convert --quantize fp8`) quantise, all read by `linear`
  // or `moe_experts` only, plus the output head; embeddings, filters, routers and the
  // hyper-connection weights stay in their float types.
  if (!fp8_quantises(spec.name, spec.shape.size()) && !spec.name.ends_with("lm_head.weight"))
    return unsupported("tensor " + name +
                       " has dtype F8_E4M3; FP8 is loaded for the projections (*_proj, the MTP "
                       "head's fc_*) and lm_head only");
  const auto scale_name = naming.scale_of(naming.stored(spec.name));
  const auto s = ck.view(scale_name);
  if (!s)
    return not_found("tensor " + name + " is F8_E4M3 but the checkpoint lacks its " + scale_name);
  // The scales' dtype says their format: F32 numbers, or E8M0 exponent bytes.
  if (s->dtype != DType::kF32 && s->dtype != DType::kF8E8M0)
    return unsupported("tensor " + scale_name + " has dtype " + std::string(dtype_name(s->dtype)) +
                       ", expected F32 or F8_E8M0 block scales");
  Shape want = v.shape;
  want[want.size() - 2] = (want[want.size() - 2] + kFp8Block - 1) / kFp8Block;
  want.back() = (want.back() + kFp8Block - 1) / kFp8Block;
  if (s->shape != want)
    return corrupt("tensor " + scale_name + " has shape " + shape_to_string(s->shape) +
                   ", 128x128 blocks of " + shape_to_string(v.shape) + " need " +
                   shape_to_string(want));
  return {};
}

}  // namespace

std::string TensorNaming::stored(const std::string& canonical) const {
  if (!rename) return canonical;
  return rename(canonical).value_or(canonical);
}

std::string TensorNaming::scale_of(const std::string& stored_name) const {
  if (!dot_scale) return stored_name + kScaleSuffix;
  constexpr std::string_view kWeight = ".weight";
  const auto base = stored_name.ends_with(kWeight)
                        ? stored_name.substr(0, stored_name.size() - kWeight.size())
                        : stored_name;
  return base + ".scale";
}

std::string TensorNaming::describe(const std::string& canonical) const {
  const auto s = stored(canonical);
  return s == canonical ? s : s + " (HF " + canonical + ")";
}

Status check_specs(const std::vector<TensorSpec>& specs, const Checkpoint& ck, FloatWeights floats,
                   const TensorNaming& naming) {
  for (const auto& spec : specs) {
    const auto v = ck.view(naming.stored(spec.name));
    const auto name = naming.describe(spec.name);
    if (!v) return not_found("checkpoint lacks tensor " + name);
    const bool fp8 =
        !spec.integer && v->dtype == DType::kF8E4M3 && floats == FloatWeights::kWithFp8;
    if (!fp8 && (spec.integer ? v->dtype != DType::kI64
                              : (v->dtype != DType::kF32 && v->dtype != DType::kBF16))) {
      return unsupported("tensor " + name + " has dtype " + std::string(dtype_name(v->dtype)) +
                         (spec.integer ? ", expected I64"
                          : floats == FloatWeights::kWithFp8
                              ? ", expected F32, BF16 or F8_E4M3"
                              : ", expected F32 or BF16 (this family loads no FP8 weights yet)"));
    }
    bool match = v->shape.size() == spec.shape.size();
    for (std::size_t i = 0; match && i < spec.shape.size(); ++i)
      match = spec.shape[i] < 0 || spec.shape[i] == v->shape[i];
    if (!match) {
      return corrupt("tensor " + name + " has shape " + shape_to_string(v->shape) +
                     ", the config implies " + shape_to_string(spec.shape));
    }
    if (fp8) {
      if (auto st = check_fp8_scales(spec, *v, ck, naming); !st.ok()) return st;
    }
  }
  return {};
}

bool WeightSource::contains(const std::string& name) const {
  return gguf_ ? gguf_->contains(name) : ck_->contains(naming_.stored(name));
}

Status WeightSource::check(const std::vector<TensorSpec>& specs, FloatWeights floats) const {
  return gguf_ ? gguf_->check_specs(specs) : check_specs(specs, *ck_, floats, naming_);
}

Shape WeightSource::shape(const std::string& name) const {
  return gguf_ ? gguf_->shape(name) : ck_->view(naming_.stored(name))->shape;
}

Weight WeightSource::weight(const std::string& name) const {
  if (gguf_) return gguf_->weight(name);
  const auto stored = naming_.stored(name);
  Weight w = Weight::from_view(*ck_->view(stored));
  if (w.dtype == DType::kF8E4M3) {
    const auto s = *ck_->view(naming_.scale_of(stored));
    w.scales.data = s.bytes.data();
    if (s.dtype == DType::kF8E8M0) w.scales.format = quant::ScaleFormat::kE8M0;
  }
  return w;
}

std::vector<float> WeightSource::values(const std::string& name) const {
  if (gguf_) return gguf_->values(name);
  const auto v = *ck_->view(naming_.stored(name));
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  convert_to_f32(v.dtype, v.bytes.data(), out.data(), out.size());
  return out;
}

Weight WeightSource::own(std::vector<float> values, Shape shape) const {
  arena_.push_back(std::make_unique<std::vector<float>>(std::move(values)));
  return {DType::kF32, std::move(shape),
          reinterpret_cast<const std::uint8_t*>(arena_.back()->data())};
}

Weight WeightSource::vec(const std::string& name) const {
  auto v = values(name);
  const auto n = static_cast<std::int64_t>(v.size());
  return own(std::move(v), {n});
}

Weight WeightSource::widened(const std::string& name) const {
  return own(values(name), shape(name));
}

Weight WeightSource::conv(const std::string& name) const {
  const auto s = shape(name);
  return own(values(name), {s.at(0), s.at(2)});
}

std::vector<std::int64_t> WeightSource::ints(const std::string& name) const {
  if (gguf_) return gguf_->ints(name);
  const auto v = *ck_->view(naming_.stored(name));
  std::vector<std::int64_t> out(static_cast<std::size_t>(v.numel()));
  std::memcpy(out.data(), v.bytes.data(), out.size() * sizeof(std::int64_t));
  return out;
}

}  // namespace fs
