#include "tokenizer/tokenizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"
#include "util/mapped_file.h"

namespace fs {

using json = nlohmann::json;

namespace {

// Vocabularies are ~150k; anything past this is a corrupt file, not a bigger model.
constexpr std::int64_t kMaxTokenId = 1 << 24;
// Pieces this long rarely repeat; caching them would only evict useful entries.
constexpr std::size_t kMaxCachedPieceBytes = 256;
// Bounds the cache's memory (about 30 MB at this size); it is cleared when full.
constexpr std::size_t kMaxCacheEntries = 1 << 18;

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

std::uint64_t pair_key(TokenId a, TokenId b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
         static_cast<std::uint32_t>(b);
}

// One step of the pre-tokenizer Sequence. ByteLevel with use_regex=false does not split (the
// byte mapping itself happens inside BPE), so it adds no step.
struct SplitStep {
  Regex regex;
  bool removed = false;  // behaviour "Removed" drops the matches; "Isolated" keeps them as pieces
};

// The GPT-2 pattern a ByteLevel pre-tokenizer applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string field_type(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  // Per id: the bytes it decodes to, whether it exists, and whether it is special.
  std::vector<std::string> id_bytes;
  std::vector<std::uint8_t> id_present;
  std::vector<std::uint8_t> id_special;
  StringMap<TokenId> vocab;  // byte-level spelling -> id (model vocabulary only)
  std::array<TokenId, 256> byte_ids{};
  struct Merge {
    std::int32_t rank;
    TokenId merged;
  };
  std::unordered_map<std::uint64_t, Merge> merges;
  bool ignore_merges = false;

  std::vector<const icu::Normalizer2*> normalizers;
  std::vector<SplitStep> splits;

  std::vector<AddedToken> added;
  StringMap<std::size_t> added_by_content;
  // A byte trie over the added tokens' contents for leftmost-longest matching.
  struct TrieNode {
    std::vector<std::pair<unsigned char, std::int32_t>> children;
    std::int32_t token = -1;  // index into `added`
  };
  std::vector<TrieNode> trie{TrieNode{}};
  std::array<bool, 256> added_first_byte{};

  mutable std::mutex cache_mu;
  mutable StringMap<std::vector<TokenId>> cache;
  mutable std::size_t cache_hits = 0, cache_misses = 0;

  Status load(const json& root);
  Status load_model(const json& model);
  Status load_normalizer(const json& n);
  Status load_pre_tokenizer(const json& p);
  Status load_added(const json& list);
  void add_tokens(std::vector<AddedToken> tokens);
  void set_id(TokenId id, std::string bytes, bool special);

  // Longest added token starting at text[i]; returns its index or -1.
  std::int32_t match_added(std::string_view text, std::size_t i, std::size_t& length) const;
  Status encode_section(std::string_view section, std::vector<TokenId>& out) const;
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
};

void Tokenizer::Impl::set_id(TokenId id, std::string bytes, bool special) {
  const auto n = static_cast<std::size_t>(id) + 1;
  if (id_bytes.size() < n) {
    id_bytes.resize(n);
    id_present.resize(n, 0);
    id_special.resize(n, 0);
  }
  id_bytes[id] = std::move(bytes);
  id_present[id] = 1;
  id_special[id] = special ? 1 : 0;
}

Status Tokenizer::Impl::load_model(const json& model) {
  if (!model.is_object()) return corrupt(source + ": field 'model' is missing or not an object");
  const std::string type = field_type(model);
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
    return unsupported(source + ": model type '" + type +
                       "' is not supported (only byte-level BPE)");
  }
  if (model.value("byte_fallback", false))
    return unsupported(source + ": BPE byte_fallback is not supported");
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(f) && model[f].is_string() && !model[f].get<std::string>().empty()) {
      return unsupported(source + ": BPE " + f + " is not supported");
    }
  }
  ignore_merges = model.value("ignore_merges", false);
  const auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object())
    return corrupt(source + ": field 'model.vocab' is missing or not an object");
  vocab.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0 ||
        it->get<std::int64_t>() >= kMaxTokenId) {
      return corrupt(source + ": vocab entry '" + it.key() + "' has an invalid id " + it->dump());
    }
    const auto id = static_cast<TokenId>(it->get<std::int64_t>());
    vocab.emplace(it.key(), id);
    set_id(id, byte_level::token_to_bytes(it.key()), false);
  }
  const auto& strings = byte_level::byte_strings();
  for (int b = 0; b < 256; ++b) {
    const auto f = vocab.find(strings[b]);
    if (f == vocab.end()) {
      return corrupt(source + ": the vocabulary lacks the byte-level token of byte " +
                     std::to_string(b) + " (not a byte-level BPE vocabulary)");
    }
    byte_ids[b] = f->second;
  }
  const auto mit = model.find("merges");
  if (mit == model.end() || !mit->is_array())
    return corrupt(source + ": field 'model.merges' is missing or not a list");
  merges.reserve(mit->size());
  std::int32_t rank = 0;
  for (const auto& m : *mit) {
    std::string a, b;
    if (m.is_string()) {
      // The older serialisation "left right"; byte-level tokens never contain a raw space.
      const auto& s = m.get_ref<const std::string&>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
          s.find(' ', sp + 1) != std::string::npos) {
        return corrupt(source + ": merge " + std::to_string(rank) + " '" + s +
                       "' is not two tokens");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return corrupt(source + ": merge " + std::to_string(rank) +
                     " is neither \"a b\" nor [\"a\", \"b\"]: " + m.dump());
    }
    const auto fa = vocab.find(a), fb = vocab.find(b), fm = vocab.find(a + b);
    if (fa == vocab.end() || fb == vocab.end() || fm == vocab.end()) {
      return corrupt(source + ": merge " + std::to_string(rank) + " (" + a + " " + b +
                     ") names a token outside the vocabulary");
    }
    // The first (lowest-rank) occurrence of a pair wins, as in the reference.
    merges.emplace(pair_key(fa->second, fb->second), Merge{rank, fm->second});
    ++rank;
  }
  return {};
}

