// Typed access to a model's config.json. Text-model fields may sit at the top level or under
// `text_config` (multimodal checkpoints); the reader merges the two, text_config winning, and
// every accessor names the field when a value is missing or of the wrong type.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace fs {

class ConfigReader {
 public:
  // Parses config.json text; `source` names it in messages.
  static Expected<ConfigReader> parse(const std::string& text, const std::string& source);
  static Expected<ConfigReader> from_file(const std::string& path);
  explicit ConfigReader(nlohmann::json merged, std::string source);

  const std::string& source() const { return source_; }
  const nlohmann::json& root() const { return merged_; }
  bool has(const std::string& field) const;

  // Required fields: a missing or mistyped field records an error and returns a zero value, so a
  // family parser reads every field and then reports the first problem via status().
  std::int64_t integer(const std::string& field);
  double number(const std::string& field);
  bool boolean(const std::string& field);
  std::string string(const std::string& field);
  std::vector<std::int64_t> integers(const std::string& field);
  std::vector<std::string> strings(const std::string& field);

  // Optional fields with a default; a present value of the wrong type is still an error.
  std::int64_t integer_or(const std::string& field, std::int64_t fallback);
  double number_or(const std::string& field, double fallback);
  bool boolean_or(const std::string& field, bool fallback);
  std::string string_or(const std::string& field, const std::string& fallback);
  std::optional<std::vector<std::string>> strings_opt(const std::string& field);
  std::optional<std::vector<std::int64_t>> integers_opt(const std::string& field);
  // eos_token_id and friends: an int, a list of ints (first is the primary), or null/absent.
  std::vector<std::int64_t> token_ids(const std::string& field);

  // Records a validation failure (the first one wins) of `field`.
  void fail(const std::string& field, const std::string& why);
  // fail(field, ...) unless value > 0.
  void require_positive(const std::string& field, std::int64_t value);
  Status status() const;

 private:
  const nlohmann::json* find(const std::string& field) const;
  nlohmann::json merged_;
  std::string source_;
  std::optional<std::string> first_error_;
};

// The model_type of the text model: text_config.model_type when present, else the top level's.
Expected<std::string> read_model_type(const nlohmann::json& root, const std::string& source);

}  // namespace fs
