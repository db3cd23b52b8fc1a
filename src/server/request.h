// Parsing and validation of generation requests (OpenAI chat/completions, Anthropic messages)
// into one engine-independent shape. Every rejection names the field at fault; nothing here
// knows about HTTP beyond the status an ApiError carries. Fields the server does not use are
// accepted and ignored; the fields it reads are type-checked.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "decode/sampler.h"
#include "server/api_error.h"
#include "tokenizer/chat/chat.h"

namespace fs::server {

enum class ApiKind { kChat, kCompletion, kMessages };

// The label of an API in /metrics ("chat", "completions", "messages").
std::string api_label(ApiKind kind);

struct RequestLimits {
  std::int64_t default_max_tokens = 256;  // OpenAI requests that do not say
  // The sampling of a request that does not set a field: the model's generation_config.json
  // (decode/sampling_defaults.h) over greedy decoding.
  SamplerConfig sampling_defaults;
  std::int64_t max_tokens = 32768;  // larger requests are clamped to it
  std::size_t max_stop_sequences = 16;
  std::size_t max_stop_bytes = 256;
  std::int32_t max_top_logprobs = 20;
  // Bounds on the body's JSON, checked while it is parsed (see format/json_parse.h).
  std::size_t max_json_depth = 64;
  std::size_t max_json_values = std::size_t{1} << 20;
};

// Which tool calls the model may or must make: OpenAI's none/auto/required/{function}, Anthropic's
// none/auto/any/tool.
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string name;  // kFunction: the tool that must be called
  bool parallel =
      true;  // parallel_tool_calls / !disable_parallel_tool_use (accepted, not enforced)
};

struct GenerationRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;
  // kChat, kMessages: the messages and the tools in OpenAI's shape (Anthropic's are converted);
  // enable_thinking from Anthropic's `thinking` or OpenAI's reasoning_effort "none".
  ChatRequest chat;
  std::string prompt;  // kCompletion
  std::int64_t max_tokens = 0;
  SamplerConfig sampler;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;  // stop sequences on the generated (visible) text
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
  ToolChoice tool_choice;      // kNone: chat.tools was emptied (no tools in the prompt)
  // Anthropic thinking.budget_tokens: the reasoning tokens before the think block is closed.
  std::optional<std::int64_t> thinking_budget;
  bool logprobs = false;          // chat: logprobs; completions: logprobs given
  std::int32_t top_logprobs = 0;  // alternatives per token, 0-20 (completions: 0-5)
};

using ParsedRequest = std::variant<GenerationRequest, ApiError>;

// Parses the body text: malformed JSON or a body that is not an object is an error too.
ParsedRequest parse_openai_chat(std::string_view body, const RequestLimits& limits);
ParsedRequest parse_openai_completion(std::string_view body, const RequestLimits& limits);
ParsedRequest parse_anthropic_messages(std::string_view body, const RequestLimits& limits);
// /v1/messages/count_tokens: the same body, max_tokens not required.
ParsedRequest parse_anthropic_count_tokens(std::string_view body, const RequestLimits& limits);

}  // namespace fs::server
