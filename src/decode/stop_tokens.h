// The stop tokens of a turn, one definition for every front end (`run`, `generate` by default,
// the server): the tokenizer's end-of-turn and end-of-text ids plus the model config's
// eos_token_id list, in that order, without repeats.
#pragma once

#include <vector>

#include "model/model.h"
#include "tokenizer/metadata.h"

namespace fs {

std::vector<TokenId> turn_stop_tokens(const TokenizerBundle& tokenizer, const ModelInfo& model);

}  // namespace fs
