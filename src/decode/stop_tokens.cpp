#include "decode/stop_tokens.h"

#include <algorithm>

namespace fs {

std::vector<TokenId> turn_stop_tokens(const TokenizerBundle& tokenizer, const ModelInfo& model) {
  std::vector<TokenId> ids = stop_token_ids(tokenizer.metadata, tokenizer.tokenizer);
  for (const TokenId id : model.eos_token_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

}  // namespace fs
