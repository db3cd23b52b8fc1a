#include "server/responses_prompt.h"

namespace fs::server {
namespace {

// How the model output is read: reasoning and (when tools are offered) tool calls. A forced
// call (tool_choice required, or a named function) starts the assistant turn with the family's
// tool-call opening, which the output reader takes as the start of the output; required with
// one function names it. Unlike the chat endpoint, thinking stays as requested: the template
// renders a call turn without a think block, so a forced turn's prompt is exactly what a
// follow-up re-renders.
AssistantOutputOptions output_options(ChatFamily family, const ResponsesRequest& r, bool use_tools,
                                      std::string_view rendered, std::string& prompt_suffix) {
  AssistantOutputOptions o;
  o.parser.family = family;
  o.parser.parse_tool_calls = use_tools;
  o.parser.parse_reasoning = true;
  o.parser.starts_in_reasoning = prompt_opens_reasoning(rendered);
  const auto mode = r.tool_choice.mode;
  if (use_tools && (mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kFunction)) {
    std::string name = mode == ToolChoice::Mode::kFunction ? r.tool_choice.name : std::string();
    if (name.empty() && r.function_names.size() == 1) name = r.function_names[0];
    o.forced_prefix = forced_call_feed(family, name);
    // The prompt gets the opening, after closing the think block that the template opened
    // (GLM 5.3, DeepSeek V4 thinking).
    prompt_suffix =
        (o.parser.starts_in_reasoning ? "</think>" : "") + tool_call_prefix(family, name);
    o.parser.starts_in_reasoning = false;
  }
  return o;
}

// True when `text` extends the previous turn's text at a token boundary: the previous tokens
// end with a special token, or the rest starts with one (special tokens are split out before
// any merging, so no token spans the seam).
bool extends_at_boundary(const Tokenizer& tokenizer, std::string_view text,
                         const StoredResponse& previous, const std::vector<TokenId>& rest) {
  if (previous.tokens.empty() || text.size() <= previous.text.size() ||
      text.substr(0, previous.text.size()) != previous.text)
    return false;
  return tokenizer.is_special(previous.tokens.back()) ||
         (!rest.empty() && tokenizer.is_special(rest.front()));
}

}  // namespace

std::variant<ResponsesPrompt, ApiError> build_responses_prompt(const Tokenizer& tokenizer,
                                                               ChatFamily family,
                                                               const ChatSpecialTokens& special,
                                                               const ResponsesRequest& r,
                                                               const StoredResponse* previous) {
  ResponsesPrompt p;
  p.tools_offered = r.tool_choice.mode != ToolChoice::Mode::kNone && !r.function_names.empty();
  const std::vector<ResponseItem> none;
  ChatRequest chat = conversation_chat(
      r.instructions, previous ? previous->conversation : none, r.input,
      p.tools_offered ? r.tools : nlohmann::ordered_json::array(), r.enable_thinking);
  chat.reasoning_effort = r.reasoning_effort;
  auto rendered = render_chat(family, chat, special);
  if (!rendered.ok()) return ApiError::invalid("input", rendered.status().message());
  std::string suffix;
  p.output = output_options(family, r, p.tools_offered, *rendered, suffix);
  p.text = std::move(*rendered) + suffix;

  if (previous && !previous->tokens.empty() && p.text.size() > previous->text.size() &&
      std::string_view(p.text).substr(0, previous->text.size()) == previous->text) {
    auto rest = tokenizer.encode(std::string_view(p.text).substr(previous->text.size()));
    if (!rest.ok()) return ApiError::invalid("input", rest.status().message());
    if (extends_at_boundary(tokenizer, p.text, *previous, *rest)) {
      p.tokens = previous->tokens;
      p.tokens.insert(p.tokens.end(), rest->begin(), rest->end());
      p.continued = true;
      return p;
    }
  }
  auto ids = tokenizer.encode(p.text);
  if (!ids.ok()) return ApiError::invalid("input", ids.status().message());
  p.tokens = std::move(*ids);
  return p;
}

void record_continuation(const Tokenizer& tokenizer, const ResponsesPrompt& prompt,
                         const std::vector<TokenId>& generated, StoredResponse& entry) {
  entry.tokens.clear();
  entry.text.clear();
  if (generated.empty()) return;
  auto text = tokenizer.decode(generated, /*skip_special=*/false);
  if (!text.ok()) return;
  entry.tokens = prompt.tokens;
  entry.tokens.insert(entry.tokens.end(), generated.begin(), generated.end());
  entry.text = prompt.text + *text;
}

}  // namespace fs::server
