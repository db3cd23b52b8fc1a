#include "tokenizer/gguf_tokenizer.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

namespace fs {

using json = nlohmann::json;

namespace {

// A GGUF pre-tokenizer name and what the family's tokenizer.json says in its place: the
// normalizer and the Split regexes, in order, before the ByteLevel step. llama.cpp keys the same
// names to these splits in its llama-vocab.cpp (there rewritten for its own regex engine).
struct GgufPreTokenizer {
  const char* name;
  bool nfc;  // a NFC normalizer
  std::vector<const char*> splits;
};

// Qwen2/Qwen3's split (digits one by one), as the Qwen tokenizer.json writes it.
constexpr const char* kQwen2Split =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// GLM-4's: the same with digits in runs of up to three.
constexpr const char* kGlm4Split =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// DeepSeek V3's three splits: digit runs of up to three, CJK ideograph and kana runs, then the
// rest (letters with their marks, punctuation/symbol runs, whitespace).
constexpr const char* kDeepseekV3Digits = R"re(\p{N}{1,3})re";
constexpr const char* kDeepseekV3Cjk =
    R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re";
constexpr const char* kDeepseekV3Rest =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

const std::vector<GgufPreTokenizer>& pre_tokenizers() {
  static const std::vector<GgufPreTokenizer> table = {
      {"qwen2", true, {kQwen2Split}},
      {"deepseek-v3", false, {kDeepseekV3Digits, kDeepseekV3Cjk, kDeepseekV3Rest}},
      {"glm4", false, {kGlm4Split}},
      {"chatglm-bpe", false, {kGlm4Split}},
  };
  return table;
}

// GGUF token types (the specification's enum).
enum class TokenType : std::int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

const GgufValue* find(const std::map<std::string, GgufValue>& m, const std::string& key) {
  const auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

Expected<std::optional<TokenId>> token_id_key(const std::map<std::string, GgufValue>& m,
                                              const std::string& key, std::size_t count,
                                              const std::string& source) {
  const GgufValue* v = find(m, key);
  if (v == nullptr) return std::optional<TokenId>();
  const auto id = v->as_int();
  if (!id || *id < 0 || static_cast<std::uint64_t>(*id) >= count)
    return corrupt(source + ": " + key + " (" + v->summary() + ") is not a token id below " +
                   std::to_string(count));
  return std::optional<TokenId>(static_cast<TokenId>(*id));
}

const std::vector<std::string>* string_array(const std::map<std::string, GgufValue>& m,
                                             const std::string& key) {
  const GgufValue* v = find(m, key);
  if (v == nullptr || !v->is_array || v->element_type != GgufType::kString) return nullptr;
  return &v->strings;
}

}  // namespace

std::vector<std::string> gguf_pre_tokenizer_names() {
  std::vector<std::string> names;
  for (const auto& p : pre_tokenizers()) names.emplace_back(p.name);
  return names;
}

Expected<std::string> gguf_tokenizer_json(const std::map<std::string, GgufValue>& metadata,
                                          const std::string& source) {
  const GgufValue* model = find(metadata, "tokenizer.ggml.model");
  if (model == nullptr) return not_found(source + ": the file carries no tokenizer.ggml.model");
  const auto kind = model->as_string();
  if (!kind) return corrupt(source + ": tokenizer.ggml.model is not a string");
  if (*kind != "gpt2")
    return unsupported(source + ": tokenizer.ggml.model '" + *kind +
                       "' is not supported (only 'gpt2', byte-level BPE, as these families use)");
  const GgufValue* pre_value = find(metadata, "tokenizer.ggml.pre");
  const auto pre_name = pre_value != nullptr ? pre_value->as_string() : std::nullopt;
  std::string known;
  for (const auto& n : gguf_pre_tokenizer_names()) known += (known.empty() ? "" : ", ") + n;
  if (!pre_name)
    return unsupported(source +
                       ": no tokenizer.ggml.pre string: the pre-tokenizer's split is not "
                       "known (known: " +
                       known + "; or put the model's tokenizer.json beside the file)");
  const GgufPreTokenizer* pre = nullptr;
  for (const auto& p : pre_tokenizers())
    if (*pre_name == p.name) pre = &p;
  if (pre == nullptr)
    return unsupported(source + ": tokenizer.ggml.pre '" + *pre_name +
                       "' has no split known here (known: " + known +
                       "); put the model's tokenizer.json beside the file");

  const auto* tokens = string_array(metadata, "tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->empty())
    return corrupt(source + ": tokenizer.ggml.tokens is missing or not a non-empty string array");
  std::vector<std::int64_t> types(tokens->size(), static_cast<std::int64_t>(TokenType::kNormal));
  if (const GgufValue* tv = find(metadata, "tokenizer.ggml.token_type")) {
    auto t = tv->as_int_array();
    if (!t || t->size() != tokens->size())
      return corrupt(source + ": tokenizer.ggml.token_type (" + tv->summary() +
                     ") is not an integer array of one type per token (" +
                     std::to_string(tokens->size()) + ")");
    types = std::move(*t);
  }
  const auto* merges = string_array(metadata, "tokenizer.ggml.merges");
  if (merges == nullptr)
    return corrupt(source + ": tokenizer.ggml.merges is missing or not a string array");

  json vocab = json::object();
  json added = json::array();
  std::unordered_map<std::string, std::size_t> seen;
  for (std::size_t id = 0; id < tokens->size(); ++id) {
    const std::string& text = (*tokens)[id];
    const auto type = types[id];
    if (type < 1 || type > 6)
      return corrupt(source + ": token " + std::to_string(id) + " has type " +
                     std::to_string(type) + " (GGUF token types are 1-6)");
    if (type == static_cast<std::int64_t>(TokenType::kUnused)) continue;
    if (const auto [it, fresh] = seen.emplace(text, id); !fresh)
      return corrupt(source + ": token '" + text + "' is both id " + std::to_string(it->second) +
                     " and id " + std::to_string(id));
    if (type == static_cast<std::int64_t>(TokenType::kControl) ||
        type == static_cast<std::int64_t>(TokenType::kUserDefined)) {
      added.push_back({{"id", id},
                       {"content", text},
                       {"special", type == static_cast<std::int64_t>(TokenType::kControl)},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"single_word", false}});
    } else {
      vocab[text] = id;
    }
  }
  json pretok = json::array();
  for (const char* re : pre->splits)
    pretok.push_back({{"type", "Split"},
                      {"pattern", {{"Regex", re}}},
                      {"behavior", "Isolated"},
                      {"invert", false}});
  pretok.push_back({{"type", "ByteLevel"},
                    {"add_prefix_space", false},
                    {"trim_offsets", false},
                    {"use_regex", false}});
  json root = {
      {"added_tokens", std::move(added)},
      {"normalizer", pre->nfc ? json{{"type", "NFC"}} : json(nullptr)},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", std::move(pretok)}}},
      {"decoder", {{"type", "ByteLevel"}}},
      // Merges stay in their "left right" form: Tokenizer checks each names two tokens.
      {"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", *merges}}},
  };
  return root.dump();
}

