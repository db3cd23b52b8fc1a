// GPT-2's byte-level alphabet: every byte is shown as one printable code point, so a BPE
// vocabulary of strings can cover arbitrary bytes. Bytes that are printable Latin-1 map to
// themselves; the others (controls, space, soft hyphen...) to U+0100 upwards, in byte order.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace fs::byte_level {

// The code point that stands for byte b.
char32_t char_of_byte(std::uint8_t b);
// The UTF-8 string of char_of_byte(b) for each byte, precomputed.
const std::array<std::string, 256>& byte_strings();

// Maps a vocabulary token (a string of byte-level code points) back to the bytes it stands for.
// A code point outside the alphabet (never in a well-formed vocabulary) is kept as its UTF-8.
std::string token_to_bytes(std::string_view token);
// Maps raw bytes to the byte-level string, e.g. " hi" -> "Ġhi".
std::string bytes_to_token(std::string_view bytes);

}  // namespace fs::byte_level