Status Tokenizer::Impl::load_normalizer(const json& n) {
  if (n.is_null()) return {};
  const std::string type = field_type(n);
  if (type == "Sequence") {
    if (!n.contains("normalizers") || !n["normalizers"].is_array()) {
      return corrupt(source + ": normalizer Sequence has no 'normalizers' list");
    }
    for (const auto& sub : n["normalizers"]) {
      if (Status s = load_normalizer(sub); !s.ok()) return s;
    }
    return {};
  }
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* form = nullptr;
  if (type == "NFC")
    form = icu::Normalizer2::getNFCInstance(err);
  else if (type == "NFD")
    form = icu::Normalizer2::getNFDInstance(err);
  else if (type == "NFKC")
    form = icu::Normalizer2::getNFKCInstance(err);
  else if (type == "NFKD")
    form = icu::Normalizer2::getNFKDInstance(err);
  else
    return unsupported(source + ": normalizer '" + type + "' is not supported");
  if (U_FAILURE(err) || form == nullptr)
    return internal_error(source + ": ICU has no " + type + " normalizer");
  normalizers.push_back(form);
  return {};
}

Status Tokenizer::Impl::load_pre_tokenizer(const json& p) {
  if (p.is_null()) return {};
  const std::string type = field_type(p);
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
      return corrupt(source + ": pre_tokenizer Sequence has no 'pretokenizers' list");
    }
    for (const auto& sub : p["pretokenizers"]) {
      if (Status s = load_pre_tokenizer(sub); !s.ok()) return s;
    }
    return {};
  }
  if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false))
      return unsupported(source + ": ByteLevel add_prefix_space is not supported");
    if (p.value("use_regex", true)) {
      auto re = Regex::compile(kGpt2Pattern, source + ": ByteLevel regex");
      if (!re.ok()) return re.status();
      splits.push_back(SplitStep{std::move(*re), false});
    }
    return {};
  }
  if (type == "Split") {
    if (p.value("invert", false))
      return unsupported(source + ": Split with invert=true is not supported");
    const std::string behavior = p.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated" && behavior != "Removed") {
      return unsupported(source + ": Split behaviour '" + behavior + "' is not supported");
    }
    const json& pat = p.contains("pattern") ? p["pattern"] : json();
    std::string regex;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      regex = pat["Regex"].get<std::string>();
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      // A literal: escape every ASCII punctuation character.
      for (const char c : pat["String"].get<std::string>()) {
        if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c)))
          regex += '\\';
        regex += c;
      }
    } else {
      return corrupt(source + ": Split pre-tokenizer has no Regex or String pattern");
    }
    auto re = Regex::compile(regex, source + ": Split regex");
    if (!re.ok()) return re.status();
    splits.push_back(SplitStep{std::move(*re), behavior == "Removed"});
    return {};
  }
  return unsupported(source + ": pre-tokenizer '" + type + "' is not supported");
}

