#include "server/request.h"

#include <cmath>

#include "format/json_parse.h"

namespace fs::server {
namespace {

using json = nlohmann::ordered_json;

// Parses the body within the limits (depth, values; linear time); a JSON value that is not an
// object is refused here so that every later lookup can assume an object.
std::variant<json, ApiError> parse_body(std::string_view body, const RequestLimits& limits) {
  JsonLimits l;
  l.max_depth = limits.max_json_depth;
  l.max_values = limits.max_json_values;
  auto j = parse_ordered_json_bounded(body, l);
  if (!j.ok())
    return ApiError::invalid("", "the request body is refused: " + j.status().message(),
                             "invalid_json");
  if (!j->is_object()) return ApiError::invalid("", "the request body must be a JSON object");
  return std::move(*j);
}

// Reads optional typed fields of the request object; the first failure is kept and later reads
// become no-ops, so a parser reads every field and checks once at the end.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  const json* get(const char* name) const {
    const auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  void number(const char* name, double& out, double lo, double hi) {
    const json* v = get(name);
    if (!v || error_) return;
    if (!v->is_number()) return fail(name, std::string("'") + name + "' must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
      return fail(name, std::string("'") + name + "' must be between " + fmt(lo) + " and " +
                            fmt(hi) + ", got " + fmt(x));
    out = x;
  }

  void integer(const char* name, std::optional<std::int64_t>& out) {
    const json* v = get(name);
    if (!v || error_) return;
    if (v->is_number_integer()) {
      out = v->get<std::int64_t>();
      return;
    }
    // 5.0 is accepted as 5; 5.5 is not.
    if (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>() &&
        std::fabs(v->get<double>()) < 9e15) {
      out = static_cast<std::int64_t>(v->get<double>());
      return;
    }
    fail(name, std::string("'") + name + "' must be an integer");
  }

  void boolean(const char* name, bool& out) {
    const json* v = get(name);
    if (!v || error_) return;
    if (!v->is_boolean()) return fail(name, std::string("'") + name + "' must be a boolean");
    out = v->get<bool>();
  }

  void string(const char* name, std::string& out) {
    const json* v = get(name);
    if (!v || error_) return;
    if (!v->is_string()) return fail(name, std::string("'") + name + "' must be a string");
    out = v->get<std::string>();
  }

  // A string or a list of strings (OpenAI `stop`), or a list only (Anthropic).
  void stop_list(const char* name, std::vector<std::string>& out, bool allow_string,
                 const RequestLimits& limits) {
    const json* v = get(name);
    if (!v || error_) return;
    if (v->is_string() && allow_string) {
      out.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const auto& s : *v) {
        if (!s.is_string()) return fail(name, std::string("'") + name + "' must hold only strings");
        out.push_back(s.get<std::string>());
      }
    } else {
      return fail(name, std::string("'") + name + "' must be " +
                            (allow_string ? "a string or a list of strings" : "a list of strings"));
    }
    if (out.size() > limits.max_stop_sequences)
      return fail(name, std::string("'") + name + "' holds more than " +
                            std::to_string(limits.max_stop_sequences) + " sequences");
    for (const auto& s : out) {
      if (s.empty()) return fail(name, std::string("'") + name + "' holds an empty sequence");
      if (s.size() > limits.max_stop_bytes)
        return fail(name, std::string("'") + name + "' holds a sequence longer than " +
                              std::to_string(limits.max_stop_bytes) + " bytes");
    }
  }

  void fail(std::string param, std::string message) {
    if (!error_) error_ = ApiError::invalid(std::move(param), std::move(message));
  }
  const std::optional<ApiError>& error() const { return error_; }

