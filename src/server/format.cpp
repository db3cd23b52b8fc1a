#include "server/format.h"

#include "format/json_parse.h"
#include "server/sse.h"
#include "util/hash.h"

namespace fs::server {
namespace {

using json = nlohmann::json;

json openai_usage(const JobSummary& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.reused_tokens}}}};
}

// Anthropic counts cached input apart: input_tokens are the tokens computed for this request,
// cache_read_input_tokens those restored from the session bank. Nothing is ever written to a
// cache on request (cache_control is ignored), so cache_creation_input_tokens is 0.
json anthropic_usage(const JobSummary& s, std::int64_t output_tokens) {
  const auto reused = static_cast<std::int64_t>(s.reused_tokens);
  return {{"input_tokens", s.prompt_tokens - reused},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", reused},
          {"output_tokens", output_tokens}};
}

json anthropic_message(const ResponseMeta& meta) {
  return {{"id", meta.id},           {"type", "message"},        {"role", "assistant"},
          {"model", meta.model},     {"content", json::array()}, {"stop_reason", nullptr},
          {"stop_sequence", nullptr}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (const char c : s) b.push_back(static_cast<unsigned char>(c));
  return b;
}

// OpenAI chat's logprobs.content entries.
json chat_logprobs(const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const auto& t : lps) {
    json top = json::array();
    for (const auto& [tok, lp] : t.top)
      top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", bytes_of(tok)}});
    content.push_back({{"token", t.token},
                       {"logprob", t.logprob},
                       {"bytes", bytes_of(t.token)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// The legacy completions shape; text_offset counts from the start of the completion.
json completion_logprobs(const std::vector<TokenLogprob>& lps, std::size_t& offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  for (const auto& t : lps) {
    tokens.push_back(t.token);
    values.push_back(t.logprob);
    json top = json::object();
    for (const auto& [tok, lp] : t.top)
      if (!top.contains(tok)) top[tok] = lp;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", values},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

// A tool call's arguments as an object (Anthropic's input). The parser releases only calls whose
// arguments are a JSON object, so a failure here means nothing was parsed: {}.
json arguments_object(const std::string& arguments) {
  auto parsed = parse_json_bounded(arguments);
  if (parsed.ok() && parsed->is_object()) return std::move(*parsed);
  return json::object();
}

class OpenAiStream final : public StreamFormatter {
 public:
  OpenAiStream(bool chat, ResponseMeta meta, StreamOptions options)
      : chat_(chat), meta_(std::move(meta)), options_(options) {}

  std::string start(const JobSummary&) override {
    if (started_) return {};
    started_ = true;
    if (!chat_) return {};
    return sse_data(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  }
  std::string events(const std::vector<OutputEvent>& output,
                     const std::vector<TokenLogprob>& logprobs) override {
    std::string out = start({});
    pending_.insert(pending_.end(), logprobs.begin(), logprobs.end());
    for (const OutputEvent& e : output) {
      if (!chat_) {
        if (e.kind == OutputEventKind::kText) out += sse_data(chunk(e.text, nullptr));
        continue;
      }
      switch (e.kind) {
        case OutputEventKind::kText:
          out += sse_data(chunk({{"content", e.text}}, nullptr));
          break;
        case OutputEventKind::kReasoning:
          out += sse_data(chunk({{"reasoning_content", e.text}}, nullptr));
          break;
        case OutputEventKind::kToolCallBegin:
          out += sse_data(
              chunk({{"tool_calls",
                      json::array({{{"index", e.index},
                                    {"id", e.id},
                                    {"type", "function"},
                                    {"function", {{"name", e.name}, {"arguments", ""}}}}})}},
                    nullptr));
          break;
        case OutputEventKind::kToolCallArguments:
          out += sse_data(
              chunk({{"tool_calls",
                      json::array({{{"index", e.index}, {"function", {{"arguments", e.text}}}}})}},
                    nullptr));
          break;
        case OutputEventKind::kToolCallEnd:
          break;
      }
    }
    return out;
  }
  std::string finish(const JobSummary& s, const ParsedOutput& message) override {
    std::string out = start(s);
    const std::string reason = openai_finish_reason(s, !message.tool_calls.empty());
    out += sse_data(chat_ ? chunk(json::object(), reason) : chunk("", reason));
    if (options_.include_usage) {
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
    if (options_.include_usage) j["usage"] = nullptr;
    return j;
  }
  // Chat: `content` is the delta object; completions: the text. The logprobs of the tokens
  // generated since the last chunk ride on this one.
  json chunk(const json& content, const json& finish_reason) {
    json choice = {{"index", 0}};
    if (chat_)
      choice["delta"] = content;
    else
      choice["text"] = content;
    choice["logprobs"] = nullptr;
    if (options_.logprobs && !pending_.empty()) {
      choice["logprobs"] = chat_ ? chat_logprobs(pending_) : completion_logprobs(pending_, offset_);
      pending_.clear();
    }
    choice["finish_reason"] = finish_reason;
    json j = base();
    j["choices"] = json::array({choice});
    return j;
  }

  bool chat_;
  ResponseMeta meta_;
  StreamOptions options_;
  bool started_ = false;
  std::vector<TokenLogprob> pending_;
  std::size_t offset_ = 0;
};

// Anthropic's content blocks, opened and closed as the output moves between reasoning, text and
// tool calls; each gets the next index.
class AnthropicStream final : public StreamFormatter {
 public:
  explicit AnthropicStream(ResponseMeta meta) : meta_(std::move(meta)) {}

  std::string start(const JobSummary& s) override {
    if (started_) return {};
    started_ = true;
    json message = anthropic_message(meta_);
    JobSummary at_start = s;
    if (at_start.prompt_tokens == 0) at_start.prompt_tokens = meta_.prompt_tokens;
    message["usage"] = anthropic_usage(at_start, 0);
    return sse_event("message_start", {{"type", "message_start"}, {"message", message}});
  }
  std::string events(const std::vector<OutputEvent>& output,
                     const std::vector<TokenLogprob>&) override {
    std::string out = start({});
    for (const OutputEvent& e : output) {
      switch (e.kind) {
        case OutputEventKind::kText:
          if (e.text.empty()) break;
          out += open(Block::kText, {{"type", "text"}, {"text", ""}});
          out += delta({{"type", "text_delta"}, {"text", e.text}});
          break;
        case OutputEventKind::kReasoning:
          if (e.text.empty()) break;
          out +=
              open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
          thinking_ += e.text;
          out += delta({{"type", "thinking_delta"}, {"thinking", e.text}});
          break;
        case OutputEventKind::kToolCallBegin:
          out += close();
          out += open(Block::kToolUse, {{"type", "tool_use"},
                                        {"id", anthropic_tool_id(e.id)},
                                        {"name", e.name},
                                        {"input", json::object()}});
          break;
        case OutputEventKind::kToolCallArguments:
          if (open_ == Block::kToolUse && !e.text.empty())
            out += delta({{"type", "input_json_delta"}, {"partial_json", e.text}});
          break;
        case OutputEventKind::kToolCallEnd:
          out += close();
          break;
      }
    }
    return out;
  }
  std::string finish(const JobSummary& s, const ParsedOutput& message) override {
    std::string out = start(s);
    // An empty turn still has one (empty) text block, as the non-streaming body does.
    if (next_index_ == 0) out += open(Block::kText, {{"type", "text"}, {"text", ""}});
    out += close();
    const json stop_sequence = s.stop_sequence.empty() ? json(nullptr) : json(s.stop_sequence);
    return out +
           sse_event("message_delta",
                     {{"type", "message_delta"},
                      {"delta",
                       {{"stop_reason", anthropic_stop_reason(s, !message.tool_calls.empty())},
                        {"stop_sequence", stop_sequence}}},
                      {"usage", anthropic_usage(s, s.completion_tokens)}}) +
           sse_event("message_stop", {{"type", "message_stop"}});
  }
  std::string error(const std::string& message) override {
    return sse_event("error",
                     {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}});
  }

 private:
  enum class Block { kNone, kText, kThinking, kToolUse };

  // Opens a block of `kind` unless one is open already.
  std::string open(Block kind, const json& block) {
    if (open_ == kind) return {};
    std::string out = close();
    open_ = kind;
    index_ = next_index_++;
    return out + sse_event("content_block_start", {{"type", "content_block_start"},
                                                   {"index", index_},
                                                   {"content_block", block}});
  }
  std::string delta(const json& d) {
    return sse_event("content_block_delta",
                     {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  }
  std::string close() {
    if (open_ == Block::kNone) return {};
    std::string out;
    if (open_ == Block::kThinking) {
      out += delta({{"type", "signature_delta"}, {"signature", thinking_signature(thinking_)}});
      thinking_.clear();
    }
    open_ = Block::kNone;
    return out +
           sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  }

  ResponseMeta meta_;
  bool started_ = false;
  Block open_ = Block::kNone;
  int index_ = -1, next_index_ = 0;
  std::string thinking_;  // the open thinking block's text, for its signature
};

}  // namespace

std::string openai_finish_reason(const JobSummary& s, bool tool_calls) {
  if (s.finish_reason == "length") return "length";
  if (tool_calls && s.stop_sequence.empty()) return "tool_calls";
  return "stop";
}

std::string anthropic_stop_reason(const JobSummary& s, bool tool_calls) {
  if (s.finish_reason == "length") return "max_tokens";
  if (!s.stop_sequence.empty()) return "stop_sequence";
  return tool_calls ? "tool_use" : "end_turn";
}

std::string anthropic_tool_id(const std::string& id) {
  if (id.rfind("call_", 0) == 0) return "toolu_" + id.substr(5);
  return id;
}

std::string thinking_signature(const std::string& thinking) {
  return "fs1-" + hex64(xxh3_64(thinking));
}

json complete_response(ApiKind kind, const ResponseMeta& meta, const ParsedOutput& message,
                       const JobSummary& s, const std::vector<TokenLogprob>* logprobs) {
  const bool calls = !message.tool_calls.empty();
  switch (kind) {
    case ApiKind::kChat: {
      json m = {{"role", "assistant"}};
      m["content"] = message.content.empty() && calls ? json(nullptr) : json(message.content);
      if (!message.reasoning.empty()) m["reasoning_content"] = message.reasoning;
      if (calls) {
        json list = json::array();
        for (const auto& c : message.tool_calls)
          list.push_back({{"id", c.id},
                          {"type", "function"},
                          {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        m["tool_calls"] = list;
      }
      return {{"id", meta.id},
              {"object", "chat.completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", json::array({{{"index", 0},
                                        {"message", m},
                                        {"logprobs", logprobs ? chat_logprobs(*logprobs) : json()},
                                        {"finish_reason", openai_finish_reason(s, calls)}}})},
              {"usage", openai_usage(s)}};
    }
    case ApiKind::kCompletion: {
      std::size_t offset = 0;
      return {
          {"id", meta.id},
          {"object", "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices",
           json::array({{{"index", 0},
                         {"text", message.content},
                         {"logprobs", logprobs ? completion_logprobs(*logprobs, offset) : json()},
                         {"finish_reason", openai_finish_reason(s)}}})},
          {"usage", openai_usage(s)}};
    }
    case ApiKind::kMessages: {
      json m = anthropic_message(meta);
      json content = json::array();
      if (!message.reasoning.empty())
        content.push_back({{"type", "thinking"},
                           {"thinking", message.reasoning},
                           {"signature", thinking_signature(message.reasoning)}});
      // An empty text block only for a turn with no other block, as the stream sends it.
      if (!message.content.empty() || (!calls && message.reasoning.empty()))
        content.push_back({{"type", "text"}, {"text", message.content}});
      for (const auto& c : message.tool_calls)
        content.push_back({{"type", "tool_use"},
                           {"id", anthropic_tool_id(c.id)},
                           {"name", c.name},
                           {"input", arguments_object(c.arguments)}});
      m["content"] = content;
      m["stop_reason"] = anthropic_stop_reason(s, calls);
      m["stop_sequence"] = s.stop_sequence.empty() ? json(nullptr) : json(s.stop_sequence);
      m["usage"] = anthropic_usage(s, s.completion_tokens);
      return m;
    }
  }
  return json::object();
}

std::unique_ptr<StreamFormatter> make_stream_formatter(ApiKind kind, ResponseMeta meta,
                                                       StreamOptions options) {
  if (kind == ApiKind::kMessages) return std::make_unique<AnthropicStream>(std::move(meta));
  return std::make_unique<OpenAiStream>(kind == ApiKind::kChat, std::move(meta), options);
}

json model_object(const std::string& id, std::int64_t created) {
  return {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "flashserve"}};
}

json model_list(const std::string& id, std::int64_t created) {
  return {{"object", "list"}, {"data", json::array({model_object(id, created)})}};
}

}  // namespace fs::server
