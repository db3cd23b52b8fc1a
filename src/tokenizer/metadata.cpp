#include "tokenizer/metadata.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "format/config_json.h"
#include "format/gguf.h"
#include "format/json_parse.h"
#include "tokenizer/gguf_tokenizer.h"
#include "util/mapped_file.h"

namespace fs {

using json = nlohmann::json;

namespace {

// A special token is written either as its content or as {"content": ..., "lstrip": ...}.
Expected<std::optional<std::string>> token_field(const json& root, const char* field,
                                                 const std::string& source) {
  const auto it = root.find(field);
  if (it == root.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return std::optional<std::string>((*it)["content"].get<std::string>());
  }
  return invalid_argument(source + ": field '" + field +
                          "' must be a string or an object with 'content'");
}

}  // namespace

Expected<TokenizerMetadata> load_tokenizer_metadata(const std::string& dir) {
  TokenizerMetadata meta;
  const std::string config_path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  if (std::filesystem::exists(config_path)) {
    auto text = read_text_file(config_path);
    if (!text.ok()) return text.status();
    auto parsed = parse_json_bounded(*text);
    if (!parsed.ok()) return invalid_argument(config_path + ": " + parsed.status().message());
    json root = std::move(*parsed);
    if (!root.is_object())
      return invalid_argument(config_path + ": the top level is not a JSON object");
    for (auto [field, slot] :
         {std::pair{"bos_token", &meta.bos_token}, std::pair{"eos_token", &meta.eos_token},
          std::pair{"pad_token", &meta.pad_token}}) {
      auto v = token_field(root, field, config_path);
      if (!v.ok()) return v.status();
      *slot = *v;
    }
    if (const auto it = root.find("added_tokens_decoder"); it != root.end() && !it->is_null()) {
      if (!it->is_object())
        return invalid_argument(config_path + ": field 'added_tokens_decoder' is not an object");
      for (auto e = it->begin(); e != it->end(); ++e) {
        const auto id = parse_token_id(e.key());
        if (!id) {
          return invalid_argument(config_path + ": added_tokens_decoder key '" + e.key() +
                                  "' is not a token id");
        }
        auto t = added_token_from_json(e.value(), *id, config_path);
        if (!t.ok()) return t.status();
        meta.added_tokens.push_back(std::move(*t));
      }
    }
    if (const auto it = root.find("add_bos_token"); it != root.end() && it->is_boolean())
      meta.add_bos_token = it->get<bool>();
    if (const auto it = root.find("chat_template"); it != root.end() && !it->is_null()) {
      if (it->is_string()) {
        meta.chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        // Several named templates: the one named "default" is the chat template.
        for (const auto& t : *it) {
          if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
              t["template"].is_string()) {
            meta.chat_template = t["template"].get<std::string>();
          }
        }
      } else {
        return invalid_argument(
            config_path + ": field 'chat_template' must be a string or a list of named templates");
      }
    }
  }
  const std::string gen_path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (std::filesystem::exists(gen_path)) {
    auto reader = ConfigReader::from_file(gen_path);
    if (!reader.ok()) return reader.status();
    for (const std::int64_t id : reader->token_ids("eos_token_id")) {
      if (id < 0 || id > INT32_MAX)
        return invalid_argument(gen_path + ": eos_token_id " + std::to_string(id) +
                                " is out of range");
      meta.generation_eos_ids.push_back(static_cast<TokenId>(id));
    }
    const auto bos = reader->token_ids("bos_token_id");
    if (!bos.empty()) meta.generation_bos_id = static_cast<TokenId>(bos.front());
    if (Status s = reader->status(); !s.ok()) return s;
  }
  return meta;
}

std::vector<TokenId> stop_token_ids(const TokenizerMetadata& meta, const Tokenizer& tokenizer) {
  std::vector<TokenId> ids = meta.generation_eos_ids;
  if (meta.eos_token) {
    if (const auto id = tokenizer.token_to_id(*meta.eos_token);
        id && std::find(ids.begin(), ids.end(), *id) == ids.end()) {
      ids.push_back(*id);
    }
  }
  return ids;
}

Expected<TokenizerBundle> load_tokenizer_dir(const std::string& path) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  // A model given as one file (a GGUF file): a tokenizer.json beside it wins (the user put it
  // there; ds4's files are used that way), else the tokenizer the file carries
  // (gguf_tokenizer.h).
  if (stdfs::is_regular_file(path, ec)) {
    const auto folder = stdfs::path(path).parent_path();
    const std::string dir = folder.empty() ? std::string(".") : folder.string();
    if (stdfs::exists(stdfs::path(dir) / "tokenizer.json", ec)) return load_tokenizer_dir(dir);
    auto model = GgufModel::open(path);
    if (!model.ok()) return model.status();
    auto bundle = tokenizer_from_gguf(model->metadata(), path);
    if (bundle.status().code() == ErrorCode::kNotFound)
      return not_found("model file " + path + " carries no tokenizer and " + dir +
                       " has no tokenizer.json beside it (put the model's tokenizer.json, and "
                       "tokenizer_config.json for its chat template, there)");
    return bundle;
  }
  const std::string& dir = path;
  if (!stdfs::is_directory(dir)) return not_found("tokenizer folder " + dir + " does not exist");
  auto meta = load_tokenizer_metadata(dir);
  if (!meta.ok()) return meta.status();
  auto tokenizer = Tokenizer::from_file((std::filesystem::path(dir) / "tokenizer.json").string(),
                                        meta->added_tokens);
  if (!tokenizer.ok()) return tokenizer.status();
  return TokenizerBundle{std::move(*tokenizer), std::move(*meta)};
}

}  // namespace fs