Expected<TokenizerBundle> tokenizer_from_gguf(const std::map<std::string, GgufValue>& metadata,
                                              const std::string& source) {
  std::string text;
  std::string what = source;
  if (const GgufValue* hf = find(metadata, "tokenizer.huggingface.json")) {
    auto s = hf->as_string();
    if (!s) return corrupt(source + ": tokenizer.huggingface.json is not a string");
    text = std::move(*s);
    what += " (tokenizer.huggingface.json)";
  } else {
    auto built = gguf_tokenizer_json(metadata, source);
    if (!built.ok()) return built.status();
    text = std::move(*built);
    what += " (tokenizer.ggml.*)";
  }
  auto tokenizer = Tokenizer::from_json(text, what);
  if (!tokenizer.ok()) return tokenizer.status();
  TokenizerMetadata meta;
  const auto count = tokenizer->id_space();
  std::optional<TokenId> bos, eos, eot;
  for (auto [key, slot] : {std::pair{"tokenizer.ggml.bos_token_id", &bos},
                           std::pair{"tokenizer.ggml.eos_token_id", &eos},
                           std::pair{"tokenizer.ggml.eot_token_id", &eot}}) {
    auto id = token_id_key(metadata, key, count, source);
    if (!id.ok()) return id.status();
    *slot = *id;
  }
  auto spelled = [&](TokenId id) -> std::optional<std::string> {
    const auto b = tokenizer->token_bytes(id);
    return b ? std::optional<std::string>(std::string(*b)) : std::nullopt;
  };
  if (bos) {
    meta.bos_token = spelled(*bos);
    meta.generation_bos_id = *bos;
  }
  if (eos) {
    meta.eos_token = spelled(*eos);
    meta.generation_eos_ids.push_back(*eos);
  }
  // The end-of-turn token ends generation too (chat models stop on it).
  if (eot && eot != eos) meta.generation_eos_ids.push_back(*eot);
  if (const GgufValue* v = find(metadata, "tokenizer.ggml.add_bos_token")) {
    const auto b = v->as_bool();
    if (!b) return corrupt(source + ": tokenizer.ggml.add_bos_token is not a bool");
    meta.add_bos_token = *b;
  }
  if (const GgufValue* v = find(metadata, "tokenizer.chat_template")) {
    auto t = v->as_string();
    if (!t) return corrupt(source + ": tokenizer.chat_template is not a string");
    meta.chat_template = std::move(*t);
  }
  return TokenizerBundle{std::move(*tokenizer), std::move(meta)};
}

}  // namespace fs
