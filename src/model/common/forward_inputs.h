// The checks every family's forward and MTP head make before they touch a state: the token ids
// inside the vocabulary, and the state's caches of the types the layers need. A forward binds all
// of its caches before it writes any, so a foreign or malformed state fails and changes nothing.
#pragma once

#include <span>
#include <string>

#include "model/model.h"
#include "util/status.h"

namespace fs {

// Every id in [0, vocab_size).
Status check_token_ids(std::span<const TokenId> tokens, std::int64_t vocab_size,
                       const std::string& who = "");

// Exactly `count` caches.
Status check_cache_count(const ModelState& state, std::size_t count);

// Cache `index` of `state`, if it is a T.
template <typename T>
Expected<T*> typed_cache(ModelState& state, std::size_t index) {
  if (index >= state.cache_count())
    return invalid_argument("state has too few caches for this model");
  auto* c = dynamic_cast<T*>(&state.cache(index));
  if (c == nullptr)
    return invalid_argument("state cache " + std::to_string(index) + " has the wrong type");
  return c;
}

}  // namespace fs
