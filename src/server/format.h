// Response bodies and stream events of the OpenAI and Anthropic APIs, from a job's text and
// summary. Pure functions of their inputs (the unit tests check the shapes).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/engine.h"
#include "server/request.h"

namespace fs::server {

struct ResponseMeta {
  std::string id;  // chatcmpl-..., cmpl-... or msg_...
  std::int64_t created = 0;
  std::string model;
  std::int64_t prompt_tokens = 0;
};

// "stop"/"length" as OpenAI reports them.
std::string openai_finish_reason(const JobSummary& s);
// "end_turn", "stop_sequence" or "max_tokens".
std::string anthropic_stop_reason(const JobSummary& s);

// The non-streaming body of `kind` for the generated `text`.
nlohmann::json complete_response(ApiKind kind, const ResponseMeta& meta, const std::string& text,
                                 const JobSummary& summary);

// The events of one streamed response, in order: start(), delta() per text piece, finish().
class StreamFormatter {
 public:
  virtual ~StreamFormatter() = default;
  virtual std::string start() = 0;
  virtual std::string delta(const std::string& text) = 0;
  virtual std::string finish(const JobSummary& summary) = 0;
  // An error after the stream began (the status line is already sent).
  virtual std::string error(const std::string& message) = 0;
};

std::unique_ptr<StreamFormatter> make_stream_formatter(ApiKind kind, ResponseMeta meta,
                                                       bool include_usage);

// GET /v1/models and /v1/models/{id}.
nlohmann::json model_object(const std::string& id, std::int64_t created);
nlohmann::json model_list(const std::string& id, std::int64_t created);

}  // namespace fs::server