Status Tokenizer::Impl::load_added(const json& list) {
  if (list.is_null()) return {};
  if (!list.is_array()) return corrupt(source + ": field 'added_tokens' is not a list");
  std::vector<AddedToken> tokens;
  for (const auto& a : list) {
    auto t = added_token_from_json(a, std::nullopt, source);
    if (!t.ok()) return t.status();
    tokens.push_back(std::move(*t));
  }
  add_tokens(std::move(tokens));
  return {};
}

void Tokenizer::Impl::add_tokens(std::vector<AddedToken> tokens) {
  for (AddedToken& t : tokens) {
    set_id(t.id, t.content, t.special);
    added_by_content[t.content] = added.size();
    added.push_back(std::move(t));
  }
  // Later duplicates of a content replace earlier ones, so the trie is built from the map.
  trie.assign(1, TrieNode{});
  added_first_byte.fill(false);
  for (const auto& [content, index] : added_by_content) {
    std::size_t node = 0;
    for (const char ch : content) {
      const auto c = static_cast<unsigned char>(ch);
      auto& kids = trie[node].children;
      auto it = std::find_if(kids.begin(), kids.end(), [c](const auto& k) { return k.first == c; });
      if (it == kids.end()) {
        trie.push_back(TrieNode{});
        trie[node].children.emplace_back(c, static_cast<std::int32_t>(trie.size() - 1));
        node = trie.size() - 1;
      } else {
        node = static_cast<std::size_t>(it->second);
      }
    }
    trie[node].token = static_cast<std::int32_t>(index);
    added_first_byte[static_cast<unsigned char>(content[0])] = true;
  }
}

Status Tokenizer::Impl::load(const json& root) {
  if (!root.is_object()) return corrupt(source + ": the top level is not a JSON object");
  if (Status s = load_model(root.contains("model") ? root["model"] : json()); !s.ok()) return s;
  if (Status s = load_normalizer(root.value("normalizer", json())); !s.ok()) return s;
  if (Status s = load_pre_tokenizer(root.value("pre_tokenizer", json())); !s.ok()) return s;
  const json decoder = root.value("decoder", json());
  if (field_type(decoder) != "ByteLevel") {
    return unsupported(source + ": decoder '" + field_type(decoder) +
                       "' is not supported (only ByteLevel)");
  }
  return load_added(root.value("added_tokens", json()));
}

namespace {

bool is_word_char(char32_t cp) {
  return cp == '_' || u_isalnum(static_cast<UChar32>(cp));
}

char32_t char_before(std::string_view s, std::size_t i) {
  std::size_t start = i - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return utf8::next(s, start);
}

}  // namespace

