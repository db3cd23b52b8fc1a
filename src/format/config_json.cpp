#include "format/config_json.h"

#include "format/json_parse.h"
#include "util/mapped_file.h"

namespace fs {

using json = nlohmann::json;

Expected<std::string> read_model_type(const json& root, const std::string& source) {
  if (root.contains("text_config") && root["text_config"].is_object() &&
      root["text_config"].contains("model_type") && root["text_config"]["model_type"].is_string()) {
    return root["text_config"]["model_type"].get<std::string>();
  }
  if (root.contains("model_type") && root["model_type"].is_string()) {
    return root["model_type"].get<std::string>();
  }
  return invalid_argument(source + ": field 'model_type' is missing or not a string");
}

Expected<ConfigReader> ConfigReader::parse(const std::string& text, const std::string& source) {
  auto parsed = parse_json_bounded(text);
  if (!parsed.ok()) return invalid_argument(source + ": " + parsed.status().message());
  json root = std::move(*parsed);
  if (!root.is_object()) return invalid_argument(source + ": the top level is not a JSON object");
  json merged = json::object();
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "text_config" || it.key() == "vision_config") continue;
    merged[it.key()] = it.value();
  }
  if (root.contains("text_config")) {
    if (!root["text_config"].is_object())
      return invalid_argument(source + ": field 'text_config' is not an object");
    for (auto it = root["text_config"].begin(); it != root["text_config"].end(); ++it) {
      merged[it.key()] = it.value();
    }
  }
  return ConfigReader(std::move(merged), source);
}

Expected<ConfigReader> ConfigReader::from_file(const std::string& path) {
  auto text = read_text_file(path);
  if (!text.ok()) return text.status();
  return parse(*text, path);
}

ConfigReader::ConfigReader(json merged, std::string source)
    : merged_(std::move(merged)), source_(std::move(source)) {}

const json* ConfigReader::find(const std::string& field) const {
  const auto it = merged_.find(field);
  if (it == merged_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool ConfigReader::has(const std::string& field) const {
  return find(field) != nullptr;
}

void ConfigReader::fail(const std::string& field, const std::string& why) {
  if (!first_error_) first_error_ = source_ + ": field '" + field + "' " + why;
}

void ConfigReader::require_positive(const std::string& field, std::int64_t value) {
  if (value <= 0) fail(field, "must be positive, got " + std::to_string(value));
}

Status ConfigReader::status() const {
  if (first_error_) return invalid_argument(*first_error_);
  return {};
}

std::int64_t ConfigReader::integer_or(const std::string& field, std::int64_t fallback) {
  const json* v = find(field);
  if (!v) return fallback;
  if (!v->is_number_integer()) {
    // 4.0 in a config written by Python for an int field is common; accept exact integers.
    if (v->is_number_float() &&
        v->get<double>() == static_cast<double>(static_cast<std::int64_t>(v->get<double>()))) {
      return static_cast<std::int64_t>(v->get<double>());
    }
    fail(field, "must be an integer, got " + v->dump());
    return fallback;
  }
  return v->get<std::int64_t>();
}

std::int64_t ConfigReader::integer(const std::string& field) {
  if (!find(field)) {
    fail(field, "is required");
    return 0;
  }
  return integer_or(field, 0);
}

double ConfigReader::number_or(const std::string& field, double fallback) {
  const json* v = find(field);
  if (!v) return fallback;
  if (!v->is_number()) {
    fail(field, "must be a number, got " + v->dump());
    return fallback;
  }
  return v->get<double>();
}

double ConfigReader::number(const std::string& field) {
  if (!find(field)) {
    fail(field, "is required");
    return 0;
  }
  return number_or(field, 0);
}

bool ConfigReader::boolean_or(const std::string& field, bool fallback) {
  const json* v = find(field);
  if (!v) return fallback;
  if (!v->is_boolean()) {
    fail(field, "must be true or false, got " + v->dump());
    return fallback;
  }
  return v->get<bool>();
}

bool ConfigReader::boolean(const std::string& field) {
  if (!find(field)) {
    fail(field, "is required");
    return false;
  }
  return boolean_or(field, false);
}

std::string ConfigReader::string_or(const std::string& field, const std::string& fallback) {
  const json* v = find(field);
  if (!v) return fallback;
  if (!v->is_string()) {
    fail(field, "must be a string, got " + v->dump());
    return fallback;
  }
  return v->get<std::string>();
}

std::string ConfigReader::string(const std::string& field) {
  if (!find(field)) {
    fail(field, "is required");
    return {};
  }
  return string_or(field, {});
}

std::optional<std::vector<std::int64_t>> ConfigReader::integers_opt(const std::string& field) {
  const json* v = find(field);
  if (!v) return std::nullopt;
  if (!v->is_array()) {
    fail(field, "must be a list of integers, got " + v->dump());
    return std::nullopt;
  }
  std::vector<std::int64_t> out;
  for (const auto& e : *v) {
    if (!e.is_number_integer()) {
      fail(field, "must be a list of integers, has " + e.dump());
      return std::nullopt;
    }
    out.push_back(e.get<std::int64_t>());
  }
  return out;
}

std::vector<std::int64_t> ConfigReader::integers(const std::string& field) {
  if (!find(field)) {
    fail(field, "is required");
    return {};
  }
  return integers_opt(field).value_or(std::vector<std::int64_t>{});
}

std::optional<std::vector<std::string>> ConfigReader::strings_opt(const std::string& field) {
  const json* v = find(field);
  if (!v) return std::nullopt;
  if (!v->is_array()) {
    fail(field, "must be a list of strings, got " + v->dump());
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) {
      fail(field, "must be a list of strings, has " + e.dump());
      return std::nullopt;
    }
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<std::string> ConfigReader::strings(const std::string& field) {
  if (!find(field)) {
    fail(field, "is required");
    return {};
  }
  return strings_opt(field).value_or(std::vector<std::string>{});
}

std::vector<std::int64_t> ConfigReader::token_ids(const std::string& field) {
  const json* v = find(field);
  if (!v) return {};
  if (v->is_number_integer()) return {v->get<std::int64_t>()};
  return integers_opt(field).value_or(std::vector<std::int64_t>{});
}

}  // namespace fs
