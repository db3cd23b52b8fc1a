#include "server/responses_format.h"

#include <algorithm>
#include <ctime>
#include <utility>

namespace fs::server {
namespace {

using ojson = nlohmann::ordered_json;

ojson null_or(const std::optional<std::string>& s) {
  return s ? ojson(*s) : ojson(nullptr);
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// Splits the trailing whitespace off `s` (returned; `s` keeps the rest).
std::string take_trailing_space(std::string& s) {
  std::size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  std::string tail = s.substr(n);
  s.resize(n);
  return tail;
}

ojson text_part(const std::string& text) {
  return {{"type", "output_text"},
          {"annotations", ojson::array()},
          {"logprobs", ojson::array()},
          {"text", text}};
}

ojson reasoning_part(const std::string& text) {
  return {{"type", "reasoning_text"}, {"text", text}};
}

}  // namespace

ResponseBuilder::ResponseBuilder(ResponseMetaInfo meta, const ResponsesRequest& request,
                                 bool streaming)
    : meta_(std::move(meta)),
      streaming_(streaming),
      single_call_(!request.parallel_tool_calls),
      function_names_(request.function_names),
      function_namespaces_(request.function_namespaces) {
  response_ = {
      {"id", meta_.id},
      {"object", "response"},
      {"created_at", meta_.created_at},
      {"status", "in_progress"},
      {"background", false},
      {"error", nullptr},
      {"incomplete_details", nullptr},
      {"instructions", null_or(request.instructions)},
      {"max_output_tokens",
       meta_.max_output_tokens ? ojson(*meta_.max_output_tokens) : ojson(nullptr)},
      {"max_tool_calls", nullptr},
      {"model", meta_.model},
      {"output", ojson::array()},
      {"parallel_tool_calls", request.parallel_tool_calls},
      {"previous_response_id",
       meta_.previous_response_id.empty() ? ojson(nullptr) : ojson(meta_.previous_response_id)},
      {"prompt_cache_key", null_or(request.prompt_cache_key)},
      {"reasoning",
       {{"effort", null_or(request.reasoning_effort)},
        {"summary", null_or(request.reasoning_summary)}}},
      {"safety_identifier", null_or(request.safety_identifier)},
      {"service_tier", request.service_tier},
      {"store", request.store},
      {"temperature", request.sampler.temperature},
      {"text", request.echo_text},
      {"tool_choice", request.echo_tool_choice},
      {"tools", request.echo_tools},
      {"top_logprobs", request.top_logprobs},
      {"top_p", request.sampler.top_p},
      {"truncation", request.truncation},
      {"usage", nullptr},
      {"user", null_or(request.user)},
      {"metadata", request.echo_metadata},
  };
}

std::string ResponseBuilder::item_id(const char* prefix) const {
  // Unique within the response, and the response id is unique: no randomness needed.
  return std::string(prefix) + meta_.id.substr(meta_.id.find('_') + 1) + "_" +
         std::to_string(output_.size());
}

void ResponseBuilder::emit(const char* type, ojson payload) {
  if (!streaming_) return;
  ojson event = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [k, v] : payload.items()) event[k] = std::move(v);
  out_ += "event: ";
  out_ += type;
  out_ += "\ndata: ";
  out_ += event.dump(-1, ' ', false, ojson::error_handler_t::replace);
  out_ += "\n\n";
}

ojson ResponseBuilder::snapshot() const {
  ojson r = response_;
  r["output"] = output_;
  return r;
}

std::string ResponseBuilder::start() {
  emit("response.created", {{"response", snapshot()}});
  emit("response.in_progress", {{"response", snapshot()}});
  return std::exchange(out_, {});
}

std::string ResponseBuilder::add(const std::vector<OutputEvent>& events) {
  for (const OutputEvent& e : events) {
    switch (e.kind) {
      case OutputEventKind::kText:
        on_text(e.text);
        break;
      case OutputEventKind::kReasoning:
        on_reasoning(e.text);
        break;
      case OutputEventKind::kToolCallBegin:
        on_call_begin(e);
        break;
      case OutputEventKind::kToolCallArguments:
        on_call_arguments(e.text);
        break;
      case OutputEventKind::kToolCallEnd:
        on_call_end(e.complete);
        break;
    }
  }
  return std::exchange(out_, {});
}

void ResponseBuilder::open_item(Open kind, const char* id_prefix, ojson item) {
  close("completed");
  open_ = kind;
  item["id"] = item_id(id_prefix);  // after close(): the index is this item's
  item_ = std::move(item);
  text_.clear();
  pending_space_.clear();
  const auto index = static_cast<std::int64_t>(output_.size());
  emit("response.output_item.added", {{"output_index", index}, {"item", item_}});
  if (kind == Open::kMessage || kind == Open::kReasoning)
    emit("response.content_part.added",
         {{"item_id", item_["id"]},
          {"output_index", index},
          {"content_index", 0},
          {"part", kind == Open::kMessage ? text_part("") : reasoning_part("")}});
}

void ResponseBuilder::on_text(const std::string& piece) {
  std::string text = piece;
  if (open_ != Open::kMessage) {
    // A message opens at its first visible character: whitespace alone, before a call or at the
    // end, is no message. Once it opens, its text is the model's as written (a follow-up
    // re-renders it, and the warm continuation needs it unchanged).
    if (std::all_of(text.begin(), text.end(), is_space)) {
      lead_space_ += text;
      return;
    }
    text = std::exchange(lead_space_, {}) + text;
    open_item(Open::kMessage, "msg_",
              {{"id", nullptr},
               {"type", "message"},
               {"status", "in_progress"},
               {"content", ojson::array()},
               {"role", "assistant"}});
  }
  text = std::exchange(pending_space_, {}) + text;
  pending_space_ = take_trailing_space(text);
  if (text.empty()) return;
  text_ += text;
  emit("response.output_text.delta", {{"item_id", item_["id"]},
                                      {"output_index", static_cast<std::int64_t>(output_.size())},
                                      {"content_index", 0},
                                      {"delta", text},
                                      {"logprobs", ojson::array()}});
}

void ResponseBuilder::on_reasoning(const std::string& piece) {
  std::string text = piece;
  if (open_ != Open::kReasoning) {
    std::size_t start = 0;
    while (start < text.size() && is_space(text[start])) ++start;
    if (start == text.size()) return;
    text.erase(0, start);
    open_item(Open::kReasoning, "rs_",
              {{"id", nullptr},
               {"type", "reasoning"},
               {"summary", ojson::array()},
               {"content", ojson::array()},
               {"status", "in_progress"}});
  }
  text = std::exchange(pending_space_, {}) + text;
  pending_space_ = take_trailing_space(text);
  if (text.empty()) return;
  text_ += text;
  emit("response.reasoning_text.delta",
       {{"item_id", item_["id"]},
        {"output_index", static_cast<std::int64_t>(output_.size())},
        {"content_index", 0},
        {"delta", text}});
}

void ResponseBuilder::on_call_begin(const OutputEvent& e) {
  close("completed");
  ++calls_;
  // parallel_tool_calls false: the first call is the answer; later ones are not reported.
  skip_call_ = single_call_ && calls_ > 1;
  if (skip_call_) return;
  ojson item = {{"id", nullptr},   {"type", "function_call"}, {"status", "in_progress"},
                {"arguments", ""}, {"call_id", e.id},         {"name", e.name}};
  for (std::size_t i = 0; i < function_names_.size(); ++i)
    if (function_names_[i] == e.name && !function_namespaces_[i].empty())
      item["namespace"] = function_namespaces_[i];
  open_item(Open::kCall, "fc_", std::move(item));
}

void ResponseBuilder::on_call_arguments(const std::string& text) {
  if (open_ != Open::kCall || skip_call_ || text.empty()) return;
  text_ += text;
  emit("response.function_call_arguments.delta",
       {{"item_id", item_["id"]},
        {"output_index", static_cast<std::int64_t>(output_.size())},
        {"delta", text}});
}

void ResponseBuilder::on_call_end(bool complete) {
  // A call cut off or broken after it began: its arguments are what was streamed.
  if (open_ == Open::kCall) close(complete ? "completed" : "incomplete");
  skip_call_ = false;
}

void ResponseBuilder::close(const char* status) {
  lead_space_.clear();
  if (open_ == Open::kNone) return;
  // A message's trailing whitespace was held back in case the item ended there; it is text.
  if (open_ == Open::kMessage && !pending_space_.empty()) {
    text_ += pending_space_;
    emit("response.output_text.delta", {{"item_id", item_["id"]},
                                        {"output_index", static_cast<std::int64_t>(output_.size())},
                                        {"content_index", 0},
                                        {"delta", std::exchange(pending_space_, {})},
                                        {"logprobs", ojson::array()}});
  }
  const auto index = static_cast<std::int64_t>(output_.size());
  const ojson id = item_["id"];
  ResponseItem item;
  item.id = id.get<std::string>();
  switch (open_) {
    case Open::kMessage:
      emit("response.output_text.done", {{"item_id", id},
                                         {"output_index", index},
                                         {"content_index", 0},
                                         {"text", text_},
                                         {"logprobs", ojson::array()}});
      emit("response.content_part.done", {{"item_id", id},
                                          {"output_index", index},
                                          {"content_index", 0},
                                          {"part", text_part(text_)}});
      item_["content"] = ojson::array({text_part(text_)});
      item.kind = ItemKind::kMessage;
      item.role = "assistant";
      item.text = text_;
      break;
    case Open::kReasoning:
      emit("response.reasoning_text.done",
           {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
      emit("response.content_part.done", {{"item_id", id},
                                          {"output_index", index},
                                          {"content_index", 0},
                                          {"part", reasoning_part(text_)}});
      item_["content"] = ojson::array({reasoning_part(text_)});
      item.kind = ItemKind::kReasoning;
      item.text = text_;
      break;
    case Open::kCall:
      if (text_.empty()) text_ = "{}";
      emit("response.function_call_arguments.done", {{"item_id", id},
                                                     {"output_index", index},
                                                     {"name", item_["name"]},
                                                     {"arguments", text_}});
      item_["arguments"] = text_;
      item.kind = ItemKind::kFunctionCall;
      item.call_id = item_["call_id"].get<std::string>();
      item.name = item_["name"].get<std::string>();
      item.arguments = text_;
      break;
    case Open::kNone:
      break;
  }
  item_["status"] = status;
  emit("response.output_item.done", {{"output_index", index}, {"item", item_}});
  output_.push_back(std::move(item_));
  items_.push_back(std::move(item));
  open_ = Open::kNone;
  item_ = nullptr;
  text_.clear();
  pending_space_.clear();
}

std::string ResponseBuilder::finish(const JobSummary& s, std::int64_t reasoning_tokens) {
  const bool incomplete = s.finish_reason == "length";
  close(incomplete ? "incomplete" : "completed");
  response_["output"] = output_;
  response_["status"] = incomplete ? "incomplete" : "completed";
  if (incomplete) {
    response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  } else {
    response_["completed_at"] = static_cast<std::int64_t>(std::time(nullptr));
  }
  response_["usage"] = {
      {"input_tokens", s.prompt_tokens},
      {"input_tokens_details", {{"cached_tokens", static_cast<std::int64_t>(s.reused_tokens)}}},
      {"output_tokens", s.completion_tokens},
      {"output_tokens_details",
       {{"reasoning_tokens", std::min(reasoning_tokens, s.completion_tokens)}}},
      {"total_tokens", s.prompt_tokens + s.completion_tokens}};
  emit(incomplete ? "response.incomplete" : "response.completed", {{"response", response_}});
  return std::exchange(out_, {});
}

std::string ResponseBuilder::fail(const std::string& message) {
  close("incomplete");
  response_["output"] = output_;
  response_["status"] = "failed";
  response_["error"] = {{"code", "server_error"}, {"message", message}};
  emit("response.failed", {{"response", response_}});
  return std::exchange(out_, {});
}

std::string ResponseBuilder::reasoning_text() const {
  std::string out;
  for (const auto& item : items_)
    if (item.kind == ItemKind::kReasoning) out += item.text;
  if (open_ == Open::kReasoning) out += text_;
  return out;
}

ojson item_object(const ResponseItem& item, const std::string& id) {
  const std::string& item_id = item.id.empty() ? id : item.id;
  switch (item.kind) {
    case ItemKind::kMessage: {
      const bool assistant = item.role == "assistant";
      ojson part =
          assistant ? text_part(item.text) : ojson{{"type", "input_text"}, {"text", item.text}};
      return {{"id", item_id},
              {"type", "message"},
              {"status", "completed"},
              {"role", item.role},
              {"content", ojson::array({std::move(part)})}};
    }
    case ItemKind::kFunctionCall:
      return {{"id", item_id},           {"type", "function_call"}, {"status", "completed"},
              {"call_id", item.call_id}, {"name", item.name},       {"arguments", item.arguments}};
    case ItemKind::kFunctionCallOutput:
      return {{"id", item_id},
              {"type", "function_call_output"},
              {"status", "completed"},
              {"call_id", item.call_id},
              {"output", item.text}};
    case ItemKind::kReasoning:
      return {{"id", item_id},
              {"type", "reasoning"},
              {"summary", ojson::array()},
              {"content", ojson::array({reasoning_part(item.text)})}};
  }
  return ojson::object();
}

ojson response_deleted(const std::string& id) {
  return {{"id", id}, {"object", "response"}, {"deleted", true}};
}

}  // namespace fs::server
