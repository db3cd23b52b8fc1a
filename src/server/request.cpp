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
  // vLLM's and llama.cpp's extra field (HF's GenerationConfig name).
  f.number("repetition_penalty", r.sampler.repetition_penalty, 0.0, 2.0);
  if (!f.error() && r.sampler.repetition_penalty <= 0.0)
    f.fail("repetition_penalty", "'repetition_penalty' must be greater than 0 and at most 2");
}

void read_max_tokens(Fields& f, GenerationRequest& r, const char* name,
                     const RequestLimits& limits) {
  std::optional<std::int64_t> v;
  f.integer(name, v);
  if (!v) return;
  // A budget above the server's limit is clamped to it, not refused: agents ask for what their
  // largest model allows (Qwen Code retries a turn with 64000) and the context bounds it anyway.
  if (*v <= 0)
    f.fail(name, std::string("'") + name + "' must be at least 1, got " + std::to_string(*v));
  else
    r.max_tokens = std::min(*v, limits.max_tokens);
}

// Fields shared by /v1/chat/completions and /v1/completions.
void read_openai_common(Fields& f, GenerationRequest& r, const RequestLimits& limits) {
  f.string("model", r.model);
  r.max_tokens = limits.default_max_tokens;
  r.sampler = limits.sampling_defaults;
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
  // Read only to refuse a wrong type: the server has one user and no stored completions.
  std::string ignored;
  f.string("user", ignored);
  bool store = false;
  f.boolean("store", store);
  if (const json* m = f.get("metadata"); m && !m->is_object())
    f.fail("metadata", "'metadata' must be an object");
}

ParsedRequest finish(Fields& f, GenerationRequest r) {
  if (f.error()) return *f.error();
  if (auto s = r.sampler.validate(); !s.ok()) return ApiError::invalid("", s.message());
  return r;
}

std::string at_index(const std::string& where, std::size_t i) {
  return where + "[" + std::to_string(i) + "]";
}

// A member of object `o` that must be a string when present (null reads as absent).
std::variant<std::optional<std::string>, ApiError> optional_string(const json& o, const char* key,
                                                                   const std::string& where) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string())
    return ApiError::invalid(where + "." + key, "'" + where + "." + key + "' must be a string");
  return std::optional<std::string>(it->get<std::string>());
}

std::variant<std::string, ApiError> required_string(const json& o, const char* key,
                                                    const std::string& where) {
  auto v = optional_string(o, key, where);
  if (auto* e = std::get_if<ApiError>(&v)) return *e;
  auto& s = std::get<std::optional<std::string>>(v);
  if (!s) return ApiError::invalid(where + "." + key, "'" + where + "." + key + "' is required");
  return std::move(*s);
}

// Validates OpenAI tool definitions ({type: "function", function: {name, description,
// parameters}}) in place; the list goes to the template as given.
std::optional<ApiError> check_openai_tools(const json& tools) {
  if (!tools.is_array()) return ApiError::invalid("tools", "'tools' must be a list");
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const std::string at = at_index("tools", i);
    const json& t = tools[i];
    if (!t.is_object()) return ApiError::invalid(at, "'" + at + "' must be an object");
    auto type = optional_string(t, "type", at);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    if (const auto& s = std::get<std::optional<std::string>>(type); s && *s != "function")
      return ApiError::invalid(at + ".type", "'" + at +
                                                 ".type' must be 'function' (tools of type '" +
                                                 s->substr(0, 64) + "' are not supported)");
    const auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object())
      return ApiError::invalid(at + ".function", "'" + at + ".function' must be an object");
    auto name = required_string(*fn, "name", at + ".function");
    if (auto* e = std::get_if<ApiError>(&name)) return *e;
    if (std::get<std::string>(name).empty())
      return ApiError::invalid(at + ".function.name", "'" + at + ".function.name' is empty");
    auto description = optional_string(*fn, "description", at + ".function");
    if (auto* e = std::get_if<ApiError>(&description)) return *e;
    if (const auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object())
      return ApiError::invalid(at + ".function.parameters",
                               "'" + at + ".function.parameters' must be an object");
  }
  return std::nullopt;
}

bool has_tool(const json& tools, const std::string& name) {
  for (const auto& t : tools)
    if (t.contains("function") && t["function"].value("name", "") == name) return true;
  return false;
}

