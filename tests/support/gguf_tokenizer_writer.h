// A tokenizer.json as a GGUF file's tokenizer.ggml.* arrays, laid out as convert_hf_to_gguf
// writes them: every id up to the largest, padding ids "[PAD<id>]" of type unused (5), added
// tokens control (3) when special and user-defined (4) otherwise, the rest normal (1); merges as
// "left right" strings by rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf_test_writer.h"

namespace fs::test {

struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  std::vector<std::string> merges;
};

GgufVocab vocab_of(const std::string& tokenizer_json_path);

// Adds tokenizer.ggml.model "gpt2", tokenizer.ggml.pre (unless empty), tokens, token_type and
// merges to g.
GgufBuilder& put_vocab(GgufBuilder& g, const GgufVocab& v, const std::string& pre);

}  // namespace fs::test
