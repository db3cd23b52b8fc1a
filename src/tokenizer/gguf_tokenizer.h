// The tokenizer a GGUF file carries in its metadata, so that a model downloaded as one GGUF file
// (as ds4 and llama.cpp publish them) tokenizes without a tokenizer.json beside it.
//
// Two forms are read, as the GGUF specification defines them:
//   - `tokenizer.huggingface.json`: the model's whole tokenizer.json as one string (used as is);
//   - `tokenizer.ggml.*`: `model` ("gpt2", byte-level BPE: the only kind these families use),
//     `tokens` (by id), `token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
//     6 byte), `merges` ("left right", by rank) and `pre`, the name of the pre-tokenizer. GGUF
//     does not store the pre-tokenizer's split regexes, so `pre` is looked up in a table of the
//     names the three families' files use (kGgufPreTokenizers in the .cpp: each entry is the
//     normalizer and Split regexes of that family's own tokenizer.json); any other name is
//     refused with the list, rather than guessed.
// Control tokens become special added tokens and user-defined ones non-special added tokens
// (what convert_hf_to_gguf makes of a tokenizer.json's added_tokens); unused ids (padding
// entries) are left out of the vocabulary. `tokenizer.ggml.bos_token_id` / `eos_token_id` /
// `eot_token_id` / `add_bos_token` and `tokenizer.chat_template` fill the metadata.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "tokenizer/metadata.h"
#include "util/status.h"

namespace fs {

// The pre-tokenizer names kGgufPreTokenizers knows, for messages and docs.
std::vector<std::string> gguf_pre_tokenizer_names();

// The tokenizer.json (as JSON text) that the `tokenizer.ggml.*` keys describe; `source` names
// the file in messages. Every inconsistency (counts, types, ids, merges) is an error naming it.
Expected<std::string> gguf_tokenizer_json(const std::map<std::string, GgufValue>& metadata,
                                          const std::string& source);

// The tokenizer and metadata of a GGUF model's metadata (either form above). not_found when the
// file carries no tokenizer at all.
Expected<TokenizerBundle> tokenizer_from_gguf(const std::map<std::string, GgufValue>& metadata,
                                              const std::string& source);

}  // namespace fs
