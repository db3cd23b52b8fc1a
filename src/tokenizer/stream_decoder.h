// Incremental detokenization for streaming responses: feed ids one at a time, get back only text
// that is complete UTF-8. Bytes of a character split across tokens are held until the character
// is whole, so a client never sees half a character; the concatenated output equals
// Tokenizer::decode of all the ids.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace fs {

class StreamDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  // The text that `id` completes (often empty or one character behind). Fails on an unknown id,
  // leaving the decoder as it was.
  Expected<std::string> push(TokenId id);
  // Ends the stream: bytes still held (a character that never completed) come out as U+FFFD.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // at most 3 bytes of an unfinished character
};

}  // namespace fs
