#include "server/format.h"

#include "server/sse.h"

namespace fs::server {
namespace {

using json = nlohmann::json;

json openai_usage(const JobSummary& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.reused_tokens}}}};
}

json anthropic_message(const ResponseMeta& meta) {
  return {{"id", meta.id},           {"type", "message"},        {"role", "assistant"},
          {"model", meta.model},     {"content", json::array()}, {"stop_reason", nullptr},
          {"stop_sequence", nullptr}};
}

class OpenAiStream final : public StreamFormatter {
 public:
  OpenAiStream(bool chat, ResponseMeta meta, bool include_usage)
      : chat_(chat), meta_(std::move(meta)), include_usage_(include_usage) {}

  std::string start() override {
    if (!chat_) return {};
    return sse_data(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  }
  std::string delta(const std::string& text) override {
    return sse_data(chat_ ? chunk({{"content", text}}, nullptr) : chunk(text, nullptr));
  }
  std::string finish(const JobSummary& s) override {
    const std::string reason = openai_finish_reason(s);
    std::string out = sse_data(chat_ ? chunk(json::object(), reason) : chunk("", reason));
    if (include_usage_) {
      json last = base();
      last["choices"] = json::array();
      last["usage"] = openai_usage(s);
      out += sse_data(last);
    }
    return out + sse_done();
  }
  std::string error(const std::string& message) override {
    return sse_data({{"error",
                      {{"message", message},
                       {"type", "server_error"},
                       {"param", nullptr},
                       {"code", nullptr}}}}) +
           sse_done();
  }

 private:
  json base() const {
    json j = {{"id", meta_.id},
              {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
              {"created", meta_.created},
              {"model", meta_.model}};
    // With include_usage every chunk carries usage: null until the last one (OpenAI's shape).
    if (include_usage_) j["usage"] = nullptr;
    return j;
  }
  // Chat: `content` is the delta object; completions: the text.
  json chunk(const json& content, const json& finish_reason) const {
    json choice = {{"index", 0}, {"finish_reason", finish_reason}};
    if (chat_) {
      choice["delta"] = content;
    } else {
      choice["text"] = content;
      choice["logprobs"] = nullptr;
    }
    json j = base();
    j["choices"] = json::array({choice});
    return j;
  }

  bool chat_;
  ResponseMeta meta_;
  bool include_usage_;
};

class AnthropicStream final : public StreamFormatter {
 public:
  explicit AnthropicStream(ResponseMeta meta) : meta_(std::move(meta)) {}

  std::string start() override {
    json message = anthropic_message(meta_);
    message["usage"] = {{"input_tokens", meta_.prompt_tokens}, {"output_tokens", 0}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", message}}) +
           sse_event("content_block_start", {{"type", "content_block_start"},
                                             {"index", 0},
                                             {"content_block", {{"type", "text"}, {"text", ""}}}});
  }
  std::string delta(const std::string& text) override {
    return sse_event("content_block_delta", {{"type", "content_block_delta"},
                                             {"index", 0},
                                             {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  std::string finish(const JobSummary& s) override {
    const json stop_sequence = s.stop_sequence.empty() ? json(nullptr) : json(s.stop_sequence);
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}) +
           sse_event(
               "message_delta",
               {{"type", "message_delta"},
                {"delta",
                 {{"stop_reason", anthropic_stop_reason(s)}, {"stop_sequence", stop_sequence}}},
                {"usage", {{"output_tokens", s.completion_tokens}}}}) +
           sse_event("message_stop", {{"type", "message_stop"}});
  }
  std::string error(const std::string& message) override {
    return sse_event("error",
                     {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}});
  }

 private:
  ResponseMeta meta_;
};

}  // namespace

std::string openai_finish_reason(const JobSummary& s) {
  return s.finish_reason == "length" ? "length" : "stop";
}

std::string anthropic_stop_reason(const JobSummary& s) {
  if (s.finish_reason == "length") return "max_tokens";
  return s.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json complete_response(ApiKind kind, const ResponseMeta& meta, const std::string& text,
                       const JobSummary& s) {
  switch (kind) {
    case ApiKind::kChat:
      return {{"id", meta.id},
              {"object", "chat.completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", json::array({{{"index", 0},
                                        {"message", {{"role", "assistant"}, {"content", text}}},
                                        {"logprobs", nullptr},
                                        {"finish_reason", openai_finish_reason(s)}}})},
              {"usage", openai_usage(s)}};
    case ApiKind::kCompletion:
      return {{"id", meta.id},
              {"object", "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", json::array({{{"index", 0},
                                        {"text", text},
                                        {"logprobs", nullptr},
                                        {"finish_reason", openai_finish_reason(s)}}})},
              {"usage", openai_usage(s)}};
    case ApiKind::kMessages: {
      json m = anthropic_message(meta);
      m["content"] = json::array({{{"type", "text"}, {"text", text}}});
      m["stop_reason"] = anthropic_stop_reason(s);
      m["stop_sequence"] = s.stop_sequence.empty() ? json(nullptr) : json(s.stop_sequence);
      m["usage"] = {{"input_tokens", s.prompt_tokens}, {"output_tokens", s.completion_tokens}};
      return m;
    }
  }
  return json::object();
}

std::unique_ptr<StreamFormatter> make_stream_formatter(ApiKind kind, ResponseMeta meta,
                                                       bool include_usage) {
  if (kind == ApiKind::kMessages) return std::make_unique<AnthropicStream>(std::move(meta));
  return std::make_unique<OpenAiStream>(kind == ApiKind::kChat, std::move(meta), include_usage);
}

json model_object(const std::string& id, std::int64_t created) {
  return {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "flashserve"}};
}

json model_list(const std::string& id, std::int64_t created) {
  return {{"object", "list"}, {"data", json::array({model_object(id, created)})}};
}

}  // namespace fs::server
