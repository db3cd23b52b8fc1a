// Response bodies and stream events of the OpenAI and Anthropic APIs, from a job's output events,
// its whole message and its summary. Pure functions of their inputs (the unit tests check the
// shapes).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/request.h"

namespace fs::server {

struct ResponseMeta {
  std::string id;  // chatcmpl-..., cmpl-... or msg_...
  std::int64_t created = 0;
  std::string model;
  std::int64_t prompt_tokens = 0;
};

// "stop", "length" or "tool_calls" as OpenAI reports them (a turn cut by max_tokens is "length"
// even when it holds a complete call).
std::string openai_finish_reason(const JobSummary& s, bool tool_calls = false);
// "end_turn", "stop_sequence", "max_tokens" or "tool_use".
std::string anthropic_stop_reason(const JobSummary& s, bool tool_calls = false);

// Anthropic's id of a tool call ("toolu_..." for the parser's "call_...").
std::string anthropic_tool_id(const std::string& id);
// The signature of a thinking block: a digest of its text made by this server ("fs1-" and 16 hex
// digits), so that clients which keep signed thinking keep it; never checked on input.
std::string thinking_signature(const std::string& thinking);

// The non-streaming body of `kind`. `logprobs`: the tokens' log-probabilities when the request
// asked for them (null: it did not).
nlohmann::json complete_response(ApiKind kind, const ResponseMeta& meta,
                                 const ParsedOutput& message, const JobSummary& summary,
                                 const std::vector<TokenLogprob>* logprobs = nullptr);

struct StreamOptions {
  bool include_usage = false;  // OpenAI stream_options.include_usage
  bool logprobs = false;
};

// The events of one streamed response, in order: start() once the prompt is prefilled, events()
// per batch of output events, finish() (or error()). start() is implied by the others when it was
// not called.
class StreamFormatter {
 public:
  virtual ~StreamFormatter() = default;
  virtual std::string start(const JobSummary& started) = 0;
  virtual std::string events(const std::vector<OutputEvent>& output,
                             const std::vector<TokenLogprob>& logprobs) = 0;
  virtual std::string finish(const JobSummary& summary, const ParsedOutput& message) = 0;
  // An error after the stream began (the status line is already sent).
  virtual std::string error(const std::string& message) = 0;
};

std::unique_ptr<StreamFormatter> make_stream_formatter(ApiKind kind, ResponseMeta meta,
                                                       StreamOptions options);

// GET /v1/models and /v1/models/{id}.
nlohmann::json model_object(const std::string& id, std::int64_t created);
nlohmann::json model_list(const std::string& id, std::int64_t created);

}  // namespace fs::server
