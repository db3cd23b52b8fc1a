// libFuzzer target: the tokenizer. The first byte picks the mode: even, the input (after it) is
// text encoded with the embedded model's tokenizer, then decoded and streamed back (decode of
// encode must be the text, or its NFC form); odd, the input is a tokenizer.json to load.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

#ifndef FLASHSERVE_EMBEDDED_TOKENIZER
#error "FLASHSERVE_EMBEDDED_TOKENIZER must name the embedded model's tokenizer.json"
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    auto t = fs::Tokenizer::from_json(text, "fuzz input");
    if (t.ok()) (void)t->encode("hello world 123");
    return 0;
  }
  static auto tokenizer = fs::Tokenizer::from_file(FLASHSERVE_EMBEDDED_TOKENIZER);
  if (!tokenizer.ok()) __builtin_trap();
  auto ids = tokenizer->encode(text);
  if (!ids.ok()) return 0;
  for (const auto id : *ids)
    if (id < 0 || static_cast<std::size_t>(id) >= tokenizer->id_space()) __builtin_trap();
  const auto decoded = tokenizer->decode(*ids);
  if (!decoded.ok()) __builtin_trap();
  fs::StreamDecoder stream(*tokenizer, /*skip_special=*/false);
  std::string streamed;
  for (const auto id : *ids) {
    auto piece = stream.push(id);
    if (piece.ok()) streamed += *piece;
  }
  streamed += stream.finish();
  if (streamed != *decoded) __builtin_trap();
  return 0;
}
