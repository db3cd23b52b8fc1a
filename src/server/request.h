// Parsing and validation of generation requests (OpenAI chat/completions, Anthropic messages)
// into one engine-independent shape. Every rejection names the field at fault; nothing here
// knows about HTTP beyond the status an ApiError carries.
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

struct RequestLimits {
  std::int64_t default_max_tokens = 256;  // OpenAI requests that do not say
  std::int64_t max_tokens = 32768;        // above this a request is refused
  std::size_t max_stop_sequences = 16;
  std::size_t max_stop_bytes = 256;
  // Bounds on the body's JSON, checked while it is parsed (see format/json_parse.h).
  std::size_t max_json_depth = 64;
  std::size_t max_json_values = std::size_t{1} << 20;
};

struct GenerationRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;
  ChatRequest chat;    // kChat, kMessages
  std::string prompt;  // kCompletion
  std::int64_t max_tokens = 0;
  SamplerConfig sampler;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;  // stop sequences on the generated text
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
};

using ParsedRequest = std::variant<GenerationRequest, ApiError>;

// Parses the body text: malformed JSON or a body that is not an object is an error too.
ParsedRequest parse_openai_chat(std::string_view body, const RequestLimits& limits);
ParsedRequest parse_openai_completion(std::string_view body, const RequestLimits& limits);
ParsedRequest parse_anthropic_messages(std::string_view body, const RequestLimits& limits);
// /v1/messages/count_tokens: the same body, max_tokens not required.
ParsedRequest parse_anthropic_count_tokens(std::string_view body, const RequestLimits& limits);

}  // namespace fs::server