// The checks both APIs share once tool_choice is read: a forced call needs tools, a named one
// must exist; "none" takes the tools out of the prompt.
std::optional<ApiError> settle_tool_choice(GenerationRequest& r, const char* param) {
  const std::string p = param;
  const bool forced = r.tool_choice.mode == ToolChoice::Mode::kRequired ||
                      r.tool_choice.mode == ToolChoice::Mode::kFunction;
  if (forced && r.chat.tools.empty())
    return ApiError::invalid(p, "'" + p + "' forces a tool call but 'tools' is empty");
  if (r.tool_choice.mode == ToolChoice::Mode::kFunction &&
      !has_tool(r.chat.tools, r.tool_choice.name))
    return ApiError::invalid(p, "'" + p + "' names the tool '" + r.tool_choice.name.substr(0, 128) +
                                    "', which is not in 'tools'");
  if (r.tool_choice.mode == ToolChoice::Mode::kNone) r.chat.tools = json::array();
  // A required call with one tool to choose from is a call of that tool: forcing its name too
  // keeps a model from calling a tool the request does not have.
  if (r.tool_choice.mode == ToolChoice::Mode::kRequired && r.chat.tools.size() == 1 &&
      r.chat.tools[0].contains("function") && r.chat.tools[0]["function"].contains("name") &&
      r.chat.tools[0]["function"]["name"].is_string()) {
    r.tool_choice.mode = ToolChoice::Mode::kFunction;
    r.tool_choice.name = r.chat.tools[0]["function"]["name"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> read_openai_tool_choice(const json& j, GenerationRequest& r) {
  const auto it = j.find("tool_choice");
  if (it != j.end() && !it->is_null()) {
    const json& c = *it;
    if (c.is_string()) {
      const std::string s = c.get<std::string>();
      if (s == "auto")
        r.tool_choice.mode = ToolChoice::Mode::kAuto;
      else if (s == "none")
        r.tool_choice.mode = ToolChoice::Mode::kNone;
      else if (s == "required")
        r.tool_choice.mode = ToolChoice::Mode::kRequired;
      else
        return ApiError::invalid("tool_choice",
                                 "'tool_choice' must be 'none', 'auto', 'required' or "
                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (c.is_object()) {
      if (c.value("type", "") != "function" || !c.contains("function") ||
          !c["function"].is_object() || !c["function"].contains("name") ||
          !c["function"]["name"].is_string())
        return ApiError::invalid("tool_choice",
                                 "'tool_choice' as an object must be {\"type\": \"function\", "
                                 "\"function\": {\"name\": ...}}");
      r.tool_choice.mode = ToolChoice::Mode::kFunction;
      r.tool_choice.name = c["function"]["name"].get<std::string>();
    } else {
      return ApiError::invalid("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  if (const auto p = j.find("parallel_tool_calls"); p != j.end() && !p->is_null()) {
    if (!p->is_boolean())
      return ApiError::invalid("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    r.tool_choice.parallel = p->get<bool>();
  }
  return settle_tool_choice(r, "tool_choice");
}

// OpenAI-compatible servers' ways to switch thinking: reasoning_effort "none" (OpenAI), a
// top-level enable_thinking or chat_template_kwargs.enable_thinking (vLLM, SGLang; Qwen's clients
// send these). Other efforts are accepted and leave the template's default.
std::optional<ApiError> read_openai_thinking(Fields& f, GenerationRequest& r) {
  std::string effort;
  f.string("reasoning_effort", effort);
  if (effort == "none") r.chat.enable_thinking = false;
  if (!effort.empty()) r.chat.reasoning_effort = effort;
  bool enable = false;
  if (f.get("enable_thinking")) {
    f.boolean("enable_thinking", enable);
    if (!f.error()) r.chat.enable_thinking = enable;
  }
  if (const json* k = f.get("chat_template_kwargs"); k && !f.error()) {
    if (!k->is_object())
      return ApiError::invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (const auto it = k->find("enable_thinking"); it != k->end() && !it->is_null()) {
      if (!it->is_boolean())
        return ApiError::invalid("chat_template_kwargs.enable_thinking",
                                 "'chat_template_kwargs.enable_thinking' must be a boolean");
      r.chat.enable_thinking = it->get<bool>();
    }
  }
  return std::nullopt;
}

}  // namespace

std::string api_label(ApiKind kind) {
  switch (kind) {
    case ApiKind::kChat:
      return "chat";
    case ApiKind::kCompletion:
      return "completions";
    case ApiKind::kMessages:
      return "messages";
  }
  return "other";
}

ParsedRequest parse_openai_chat(std::string_view body, const RequestLimits& limits) {
  auto parsed = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  json& j = std::get<json>(parsed);
  GenerationRequest r;
  r.kind = ApiKind::kChat;
  Fields f(j);
  read_openai_common(f, r, limits);
  f.boolean("logprobs", r.logprobs);
  std::optional<std::int64_t> top;
  f.integer("top_logprobs", top);
  if (top && !f.error()) {
    if (*top < 0 || *top > limits.max_top_logprobs)
      f.fail("top_logprobs",
             "'top_logprobs' must be between 0 and " + std::to_string(limits.max_top_logprobs));
    else if (!r.logprobs)
      f.fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    else
      r.top_logprobs = static_cast<std::int32_t>(*top);
  }
  if (auto e = read_openai_thinking(f, r)) return *e;
  if (f.error()) return *f.error();
  const json* messages = f.get("messages");
  if (!messages) return ApiError::invalid("messages", "'messages' is required");
  if (!messages->is_array()) return ApiError::invalid("messages", "'messages' must be a list");
  json tools;
  if (const json* t = f.get("tools")) {
    if (auto e = check_openai_tools(*t)) return *e;
    tools = std::move(j["tools"]);
  }
  // Client JSON is moved, never copied (a copy is a recursive walk of the client's nesting).
  auto c = parse_chat_messages(std::move(j["messages"]), std::move(tools));
  if (!c.ok()) return ApiError::invalid("messages", "'messages': " + c.status().message());
  const auto thinking = r.chat.enable_thinking;
  auto effort = std::move(r.chat.reasoning_effort);
  r.chat = std::move(*c);
  r.chat.enable_thinking = thinking;
  r.chat.reasoning_effort = std::move(effort);
  r.chat.add_generation_prompt = true;
  if (auto e = read_openai_tool_choice(j, r)) return *e;
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
  // The legacy API's logprobs is a count of alternatives (0-5), not a flag.
  std::optional<std::int64_t> logprobs;
  f.integer("logprobs", logprobs);
  if (logprobs && !f.error()) {
    if (*logprobs < 0 || *logprobs > 5)
      f.fail("logprobs", "'logprobs' must be an integer between 0 and 5");
    r.logprobs = true;
    r.top_logprobs = static_cast<std::int32_t>(*logprobs);
  }
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

// The refusal of a block type the server cannot read.
ApiError unsupported_block(const std::string& at, const std::string& type) {
  if (type == "image" || type == "document")
    return ApiError::invalid(at + ".type", "'" + at + "': content blocks of type '" + type +
                                               "' are not supported (this model reads text only)");
  return ApiError::invalid(at + ".type", "'" + at + "': content blocks of type '" +
                                             type.substr(0, 64) + "' are not supported here");
}

// One content block: an object with a string type.
std::variant<std::string, ApiError> block_type(const json& b, const std::string& at) {
  if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
    return ApiError::invalid(at, "'" + at + "' must be an object with a string 'type'");
  return b["type"].get<std::string>();
}

// A string, or a list of text blocks (system prompts, tool results): the texts joined.
// Claude Code puts `x-anthropic-billing-header: cc_version=...;` first in `system`, with a suffix
// that changes from prompt to prompt; Anthropic's API reads that block as metadata, not prompt.
// Rendered, it would make every turn's prompt differ from its first tokens (no warm prefix).
bool is_billing_header(std::string_view text) {
  return text.starts_with("x-anthropic-billing-header:");
}

// The text of a string or a list of text blocks, joined; with `drop_billing_header` (the top-level
// `system`) the billing block above is left out.
std::variant<std::string, ApiError> anthropic_text(const json& content, const std::string& where,
                                                   bool drop_billing_header = false) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return ApiError::invalid(where, "'" + where + "' must be a string or a list of content blocks");
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const std::string at = at_index(where, i);
    auto type = block_type(content[i], at);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    if (std::get<std::string>(type) != "text")
      return unsupported_block(at, std::get<std::string>(type));
    auto t = required_string(content[i], "text", at);
    if (auto* e = std::get_if<ApiError>(&t)) return *e;
    if (drop_billing_header && is_billing_header(std::get<std::string>(t))) continue;
    text += std::get<std::string>(t);
  }
  return text;
}

// Anthropic's tool definitions ({name, description, input_schema}) as OpenAI function tools,
// which the templates render.
std::variant<json, ApiError> anthropic_tools(json& tools) {
  if (!tools.is_array()) return ApiError::invalid("tools", "'tools' must be a list");
  json out = json::array();
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const std::string at = at_index("tools", i);
    json& t = tools[i];
    if (!t.is_object()) return ApiError::invalid(at, "'" + at + "' must be an object");
    auto type = optional_string(t, "type", at);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    if (const auto& s = std::get<std::optional<std::string>>(type); s && *s != "custom")
      return ApiError::invalid(at + ".type", "'" + at + ".type': server tools ('" +
                                                 s->substr(0, 64) +
                                                 "') are not supported; only client tools with "
                                                 "an input_schema");
    auto name = required_string(t, "name", at);
    if (auto* e = std::get_if<ApiError>(&name)) return *e;
    if (std::get<std::string>(name).empty())
      return ApiError::invalid(at + ".name", "'" + at + ".name' is empty");
    auto description = optional_string(t, "description", at);
    if (auto* e = std::get_if<ApiError>(&description)) return *e;
    const auto schema = t.find("input_schema");
    if (schema == t.end() || !schema->is_object())
      return ApiError::invalid(at + ".input_schema", "'" + at + ".input_schema' must be an object");
    json fn = json::object();
    fn["name"] = std::get<std::string>(name);
    if (const auto& d = std::get<std::optional<std::string>>(description)) fn["description"] = *d;
    fn["parameters"] = std::move(*schema);
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

std::optional<ApiError> read_anthropic_tool_choice(const json& j, GenerationRequest& r) {
  const auto it = j.find("tool_choice");
  if (it == j.end() || it->is_null()) return std::nullopt;
  const json& c = *it;
  if (!c.is_object()) return ApiError::invalid("tool_choice", "'tool_choice' must be an object");
  auto type = required_string(c, "type", "tool_choice");
  if (auto* e = std::get_if<ApiError>(&type)) return *e;
  const std::string& t = std::get<std::string>(type);
  if (t == "auto") {
    r.tool_choice.mode = ToolChoice::Mode::kAuto;
  } else if (t == "any") {
    r.tool_choice.mode = ToolChoice::Mode::kRequired;
  } else if (t == "none") {
    r.tool_choice.mode = ToolChoice::Mode::kNone;
  } else if (t == "tool") {
    auto name = required_string(c, "name", "tool_choice");
    if (auto* e = std::get_if<ApiError>(&name)) return *e;
    r.tool_choice.mode = ToolChoice::Mode::kFunction;
    r.tool_choice.name = std::get<std::string>(name);
  } else {
    return ApiError::invalid("tool_choice.type",
                             "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'");
  }
  if (const auto p = c.find("disable_parallel_tool_use"); p != c.end() && !p->is_null()) {
    if (!p->is_boolean())
      return ApiError::invalid("tool_choice.disable_parallel_tool_use",
                               "'tool_choice.disable_parallel_tool_use' must be a boolean");
    r.tool_choice.parallel = !p->get<bool>();
  }
  return settle_tool_choice(r, "tool_choice");
}

// thinking: {type: enabled, budget_tokens} | {type: adaptive} | {type: disabled}. Absent leaves
// the template's default: switching thinking off writes an empty think block into the generation
// prompt, which the next turn's prompt does not repeat, so every later turn would be a cold
// prefill (and a model that thinks by default says so in thinking blocks).
std::optional<ApiError> read_anthropic_thinking(const json& j, GenerationRequest& r) {
  const auto it = j.find("thinking");
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return ApiError::invalid("thinking", "'thinking' must be an object");
  auto type = required_string(*it, "type", "thinking");
  if (auto* e = std::get_if<ApiError>(&type)) return *e;
  const std::string& t = std::get<std::string>(type);
  if (t != "enabled" && t != "adaptive" && t != "disabled")
    return ApiError::invalid("thinking.type",
                             "'thinking.type' must be 'enabled', 'adaptive' or 'disabled'");
  r.chat.enable_thinking = t != "disabled";
  const auto budget = it->find("budget_tokens");
  if (budget != it->end() && !budget->is_null()) {
    if (!budget->is_number_integer() || budget->get<std::int64_t>() < 1)
      return ApiError::invalid("thinking.budget_tokens",
                               "'thinking.budget_tokens' must be a positive integer");
    r.thinking_budget = budget->get<std::int64_t>();
  } else if (t == "enabled") {
    return ApiError::invalid("thinking.budget_tokens",
                             "'thinking.budget_tokens' is required when thinking is enabled");
  }
  return std::nullopt;
}

// An assistant message's blocks: text, thinking (the turn's reasoning), redacted_thinking
// (opaque: nothing to render) and tool_use (a tool call; its input is moved, never copied).
std::optional<ApiError> read_assistant_blocks(json& content, const std::string& where,
                                              ChatMessage& msg) {
  std::string text, reasoning;
  bool has_text = false;
  for (std::size_t k = 0; k < content.size(); ++k) {
    const std::string at = at_index(where, k);
    auto type = block_type(content[k], at);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    const std::string& t = std::get<std::string>(type);
    json& b = content[k];
    if (t == "text") {
      auto s = required_string(b, "text", at);
      if (auto* e = std::get_if<ApiError>(&s)) return *e;
      text += std::get<std::string>(s);
      has_text = true;
    } else if (t == "thinking") {
      auto s = required_string(b, "thinking", at);
      if (auto* e = std::get_if<ApiError>(&s)) return *e;
      reasoning += std::get<std::string>(s);
    } else if (t == "redacted_thinking") {
      continue;
    } else if (t == "tool_use") {
      auto id = required_string(b, "id", at);
      if (auto* e = std::get_if<ApiError>(&id)) return *e;
      auto name = required_string(b, "name", at);
      if (auto* e = std::get_if<ApiError>(&name)) return *e;
      const auto input = b.find("input");
      if (input == b.end() || !input->is_object())
        return ApiError::invalid(at + ".input", "'" + at + ".input' must be an object");
      ChatToolCall call;
      call.id = std::get<std::string>(std::move(id));
      call.name = std::get<std::string>(name);
      call.arguments = std::move(*input);
      msg.tool_calls.push_back(std::move(call));
    } else {
      return unsupported_block(at, t);
    }
  }
  if (has_text || msg.tool_calls.empty()) msg.content = std::move(text);
  if (!reasoning.empty()) msg.reasoning_content = std::move(reasoning);
  return std::nullopt;
}

// A user message's blocks: text (joined into user turns) and tool_result (each a tool message,
// in order; is_error results are marked "Error: " for the model).
std::optional<ApiError> read_user_blocks(const json& content, const std::string& where,
                                         std::vector<ChatMessage>& out) {
  std::optional<std::string> text;
  const auto flush = [&] {
    if (!text) return;
    ChatMessage m;
    m.role = "user";
    m.content = std::move(*text);
    out.push_back(std::move(m));
    text.reset();
  };
  for (std::size_t k = 0; k < content.size(); ++k) {
    const std::string at = at_index(where, k);
    auto type = block_type(content[k], at);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    const std::string& t = std::get<std::string>(type);
    const json& b = content[k];
    if (t == "text") {
      auto s = required_string(b, "text", at);
      if (auto* e = std::get_if<ApiError>(&s)) return *e;
      text = text.value_or("") + std::get<std::string>(s);
    } else if (t == "tool_result") {
      flush();
      auto id = required_string(b, "tool_use_id", at);
      if (auto* e = std::get_if<ApiError>(&id)) return *e;
      std::string result;
      if (const auto c = b.find("content"); c != b.end() && !c->is_null()) {
        auto r = anthropic_text(*c, at + ".content");
        if (auto* e = std::get_if<ApiError>(&r)) return *e;
        result = std::move(std::get<std::string>(r));
      }
      bool is_error = false;
      if (const auto ie = b.find("is_error"); ie != b.end() && !ie->is_null()) {
        if (!ie->is_boolean())
          return ApiError::invalid(at + ".is_error", "'" + at + ".is_error' must be a boolean");
        is_error = ie->get<bool>();
      }
      ChatMessage m;
      m.role = "tool";
      m.tool_call_id = std::get<std::string>(id);
      m.content = is_error ? "Error: " + result : std::move(result);
      out.push_back(std::move(m));
    } else {
      return unsupported_block(at, t);
    }
  }
  if (content.empty()) text = "";
  flush();
  return std::nullopt;
}

ParsedRequest parse_anthropic(std::string_view body, const RequestLimits& limits,
                              bool require_max_tokens) {
  auto parsed = parse_body(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  json& j = std::get<json>(parsed);
  GenerationRequest r;
  r.kind = ApiKind::kMessages;
  Fields f(j);
  f.string("model", r.model);
  if (require_max_tokens && !f.get("max_tokens"))
    return ApiError::invalid("max_tokens", "'max_tokens' is required");
  read_max_tokens(f, r, "max_tokens", limits);
  r.sampler = limits.sampling_defaults;
  read_sampling(f, r, 1.0);
  f.stop_list("stop_sequences", r.stop, false, limits);
  f.boolean("stream", r.stream);
  if (const json* m = f.get("metadata"); m && !m->is_object())
    f.fail("metadata", "'metadata' must be an object");
  std::string service_tier;
  f.string("service_tier", service_tier);
  if (f.error()) return *f.error();
  if (auto e = read_anthropic_thinking(j, r)) return *e;

  // The system prompt: `system`, then every system-role message in order, joined.
  std::vector<std::string> system;
  if (const json* s = f.get("system")) {
    auto text = anthropic_text(*s, "system", /*drop_billing_header=*/true);
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    system.push_back(std::move(std::get<std::string>(text)));
  }
  const json* list = f.get("messages");
  if (!list) return ApiError::invalid("messages", "'messages' is required");
  if (!list->is_array() || list->empty())
    return ApiError::invalid("messages", "'messages' must be a non-empty list");
  std::vector<ChatMessage> turns;
  json& messages = j["messages"];
  for (std::size_t i = 0; i < messages.size(); ++i) {
    json& m = messages[i];
    const std::string at = at_index("messages", i);
    if (!m.is_object()) return ApiError::invalid(at, "'" + at + "' must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string() ||
        (*role != "user" && *role != "assistant" && *role != "system"))
      return ApiError::invalid(at + ".role",
                               "'" + at + ".role' must be 'user', 'assistant' or 'system'");
    const auto content = m.find("content");
    if (content == m.end() || content->is_null())
      return ApiError::invalid(at + ".content", "'" + at + ".content' is required");
    if (!content->is_string() && !content->is_array())
      return ApiError::invalid(at + ".content", "'" + at +
                                                    ".content' must be a string or a list of "
                                                    "content blocks");
    if (*role == "system") {
      auto text = anthropic_text(*content, at + ".content");
      if (auto* e = std::get_if<ApiError>(&text)) return *e;
      system.push_back(std::move(std::get<std::string>(text)));
    } else if (content->is_string()) {
      ChatMessage msg;
      msg.role = role->get<std::string>();
      msg.content = content->get<std::string>();
      turns.push_back(std::move(msg));
    } else if (*role == "assistant") {
      ChatMessage msg;
      msg.role = "assistant";
      if (auto e = read_assistant_blocks(*content, at + ".content", msg)) return *e;
      turns.push_back(std::move(msg));
    } else if (auto e = read_user_blocks(*content, at + ".content", turns)) {
      return *e;
    }
  }
  if (turns.empty())
    return ApiError::invalid("messages", "'messages' holds no user or assistant message");
  if (!system.empty()) {
    ChatMessage s;
    s.role = "system";
    std::string joined;
    for (std::size_t k = 0; k < system.size(); ++k) joined += (k ? "\n\n" : "") + system[k];
    s.content = std::move(joined);
    turns.insert(turns.begin(), std::move(s));
  }
  const auto thinking = r.chat.enable_thinking;
  r.chat.messages = std::move(turns);
  r.chat.enable_thinking = thinking;
  r.chat.add_generation_prompt = true;
  if (f.get("tools")) {
    auto tools = anthropic_tools(j["tools"]);
    if (auto* e = std::get_if<ApiError>(&tools)) return *e;
    r.chat.tools = std::move(std::get<json>(tools));
  }
  if (auto e = read_anthropic_tool_choice(j, r)) return *e;
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