 private:
  static std::string fmt(double x) {
    std::string s = std::to_string(x);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  const json& j_;
  std::optional<ApiError> error_;
};

// The sampling fields OpenAI and Anthropic share, with OpenAI's ranges (Anthropic's
// temperature range is narrower and checked by its parser).
void read_sampling(Fields& f, GenerationRequest& r, double max_temperature) {
  f.number("temperature", r.sampler.temperature, 0.0, max_temperature);
  f.number("top_p", r.sampler.top_p, 0.0, 1.0);
  if (!f.error() && r.sampler.top_p <= 0.0)
    f.fail("top_p", "'top_p' must be greater than 0 and at most 1");
  std::optional<std::int64_t> top_k;
  f.integer("top_k", top_k);
  if (top_k) {
    // -1 means off in vLLM and llama.cpp; accept it as 0.
    if (*top_k < -1 || *top_k > 1 << 20)
      f.fail("top_k", "'top_k' must be -1, 0 (off) or a positive count");
    else
      r.sampler.top_k = static_cast<std::int32_t>(std::max<std::int64_t>(*top_k, 0));
  }
  f.number("min_p", r.sampler.min_p, 0.0, 1.0);
}

void read_max_tokens(Fields& f, GenerationRequest& r, const char* name,
                     const RequestLimits& limits) {
  std::optional<std::int64_t> v;
  f.integer(name, v);
  if (!v) return;
  if (*v <= 0)
    f.fail(name, std::string("'") + name + "' must be at least 1, got " + std::to_string(*v));
  else if (*v > limits.max_tokens)
    f.fail(name, std::string("'") + name + "' must be at most " +
                     std::to_string(limits.max_tokens) + ", got " + std::to_string(*v));
  else
    r.max_tokens = *v;
}

// Fields shared by /v1/chat/completions and /v1/completions.
void read_openai_common(Fields& f, GenerationRequest& r, const RequestLimits& limits) {
  f.string("model", r.model);
  r.max_tokens = limits.default_max_tokens;
  read_max_tokens(f, r, "max_tokens", limits);
  read_max_tokens(f, r, "max_completion_tokens", limits);
  read_sampling(f, r, 2.0);
  f.number("presence_penalty", r.sampler.presence_penalty, -2.0, 2.0);
  f.number("frequency_penalty", r.sampler.frequency_penalty, -2.0, 2.0);
  std::optional<std::int64_t> seed;
  f.integer("seed", seed);
  if (seed) r.seed = static_cast<std::uint64_t>(*seed);
  f.stop_list("stop", r.stop, true, limits);
  f.boolean("stream", r.stream);
  std::optional<std::int64_t> n;
  f.integer("n", n);
  if (n && *n != 1) f.fail("n", "'n' must be 1: one choice per request is supported");
  bool logprobs = false;
  f.boolean("logprobs", logprobs);
  if (logprobs) f.fail("logprobs", "'logprobs' is not supported");
  if (const json* so = f.get("stream_options"); so && !f.error()) {
    if (!so->is_object()) {
      f.fail("stream_options", "'stream_options' must be an object");
    } else if (const auto it = so->find("include_usage"); it != so->end() && !it->is_null()) {
      if (!it->is_boolean())
        f.fail("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
      else
        r.include_usage = it->get<bool>();
    }
  }
}

ParsedRequest finish(Fields& f, GenerationRequest r) {
  if (f.error()) return *f.error();
  if (auto s = r.sampler.validate(); !s.ok()) return ApiError::invalid("", s.message());
  return r;
}

// Anthropic content: a string, or a list of blocks of which only text is supported.
std::variant<std::string, ApiError> anthropic_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return ApiError::invalid(where, "'" + where + "' must be a string or a list of content blocks");
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const json& b = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return ApiError::invalid(at, "'" + at + "' must be an object with a string 'type'");
    if (b["type"] != "text")
      return ApiError::invalid(at + ".type", "content blocks of type '" +
                                                 b["type"].get<std::string>() +
                                                 "' are not supported; only 'text'");
    if (!b.contains("text") || !b["text"].is_string())
      return ApiError::invalid(at + ".text", "'" + at + ".text' must be a string");
    text += b["text"].get<std::string>();
  }
  return text;
}

}  // namespace

