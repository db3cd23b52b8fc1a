#include "model/family.h"

#include <filesystem>

#include "model/deepseek_v4/schema.h"
#include "model/glm5/schema.h"
#include "model/qwen_next/schema.h"
#include "util/mapped_file.h"

namespace fs {

std::string family_name(Family f) {
  switch (f) {
    case Family::kQwenNext:
      return "qwen4_exp";
    case Family::kDeepseekV4:
      return "deepseek_v4";
    case Family::kGlm5:
      return "glm5_next";
  }
  return "?";
}

Expected<Family> family_from_model_type(const std::string& t) {
  if (t == "qwen4_exp" || t == "qwen4_exp_text") return Family::kQwenNext;
  if (t == "deepseek_v4") return Family::kDeepseekV4;
  if (t == "glm5_next" || t == "glm5_next_text") return Family::kGlm5;
  return unsupported("model_type '" + t + "' is not one of qwen4_exp, deepseek_v4, glm5_next");
}

Expected<ModelDescription> describe_model_config(const std::string& text,
                                                 const std::string& source) {
  auto reader = ConfigReader::parse(text, source);
  if (!reader.ok()) return reader.status();
  // model_type lives in text_config for multimodal checkpoints; the merged view holds either.
  auto model_type = read_model_type(nlohmann::json::parse(text), source);
  if (!model_type.ok()) return model_type.status();
  auto family = family_from_model_type(*model_type);
  if (!family.ok()) return family.status().with_context(source);

  ModelDescription d;
  d.family = *family;
  d.model_type = *model_type;
  d.mtp_prefixes = {"mtp."};
  switch (d.family) {
    case Family::kQwenNext: {
      auto c = parse_qwen_next_config(*reader);
      if (!c.ok()) return c.status();
      d.layers = qwen_next_schedule(*c);
      d.tensors = qwen_next_tensors(*c);
      d.config = std::move(c).value();
      break;
    }
    case Family::kDeepseekV4: {
      auto c = parse_deepseek_v4_config(*reader);
      if (!c.ok()) return c.status();
      d.layers = deepseek_v4_schedule(*c);
      d.tensors = deepseek_v4_tensors(*c);
      d.config = std::move(c).value();
      break;
    }
    case Family::kGlm5: {
      auto c = parse_glm5_config(*reader);
      if (!c.ok()) return c.status();
      d.layers = glm5_schedule(*c);
      d.tensors = glm5_tensors(*c);
      // GLM stores its MTP layer as the decoder layer after the last one (arch-glm.md 4).
      for (std::int64_t k = 0; k < std::max<std::int64_t>(c->num_nextn_predict_layers, 1); ++k) {
        d.mtp_prefixes.push_back("layers." + std::to_string(c->num_hidden_layers + k) + ".");
      }
      d.config = std::move(c).value();
      break;
    }
  }
  return d;
}

Expected<ModelDescription> describe_model(const std::string& model_dir) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  const std::string path = stdfs::is_directory(model_dir, ec)
                               ? (stdfs::path(model_dir) / "config.json").string()
                               : model_dir;
  auto text = read_text_file(path);
  if (!text.ok()) return text.status();
  return describe_model_config(*text, path);
}

bool is_mtp_tensor(const ModelDescription& d, const std::string& name) {
  for (const auto& p : d.mtp_prefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

}  // namespace fs
