#include "model/family.h"

#include <filesystem>

#include <algorithm>

#include "format/config_json.h"
#include "model/family_table.h"
#include "util/mapped_file.h"

namespace fs {

std::string family_name(Family f) {
  return family_entry(f).model_type;
}

Expected<Family> family_from_model_type(const std::string& t) {
  std::string known;
  for (const auto& e : family_table()) {
    if (t == e.model_type || std::find(e.aliases.begin(), e.aliases.end(), t) != e.aliases.end())
      return e.family;
    known += (known.empty() ? "" : ", ") + e.model_type;
  }
  return unsupported("model_type '" + t + "' is not one of " + known);
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
  if (Status s = family_entry(d.family).describe(*reader, d); !s.ok()) return s;
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
