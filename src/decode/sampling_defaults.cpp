#include "decode/sampling_defaults.h"

#include <filesystem>
#include <sstream>

#include "format/config_json.h"

namespace fs {

SamplerConfig SamplingDefaults::over(SamplerConfig base) const {
  if (temperature) base.temperature = *temperature;
  if (top_p) base.top_p = *top_p;
  if (top_k) base.top_k = *top_k;
  if (min_p) base.min_p = *min_p;
  if (repetition_penalty) base.repetition_penalty = *repetition_penalty;
  return base;
}

std::string SamplingDefaults::describe() const {
  std::ostringstream s;
  const char* sep = "";
  const auto field = [&](const char* name, const auto& v) {
    if (!v) return;
    s << sep << name << " " << *v;
    sep = ", ";
  };
  field("temperature", temperature);
  field("top_p", top_p);
  field("top_k", top_k);
  field("min_p", min_p);
  field("repetition_penalty", repetition_penalty);
  return empty() ? "none" : s.str();
}

Expected<SamplingDefaults> read_sampling_defaults(const std::string& model) {
  SamplingDefaults d;
  const auto path = std::filesystem::path(model) / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_directory(model, ec) || !std::filesystem::exists(path, ec)) return d;
  auto reader = ConfigReader::from_file(path.string());
  if (!reader.ok()) return reader.status();
  ConfigReader& r = *reader;
  const auto number = [&](const char* field) -> std::optional<double> {
    if (!r.has(field) || r.root().at(field).is_null()) return std::nullopt;
    return r.number(field);
  };
  d.temperature = number("temperature");
  d.top_p = number("top_p");
  d.min_p = number("min_p");
  if (r.has("top_k") && !r.root().at("top_k").is_null()) {
    const std::int64_t k = r.integer("top_k");
    if (k < 0 || k > (1 << 20)) r.fail("top_k", "must be 0 (off) or a positive count");
    d.top_k = static_cast<std::int32_t>(k);
  }
  // HF decodes greedily unless do_sample is true; a release that says false asks for greedy.
  if (r.has("do_sample") && !r.boolean("do_sample")) d.temperature = 0.0;
  d.repetition_penalty = number("repetition_penalty");
  if (Status s = r.status(); !s.ok()) return s;
  // The sampler's own ranges, named as the file's.
  if (Status s = d.over(SamplerConfig{}).validate(); !s.ok())
    return invalid_argument(path.string() + ": " + s.message());
  return d;
}

}  // namespace fs
