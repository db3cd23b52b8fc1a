#include "model/common/forward_inputs.h"

namespace fs {

Status check_token_ids(std::span<const TokenId> tokens, std::int64_t vocab_size,
                       const std::string& who) {
  for (const auto t : tokens) {
    if (t < 0 || t >= vocab_size)
      return invalid_argument(who + "token id " + std::to_string(t) +
                              " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  }
  return {};
}

Status check_cache_count(const ModelState& state, std::size_t count) {
  if (state.cache_count() != count)
    return invalid_argument("state has " + std::to_string(state.cache_count()) +
                            " caches, this model " + std::to_string(count));
  return {};
}

}  // namespace fs
