// Vocabulary types shared by the tokenizer, the chat templates and everything downstream.
#pragma once

#include <cstdint>

namespace fs {

// A vocabulary index. Signed 32-bit like the model's embedding lookups, so -1 can mean "none" in
// wire formats without a second type.
using TokenId = std::int32_t;

}  // namespace fs
