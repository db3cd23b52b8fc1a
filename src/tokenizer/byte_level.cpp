#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace fs::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> cp_of_byte{};
  // Inverse over the alphabet's range (U+0000..U+0143); -1 where no byte maps.
  std::array<int, 0x144> byte_of_cp{};
  std::array<std::string, 256> strings;

  Tables() {
    byte_of_cp.fill(-1);
    // Printable bytes keep their code point; the rest are numbered from 256 in byte order.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp =
          printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      cp_of_byte[b] = cp;
      byte_of_cp[cp] = b;
      utf8::append(strings[b], cp);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t char_of_byte(std::uint8_t b) {
  return tables().cp_of_byte[b];
}

const std::array<std::string, 256>& byte_strings() {
  return tables().strings;
}

std::string token_to_bytes(std::string_view token) {
  const Tables& t = tables();
  std::string out;
  out.reserve(token.size());
  std::size_t i = 0;
  while (i < token.size()) {
    const std::size_t start = i;
    const char32_t cp = utf8::next(token, i);
    if (cp < t.byte_of_cp.size() && t.byte_of_cp[cp] >= 0) {
      out.push_back(static_cast<char>(t.byte_of_cp[cp]));
    } else {
      out.append(token.substr(start, i - start));
    }
  }
  return out;
}

std::string bytes_to_token(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += tables().strings[static_cast<std::uint8_t>(c)];
  return out;
}

}  // namespace fs::byte_level
