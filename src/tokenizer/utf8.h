// UTF-8 helpers the tokenizer needs: walking code points, repairing invalid bytes the way the
// references do (U+FFFD per maximal invalid subpart), and the JavaScript whitespace set that the
// reference tokenizers' regexes and the reference Jinja's strip() use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fs::utf8 {

// Length of the longest prefix of `s` that is valid, complete UTF-8.
std::size_t valid_prefix(std::string_view s);
inline bool is_valid(std::string_view s) {
  return valid_prefix(s) == s.size();
}

// Number of trailing bytes of `s` that form an incomplete (but so far valid) sequence, which more
// bytes could complete: 0..3. A streaming decoder holds these back.
std::size_t incomplete_suffix(std::string_view s);

// Replaces every maximal invalid subpart by U+FFFD (the WHATWG/Unicode "best practice" that both
// TextDecoder and Rust's from_utf8_lossy follow), so decoded text is always valid UTF-8.
std::string repair(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
char32_t next(std::string_view s, std::size_t& i);
void append(std::string& out, char32_t cp);

// JavaScript's \s (WhiteSpace + LineTerminator): what String.prototype.trim() removes and what
// the reference tokenizers' regexes match. It differs from Unicode White_Space: it has U+FEFF
// and lacks U+0085.
bool is_js_space(char32_t cp);
// The same set as the body of a PCRE2 character class.
extern const char* const kJsSpaceClassBody;

// JavaScript trim()/trimStart()/trimEnd() on UTF-8 text.
std::string_view trim(std::string_view s);
std::string_view trim_start(std::string_view s);
std::string_view trim_end(std::string_view s);

}  // namespace fs::utf8
