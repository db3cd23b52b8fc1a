// The OpenAI Responses API request (POST /v1/responses): parsing and validation into one
// engine-independent shape, and the conversation it continues rendered as a chat request.
// Every refusal is an ApiError naming the field (input[2].content[0].type, tools[1].name, ...).
//
// What is served: `instructions`; `input` as a string or a list of items (messages of any role
// with text parts, function_call, function_call_output, reasoning); function tools with
// tool_choice and parallel_tool_calls (functions grouped in namespace tools too);
// max_output_tokens; temperature/top_p; stream; store; previous_response_id; reasoning.effort
// (none/minimal turn thinking off). Accepted and echoed but not acted on: text (format, verbosity),
// include, metadata, truncation, user, prompt_cache_key, service_tier, safety_identifier,
// top_logprobs, reasoning.summary, tools of other types (hosted tools: they are not shown to the
// model). Refused: items and content parts the server cannot read (images, files, audio,
// hosted-tool calls), `conversation`, `prompt`, `background: true`, and a tool_choice naming a tool
// that is not a function tool given here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "decode/sampler.h"
#include "server/api_error.h"
#include "server/request.h"
#include "tokenizer/chat/chat.h"

namespace fs::server {

// One item of a conversation, normalized: what the store keeps and the renderer reads.
enum class ItemKind { kMessage, kFunctionCall, kFunctionCallOutput, kReasoning };

struct ResponseItem {
  ItemKind kind = ItemKind::kMessage;
  std::string id;         // the item's id when it has one (output items always do)
  std::string role;       // kMessage: user, assistant, system or developer
  std::string text;       // kMessage: the text parts joined; kFunctionCallOutput: the output;
                          // kReasoning: the reasoning text (its content, else its summary)
  std::string call_id;    // kFunctionCall, kFunctionCallOutput
  std::string name;       // kFunctionCall
  std::string arguments;  // kFunctionCall: JSON text as the model wrote it

  // Bytes this item holds (the store's budget counts them).
  std::size_t bytes() const;
};

struct ResponsesRequest {
  std::string model;
  std::optional<std::string> instructions;
  std::vector<ResponseItem> input;
  // Function tools in the chat-template shape {type: function, function: {name, description,
  // parameters}}, after tool_choice's allowed_tools filter; the others are not rendered.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  std::vector<std::string> function_names;  // of `tools`, in order
  // The namespace of each of them ("" for a top-level function): Codex groups tools in
  // {type: namespace, name, tools: [functions]}; they are shown to the model by their own names,
  // and a call of one says its namespace.
  std::vector<std::string> function_namespaces;
  ToolChoice tool_choice;  // request.h's, shared with the chat APIs
  bool parallel_tool_calls = true;
  std::optional<std::int64_t> max_output_tokens;
  SamplerConfig sampler;
  bool stream = false;
  bool store = true;  // OpenAI's default
  std::string previous_response_id;
  std::optional<std::string> reasoning_effort;   // as given
  std::optional<std::string> reasoning_summary;  // as given; no summary is generated
  std::optional<bool> enable_thinking;           // effort none/minimal: false; else the default

  // Echoed in the response object as the client sent them (or OpenAI's defaults).
  nlohmann::ordered_json echo_tools = nlohmann::ordered_json::array();
  nlohmann::ordered_json echo_tool_choice = "auto";
  nlohmann::ordered_json echo_text = {{"format", {{"type", "text"}}}, {"verbosity", "medium"}};
  nlohmann::ordered_json echo_metadata = nlohmann::ordered_json::object();
  std::string truncation = "disabled";
  std::optional<std::string> user, prompt_cache_key, safety_identifier;
  std::string service_tier = "default";
  std::int64_t top_logprobs = 0;
};

using ParsedResponsesRequest = std::variant<ResponsesRequest, ApiError>;

ParsedResponsesRequest parse_responses_request(std::string_view body, const RequestLimits& limits);

// The chat request of a conversation: the instructions as the first system message, then
// `history` (a stored conversation: its input and output items) and `input`, with the assistant
// items of a turn (reasoning, message, function calls) folded into one assistant message, and
// function_call_output items as tool messages. Ends with the generation prompt.
ChatRequest conversation_chat(const std::optional<std::string>& instructions,
                              std::span<const ResponseItem> history,
                              std::span<const ResponseItem> input,
                              const nlohmann::ordered_json& tools,
                              std::optional<bool> enable_thinking);

}  // namespace fs::server