std::int32_t Tokenizer::Impl::match_added(std::string_view text, std::size_t i,
                                          std::size_t& length) const {
  std::size_t node = 0;
  std::int32_t best = -1;
  for (std::size_t j = i; j < text.size(); ++j) {
    const auto c = static_cast<unsigned char>(text[j]);
    const auto& kids = trie[node].children;
    auto it = std::find_if(kids.begin(), kids.end(), [c](const auto& k) { return k.first == c; });
    if (it == kids.end()) break;
    node = static_cast<std::size_t>(it->second);
    if (trie[node].token >= 0) {
      const AddedToken& t = added[trie[node].token];
      const std::size_t end = j + 1;
      // single_word: the match must not sit inside a word on either side.
      if (t.single_word &&
          ((i > 0 && is_word_char(char_before(text, i))) || (end < text.size() && [&] {
             std::size_t k = end;
             return is_word_char(utf8::next(text, k));
           }()))) {
        continue;
      }
      best = trie[node].token;
      length = end - i;
    }
  }
  return best;
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  const auto n = static_cast<std::int32_t>(piece.size());
  if (n == 1) {
    out.push_back(byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  // Symbols form a linked list over the piece's bytes; a merge keeps the left symbol (so a
  // symbol's index is the byte offset where it starts) and unlinks the right one.
  struct Symbol {
    TokenId id;
    std::int32_t next;
    std::int32_t prev;
  };
  std::vector<Symbol> sym(static_cast<std::size_t>(n));
  for (std::int32_t k = 0; k < n; ++k) {
    sym[k] = {byte_ids[static_cast<unsigned char>(piece[k])], k + 1 < n ? k + 1 : -1, k - 1};
  }
  // Candidates ordered by rank, then leftmost; stale ones are detected when popped.
  struct Candidate {
    std::int32_t rank, left;
    TokenId left_id, right_id, merged;
  };
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
  };
  std::vector<Candidate> heap;
  heap.reserve(static_cast<std::size_t>(n) * 2);
  auto consider = [&](std::int32_t left) {
    if (left < 0) return;
    const std::int32_t right = sym[left].next;
    if (right < 0) return;
    const auto f = merges.find(pair_key(sym[left].id, sym[right].id));
    if (f == merges.end()) return;
    heap.push_back({f->second.rank, left, sym[left].id, sym[right].id, f->second.merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (std::int32_t k = 0; k + 1 < n; ++k) consider(k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = sym[c.left];
    if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;  // stale
    const std::int32_t right = l.next;
    l.id = c.merged;
    l.next = sym[right].next;
    if (l.next >= 0) sym[l.next].prev = c.left;
    sym[right].id = -1;
    consider(l.prev);
    consider(c.left);
  }
  for (std::int32_t k = 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    if (const auto f = vocab.find(byte_level::bytes_to_token(piece)); f != vocab.end()) {
      out.push_back(f->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mu);
    if (const auto f = cache.find(piece); f != cache.end()) {
      ++cache_hits;
      out.insert(out.end(), f->second.begin(), f->second.end());
      return;
    }
    ++cache_misses;
  }
  const std::size_t before = out.size();
  bpe(piece, out);
  if (cacheable) {
    std::vector<TokenId> ids(out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
    std::lock_guard lock(cache_mu);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(piece), std::move(ids));
  }
}

Status Tokenizer::Impl::encode_section(std::string_view section, std::vector<TokenId>& out) const {
  std::string normalized;
  if (!normalizers.empty()) {
    normalized.assign(section);
    for (const icu::Normalizer2* form : normalizers) {
      UErrorCode err = U_ZERO_ERROR;
      // Most text is already normalized; the quick check skips the copy.
      if (form->isNormalizedUTF8(
              icu::StringPiece(normalized.data(), static_cast<int32_t>(normalized.size())), err) &&
          U_SUCCESS(err)) {
        continue;
      }
      err = U_ZERO_ERROR;
      std::string next;
      icu::StringByteSink<std::string> sink(&next);
      form->normalizeUTF8(
          0, icu::StringPiece(normalized.data(), static_cast<int32_t>(normalized.size())), sink,
          nullptr, err);
      if (U_FAILURE(err))
        return internal_error(source + ": Unicode normalization failed: " + u_errorName(err));
      normalized = std::move(next);
    }
    section = normalized;
  }
  if (section.empty()) return {};
  std::vector<std::string_view> pieces{section}, next;
  for (const SplitStep& step : splits) {
    next.clear();
    for (const std::string_view p : pieces) {
      Status s =
          step.removed ? step.regex.split_removed(p, next) : step.regex.split_isolated(p, next);
      if (!s.ok()) return s;
    }
    pieces.swap(next);
  }
  for (const std::string_view p : pieces) encode_piece(p, out);
  return {};
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Expected<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& source,
                                         std::span<const AddedToken> extra_added) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  try {
    const json root = json::parse(json_text);
    if (Status s = impl->load(root); !s.ok()) return s;
    std::vector<AddedToken> extra;
    for (const AddedToken& t : extra_added) {
      const bool known = impl->added_by_content.count(t.content) > 0 ||
                         std::any_of(impl->added.begin(), impl->added.end(),
                                     [&](const AddedToken& a) { return a.id == t.id; });
      if (!known) extra.push_back(t);
    }
    if (!extra.empty()) impl->add_tokens(std::move(extra));
  } catch (const json::parse_error& e) {
    return corrupt(source + ": not valid JSON: " + e.what());
  } catch (const json::exception& e) {
    // A field of an unexpected type that a check above did not anticipate.
    return corrupt(source + ": unexpected structure: " + e.what());
  }
  return Tokenizer(std::move(impl));
}

Expected<Tokenizer> Tokenizer::from_file(const std::string& path,
                                         std::span<const AddedToken> extra_added) {
  auto text = read_text_file(path, 512u << 20);
  if (!text.ok()) return text.status();
  return from_json(*text, path, extra_added);
}

Expected<AddedToken> added_token_from_json(const nlohmann::json& a, std::optional<TokenId> id,
                                           const std::string& source) {
  const bool has_id =
      id.has_value() || (a.is_object() && a.contains("id") && a["id"].is_number_integer());
  if (!a.is_object() || !has_id || !a.contains("content") || !a["content"].is_string()) {
    return corrupt(source +
                   ": an added token lacks an integer 'id' or a string 'content': " + a.dump());
  }
  AddedToken t;
  t.content = a["content"].get<std::string>();
  const std::int64_t raw_id = id ? *id : a["id"].get<std::int64_t>();
  if (raw_id < 0 || raw_id >= kMaxTokenId || t.content.empty() || !utf8::is_valid(t.content)) {
    return corrupt(source + ": added token " + a.dump() + " has an invalid id or content");
  }
  for (auto [field, slot] : {std::pair{"special", &t.special}, std::pair{"lstrip", &t.lstrip},
                             std::pair{"rstrip", &t.rstrip}, std::pair{"normalized", &t.normalized},
                             std::pair{"single_word", &t.single_word}}) {
    const auto it = a.find(field);
    if (it == a.end() || it->is_null()) continue;
    if (!it->is_boolean())
      return corrupt(source + ": added token field '" + field + "' is not a boolean: " + a.dump());
    *slot = it->get<bool>();
  }
  t.id = static_cast<TokenId>(raw_id);
  return t;
}

Expected<std::vector<TokenId>> Tokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  if (const std::size_t ok = utf8::valid_prefix(text); ok != text.size()) {
    return invalid_argument("text is not valid UTF-8 (at byte " + std::to_string(ok) + ")");
  }
  // Split around added tokens first, so neither normalization nor the regexes can break them.
  struct Section {
    std::string_view text;
    std::int32_t added = -1;
  };
  std::vector<Section> sections;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t len = 0;
    const std::int32_t a =
        m.added_first_byte[static_cast<unsigned char>(text[i])] ? m.match_added(text, i, len) : -1;
    if (a < 0) {
      ++i;
      continue;
    }
    if (i > start) sections.push_back({text.substr(start, i - start)});
    sections.push_back({text.substr(i, len), a});
    i += len;
    start = i;
  }
  if (start < text.size()) sections.push_back({text.substr(start)});
  for (std::size_t k = 0; k < sections.size(); ++k) {
    if (sections[k].added < 0) continue;
    const AddedToken& t = m.added[sections[k].added];
    if (t.lstrip && k > 0 && sections[k - 1].added < 0)
      sections[k - 1].text = utf8::trim_end(sections[k - 1].text);
    if (t.rstrip && k + 1 < sections.size() && sections[k + 1].added < 0) {
      sections[k + 1].text = utf8::trim_start(sections[k + 1].text);
    }
  }
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  for (const Section& s : sections) {
    if (s.added >= 0) {
      out.push_back(m.added[s.added].id);
    } else if (Status st = m.encode_section(s.text, out); !st.ok()) {
      return st;
    }
  }
  return out;
}

Expected<std::string> Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  for (const TokenId id : ids) {
    const auto b = token_bytes(id);
    if (!b)
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
    if (skip_special && impl_->id_special[id]) continue;
    bytes.append(*b);
  }
  return utf8::repair(bytes);
}

std::optional<std::string_view> Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_bytes.size() || !impl_->id_present[id])
    return std::nullopt;
  return std::string_view(impl_->id_bytes[id]);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto f = impl_->added_by_content.find(token); f != impl_->added_by_content.end()) {
    return impl_->added[f->second].id;
  }
  if (const auto f = impl_->vocab.find(token); f != impl_->vocab.end()) return f->second;
  return std::nullopt;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->id_special.size() &&
         impl_->id_special[id];
}

std::size_t Tokenizer::id_space() const {
  return impl_->id_bytes.size();
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

Tokenizer::CacheStats Tokenizer::cache_stats() const {
  std::lock_guard lock(impl_->cache_mu);
  return {impl_->cache_hits, impl_->cache_misses, impl_->cache.size()};
}

void Tokenizer::clear_cache() const {
  std::lock_guard lock(impl_->cache_mu);
  impl_->cache.clear();
  impl_->cache_hits = impl_->cache_misses = 0;
}

}  // namespace fs
