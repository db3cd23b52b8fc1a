// The Responses API's response object and stream events, built from the parser's view of the
// model output (reasoning, text, tool calls; tokenizer/chat/output_parser.h). One builder
// serves both modes, so a streamed response and a plain one hold the same output items.
//
// Stream order (sequence_number counts from 0): response.created, response.in_progress; per
// output item: response.output_item.added, then for a message response.content_part.added,
// response.output_text.delta..., response.output_text.done, response.content_part.done; for
// reasoning the same with a reasoning_text part and response.reasoning_text.delta/.done; for a
// function call response.function_call_arguments.delta..., .done; then
// response.output_item.done. Last: response.completed, or response.incomplete (max output
// tokens reached), or response.failed (an error after the stream began).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/responses_request.h"
#include "tokenizer/chat/output_parser.h"

namespace fs::server {

// What the response object says besides its output.
struct ResponseMetaInfo {
  std::string id;  // resp_...
  std::int64_t created_at = 0;
  std::string model;
  std::optional<std::int64_t> max_output_tokens;  // as requested (null when not)
  std::string previous_response_id;
};

class ResponseBuilder {
 public:
  // `streaming`: produce the event text (a plain response only collects the output).
  ResponseBuilder(ResponseMetaInfo meta, const ResponsesRequest& request, bool streaming);

  // response.created and response.in_progress.
  std::string start();
  // The events of the parser's output events.
  std::string add(const std::vector<OutputEvent>& events);
  // Closes the open item and ends the response: completed, or incomplete when the generation
  // stopped at its token limit. `reasoning_tokens` is the part of the output that was reasoning.
  std::string finish(const JobSummary& summary, std::int64_t reasoning_tokens);
  // The response failed after it started (the stream's last event).
  std::string fail(const std::string& message);

  // The response object (in_progress until finish or fail).
  const nlohmann::ordered_json& response() const { return response_; }
  // The output as conversation items (what a follow-up continues).
  const std::vector<ResponseItem>& output_items() const { return items_; }
  // The reasoning text so far (all reasoning items).
  std::string reasoning_text() const;

 private:
  enum class Open { kNone, kReasoning, kMessage, kCall };
  void on_reasoning(const std::string& text);
  void on_text(const std::string& text);
  void on_call_begin(const OutputEvent& e);
  void on_call_arguments(const std::string& text);
  void on_call_end(bool complete);
  void close(const char* status);
  void open_item(Open kind, const char* id_prefix, nlohmann::ordered_json item);
  std::string item_id(const char* prefix) const;
  void emit(const char* type, nlohmann::ordered_json payload);
  nlohmann::ordered_json snapshot() const;

  ResponseMetaInfo meta_;
  bool streaming_;
  bool single_call_;  // parallel_tool_calls: false
  std::vector<std::string> function_names_, function_namespaces_;
  nlohmann::ordered_json response_;
  std::string out_;  // events not yet returned
  std::int64_t sequence_ = 0;

  Open open_ = Open::kNone;
  nlohmann::ordered_json item_;  // the open item as output_item.done will show it
  std::string text_;             // its text or arguments so far
  std::string pending_space_;    // the open item's trailing whitespace, held back
  std::string lead_space_;       // whitespace before any message opened
  bool skip_call_ = false;       // a call beyond the first with parallel_tool_calls false
  int calls_ = 0;
  std::vector<ResponseItem> items_;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
};

// {"error": {...}} bodies share the OpenAI shape (api_error.h); a stored response's deletion:
nlohmann::ordered_json response_deleted(const std::string& id);

// A conversation item as the API shows it (GET /v1/responses/{id}/input_items); `id` stands in
// when the item came without one.
nlohmann::ordered_json item_object(const ResponseItem& item, const std::string& id);

}  // namespace fs::server
