#include "gguf_tokenizer_writer.h"

#include <map>
#include <nlohmann/json.hpp>

#include "util/mapped_file.h"

namespace fs::test {

GgufVocab vocab_of(const std::string& tokenizer_json_path) {
  const auto root = nlohmann::json::parse(*read_text_file(tokenizer_json_path));
  std::map<std::int64_t, std::pair<std::string, int>> by_id;
  for (const auto& [text, id] : root["model"]["vocab"].items())
    by_id[id.get<std::int64_t>()] = {text, 1};
  for (const auto& a : root["added_tokens"])
    by_id[a["id"].get<std::int64_t>()] = {a["content"].get<std::string>(),
                                          a["special"].get<bool>() ? 3 : 4};
  GgufVocab v;
  const auto n = by_id.rbegin()->first + 1;
  for (std::int64_t id = 0; id < n; ++id) {
    const auto it = by_id.find(id);
    v.tokens.push_back(it != by_id.end() ? it->second.first : "[PAD" + std::to_string(id) + "]");
    v.types.push_back(it != by_id.end() ? it->second.second : 5);
  }
  for (const auto& m : root["model"]["merges"])
    v.merges.push_back(m.is_string() ? m.get<std::string>()
                                     : m[0].get<std::string>() + " " + m[1].get<std::string>());
  return v;
}

GgufBuilder& put_vocab(GgufBuilder& g, const GgufVocab& v, const std::string& pre) {
  g.kv_string("tokenizer.ggml.model", "gpt2");
  if (!pre.empty()) g.kv_string("tokenizer.ggml.pre", pre);
  g.kv_string_array("tokenizer.ggml.tokens", v.tokens);
  g.kv_i32_array("tokenizer.ggml.token_type", v.types);
  g.kv_string_array("tokenizer.ggml.merges", v.merges);
  return g;
}

}  // namespace fs::test
