// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (the Qwen3 and DeepSeek V3
// shapes: NFC or no normalizer, a Sequence of Split regexes + ByteLevel, BPE with merges by rank,
// a ByteLevel decoder).
//
// Encoding: added tokens are matched first, leftmost-longest, on the raw text; the text between
// them is normalized, split by the pre-tokenizer's regexes, and each piece is BPE-merged from its
// bytes. Results for pieces are cached, so common words cost one hash lookup.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/types.h"
#include "util/status.h"

namespace fs {

struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false;      // skipped by decode(skip_special=true)
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool normalized = false;   // see ARCHITECTURE.md: matched on the raw text like the reference
  bool single_word = false;  // matches only between non-word characters
};

// Reads one added-token entry ({"id", "content", "special", "lstrip", ...}); `id` supplies the id
// when the entry is keyed by it (tokenizer_config.json) rather than holding it.
Expected<AddedToken> added_token_from_json(const nlohmann::json& entry, std::optional<TokenId> id,
                                           const std::string& source);

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names it in messages. `extra_added` are added tokens
  // declared elsewhere (tokenizer_config.json's added_tokens_decoder); those whose id or content
  // tokenizer.json already has are ignored.
  static Expected<Tokenizer> from_json(std::string_view json_text, const std::string& source,
                                       std::span<const AddedToken> extra_added = {});
  static Expected<Tokenizer> from_file(const std::string& path,
                                       std::span<const AddedToken> extra_added = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` with no special tokens added (no BOS). Fails only on invalid UTF-8.
  Expected<std::vector<TokenId>> encode(std::string_view text) const;

  // The text of `ids`; invalid UTF-8 produced by a partial sequence becomes U+FFFD. Fails on an
  // id outside the vocabulary.
  Expected<std::string> decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // The raw bytes one token stands for (an added token's content, a vocabulary token's bytes),
  // or nullopt for an id outside the vocabulary. Streaming decoders concatenate these.
  std::optional<std::string_view> token_bytes(TokenId id) const;

  // The id of a vocabulary token (byte-level spelling, e.g. "Ġhello") or of an added token.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  bool is_special(TokenId id) const;
  // One more than the largest id (vocabulary and added tokens).
  std::size_t id_space() const;
  const std::vector<AddedToken>& added_tokens() const;

  // Piece-cache counters, for the benchmark.
  struct CacheStats {
    std::size_t hits = 0, misses = 0, entries = 0;
  };
  CacheStats cache_stats() const;
  void clear_cache() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fs
