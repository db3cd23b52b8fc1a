// Vocabulary types shared by every layer above the tensors.
#pragma once

#include <cstdint>

namespace fs {

using TokenId = std::int32_t;
// A token's index in its sequence (0-based); also the count of tokens before it.
using Position = std::int64_t;

}  // namespace fs
