#include "model/weight_source.h"

#include <cstring>

namespace fs {

Status check_specs(const std::vector<TensorSpec>& specs, const Checkpoint& ck) {
  for (const auto& spec : specs) {
    const auto v = ck.view(spec.name);
    if (!v) return not_found("checkpoint lacks tensor " + spec.name);
    if (spec.integer ? v->dtype != DType::kI64
                     : (v->dtype != DType::kF32 && v->dtype != DType::kBF16)) {
      return unsupported("tensor " + spec.name + " has dtype " + std::string(dtype_name(v->dtype)) +
                         (spec.integer ? ", expected I64" : ", expected F32 or BF16"));
    }
    bool match = v->shape.size() == spec.shape.size();
    for (std::size_t i = 0; match && i < spec.shape.size(); ++i)
      match = spec.shape[i] < 0 || spec.shape[i] == v->shape[i];
    if (!match) {
      return corrupt("tensor " + spec.name + " has shape " + shape_to_string(v->shape) +
                     ", the config implies " + shape_to_string(spec.shape));
    }
  }
  return {};
}

Weight WeightSource::weight(const std::string& name) const {
  return Weight::from_view(*ck_.view(name));
}

std::vector<float> WeightSource::values(const std::string& name) const {
  const auto v = *ck_.view(name);
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
  return own(values(name), ck_.view(name)->shape);
}

Weight WeightSource::conv(const std::string& name) const {
  const auto v = *ck_.view(name);
  return own(values(name), {v.dim(0), v.dim(2)});
}

std::vector<std::int64_t> WeightSource::ints(const std::string& name) const {
  const auto v = *ck_.view(name);
  std::vector<std::int64_t> out(static_cast<std::size_t>(v.numel()));
  std::memcpy(out.data(), v.bytes.data(), out.size() * sizeof(std::int64_t));
  return out;
}

}  // namespace fs
