// A Responses request's prompt: the conversation (a stored predecessor's, then this input)
// rendered by the family's chat template, how the output is to be read, and the prompt's tokens.
//
// Warm continuation: the model state banked after the previous turn covers exactly its prompt
// and generated tokens. When this prompt's text extends that turn's text (its prompt, then the
// generated tokens written out, special tokens included) at a token boundary, the previous
// tokens are reused verbatim for that part and only the rest is tokenized, so the session bank
// continues the state even where re-tokenizing the generated text would split it differently.
// Where the template renders the earlier turn otherwise (Qwen drops the reasoning of turns
// before the latest user query), the prompt diverges there and the bank continues from the
// longest state it holds (at least the previous prompt's, when that is a prefix).
#pragma once

#include <variant>
#include <vector>

#include "server/api_error.h"
#include "server/assistant_output.h"
#include "server/response_store.h"
#include "server/responses_request.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/tokenizer.h"

namespace fs::server {

struct ResponsesPrompt {
  std::string text;  // as rendered, plus a forced call's opening
  std::vector<TokenId> tokens;
  bool continued = false;  // the previous turn's tokens are reused as the prefix
  // How the model output is read: reasoning, tool calls when tools are offered, the forced
  // call's opening as the output's start.
  AssistantOutputOptions output;
  bool tools_offered = false;
};

std::variant<ResponsesPrompt, ApiError> build_responses_prompt(const Tokenizer& tokenizer,
                                                               ChatFamily family,
                                                               const ChatSpecialTokens& special,
                                                               const ResponsesRequest& request,
                                                               const StoredResponse* previous);

// What the store keeps of a finished turn for the next one to continue: its tokens (prompt,
// then generated) and their text. Empty when the turn committed no complete state.
void record_continuation(const Tokenizer& tokenizer, const ResponsesPrompt& prompt,
                         const std::vector<TokenId>& generated, StoredResponse& entry);

}  // namespace fs::server
