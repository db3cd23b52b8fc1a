// What a model folder says about its tokenizer beyond tokenizer.json: the special-token strings
// and chat template (tokenizer_config.json) and the ids that end generation
// (generation_config.json, whose eos_token_id may be one id or a list).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/types.h"
#include "util/status.h"

namespace fs {

struct TokenizerMetadata {
  std::optional<std::string> bos_token, eos_token, pad_token;
  bool add_bos_token = false;
  std::string chat_template;  // the default template's source; empty when the folder has none
  std::vector<AddedToken> added_tokens;     // tokenizer_config.json added_tokens_decoder
  std::vector<TokenId> generation_eos_ids;  // generation_config.json eos_token_id
  std::optional<TokenId> generation_bos_id;
};

// Reads DIR/tokenizer_config.json and DIR/generation_config.json; either may be absent, but a
// present file that is malformed is an error naming it.
Expected<TokenizerMetadata> load_tokenizer_metadata(const std::string& dir);

// Every id that ends a turn: generation_config's eos ids, then the tokenizer's eos token, without
// duplicates.
std::vector<TokenId> stop_token_ids(const TokenizerMetadata& meta, const Tokenizer& tokenizer);

// A model folder's tokenizer: DIR/tokenizer.json plus the metadata above. For a model given as
// a file (a GGUF file), the folder it is in.
struct TokenizerBundle {
  Tokenizer tokenizer;
  TokenizerMetadata metadata;
};
Expected<TokenizerBundle> load_tokenizer_dir(const std::string& path);

}  // namespace fs
