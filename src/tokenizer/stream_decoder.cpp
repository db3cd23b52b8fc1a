#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace fs {

Expected<std::string> StreamDecoder::push(TokenId id) {
  const auto bytes = tokenizer_->token_bytes(id);
  if (!bytes)
    return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
  if (skip_special_ && tokenizer_->is_special(id)) return std::string();
  pending_.append(*bytes);
  // Invalid bytes are decided by what precedes them, so repairing the complete part now gives
  // the same U+FFFDs as decoding everything at the end.
  const std::size_t hold = utf8::incomplete_suffix(pending_);
  std::string out = utf8::repair(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::repair(pending_);
  pending_.clear();
  return out;
}

}  // namespace fs
