// Vocabulary types shared by the tokenizer, the chat templates and everything downstream.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fs {

// A vocabulary index. Signed 32-bit like the model's embedding lookups, so -1 can mean "none" in
// wire formats without a second type.
using TokenId = std::int32_t;

// A token id written in decimal ("151645"), as in --ids lists and added_tokens_decoder keys;
// nullopt for anything else (signs, spaces, out of range).
inline std::optional<TokenId> parse_token_id(std::string_view text) {
  TokenId id = -1;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (err != std::errc() || end != text.data() + text.size() || text.empty() || id < 0)
    return std::nullopt;
  return id;
}

}  // namespace fs