ParsedRequest parse_openai_chat(std::string_view body, const RequestLimits& limits) {
  auto parsed = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  json& j = std::get<json>(parsed);
  GenerationRequest r;
  r.kind = ApiKind::kChat;
  Fields f(j);
  read_openai_common(f, r, limits);
  if (f.error()) return *f.error();
  const json* messages = f.get("messages");
  if (!messages) return ApiError::invalid("messages", "'messages' is required");
  if (!messages->is_array()) return ApiError::invalid("messages", "'messages' must be a list");
  json tools;
  if (const json* t = f.get("tools")) {
    if (!t->is_array()) return ApiError::invalid("tools", "'tools' must be a list");
    tools = std::move(j["tools"]);
  }
  // Client JSON is moved, never copied (a copy is a recursive walk of the client's nesting).
  auto c = parse_chat_messages(std::move(j["messages"]), std::move(tools));
  if (!c.ok()) return ApiError::invalid("messages", "'messages': " + c.status().message());
  r.chat = std::move(*c);
  r.chat.add_generation_prompt = true;
  return finish(f, std::move(r));
}

ParsedRequest parse_openai_completion(std::string_view body, const RequestLimits& limits) {
  auto parsed = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  GenerationRequest r;
  r.kind = ApiKind::kCompletion;
  Fields f(j);
  read_openai_common(f, r, limits);
  if (f.error()) return *f.error();
  const json* prompt = f.get("prompt");
  if (!prompt) return ApiError::invalid("prompt", "'prompt' is required");
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    r.prompt = (*prompt)[0].get<std::string>();
  } else if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
  } else {
    return ApiError::invalid("prompt", "'prompt' must be a string (batches are not supported)");
  }
  if (r.prompt.empty()) return ApiError::invalid("prompt", "'prompt' is empty");
  bool echo = false;
  f.boolean("echo", echo);
  if (echo) f.fail("echo", "'echo' is not supported");
  return finish(f, std::move(r));
}

namespace {

ParsedRequest parse_anthropic(std::string_view body, const RequestLimits& limits,
                              bool require_max_tokens) {
  auto parsed = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  GenerationRequest r;
  r.kind = ApiKind::kMessages;
  Fields f(j);
  f.string("model", r.model);
  if (require_max_tokens && !f.get("max_tokens"))
    return ApiError::invalid("max_tokens", "'max_tokens' is required");
  read_max_tokens(f, r, "max_tokens", limits);
  read_sampling(f, r, 1.0);
  f.stop_list("stop_sequences", r.stop, false, limits);
  f.boolean("stream", r.stream);
  if (f.error()) return *f.error();

  json messages = json::array();
  if (const json* system = f.get("system")) {
    auto text = anthropic_text(*system, "system");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    messages.push_back({{"role", "system"}, {"content", std::get<std::string>(text)}});
  }
  const json* list = f.get("messages");
  if (!list) return ApiError::invalid("messages", "'messages' is required");
  if (!list->is_array() || list->empty())
    return ApiError::invalid("messages", "'messages' must be a non-empty list");
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& m = (*list)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return ApiError::invalid(at, "'" + at + "' must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string() || (*role != "user" && *role != "assistant"))
      return ApiError::invalid(at + ".role", "'" + at + ".role' must be 'user' or 'assistant'");
    const auto content = m.find("content");
    if (content == m.end())
      return ApiError::invalid(at + ".content", "'" + at + ".content' is required");
    auto text = anthropic_text(*content, at + ".content");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    messages.push_back({{"role", *role}, {"content", std::get<std::string>(text)}});
  }
  auto c = parse_chat_messages(std::move(messages), nullptr);
  if (!c.ok()) return ApiError::invalid("messages", "'messages': " + c.status().message());
  r.chat = std::move(*c);
  r.chat.add_generation_prompt = true;
  return finish(f, std::move(r));
}

}  // namespace

ParsedRequest parse_anthropic_messages(std::string_view body, const RequestLimits& limits) {
  return parse_anthropic(body, limits, /*require_max_tokens=*/true);
}

ParsedRequest parse_anthropic_count_tokens(std::string_view body, const RequestLimits& limits) {
  return parse_anthropic(body, limits, /*require_max_tokens=*/false);
}

}  // namespace fs::server
