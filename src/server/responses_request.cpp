#include "server/responses_request.h"

#include <cmath>

#include "format/json_parse.h"

namespace fs::server {
namespace {

using json = nlohmann::ordered_json;

// A field of the request, or of an item, read with its path for the error message.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  std::string at(std::string_view name) const {
    return path_.empty() ? std::string(name) : path_ + "." + std::string(name);
  }
  const json* get(const char* name) const {
    const auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  void string(const char* name, std::string& out) {
    if (const json* v = get(name); v && !error_) {
      if (!v->is_string()) return fail(name, "must be a string");
      out = v->get<std::string>();
    }
  }
  void string(const char* name, std::optional<std::string>& out) {
    std::string s;
    if (get(name) == nullptr) return;
    string(name, s);
    if (!error_) out = std::move(s);
  }
  void boolean(const char* name, bool& out) {
    if (const json* v = get(name); v && !error_) {
      if (!v->is_boolean()) return fail(name, "must be a boolean");
      out = v->get<bool>();
    }
  }
  void number(const char* name, double& out, double lo, double hi) {
    if (const json* v = get(name); v && !error_) {
      if (!v->is_number()) return fail(name, "must be a number");
      const double x = v->get<double>();
      if (!std::isfinite(x) || x < lo || x > hi)
        return fail(name, "must be between " + fmt(lo) + " and " + fmt(hi) + ", got " + fmt(x));
      out = x;
    }
  }
  void integer(const char* name, std::optional<std::int64_t>& out) {
    if (const json* v = get(name); v && !error_) {
      if (v->is_number_integer()) {
        out = v->get<std::int64_t>();
      } else if (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>() &&
                 std::fabs(v->get<double>()) < 9e15) {
        out = static_cast<std::int64_t>(v->get<double>());  // 5.0 reads as 5; 5.5 does not
      } else {
        fail(name, "must be an integer");
      }
    }
  }
  // A field that must be an object when present; returns it (or null).
  const json* object(const char* name) {
    const json* v = get(name);
    if (!v || error_) return nullptr;
    if (!v->is_object()) {
      fail(name, "must be an object");
      return nullptr;
    }
    return v;
  }
  // A string field that must be one of `allowed`.
  void one_of(const char* name, std::optional<std::string>& out,
              std::initializer_list<std::string_view> allowed) {
    string(name, out);
    if (error_ || !out) return;
    for (const auto a : allowed)
      if (*out == a) return;
    std::string list;
    for (const auto a : allowed) list += (list.empty() ? "'" : ", '") + std::string(a) + "'";
    fail(name, "must be one of " + list + ", got '" + out->substr(0, 64) + "'");
  }

  void fail(std::string_view name, const std::string& what) {
    if (error_) return;
    const std::string p = at(name);
    error_ = ApiError::invalid(p, "'" + p + "' " + what);
  }
  void fail_raw(ApiError e) {
    if (!error_) error_ = std::move(e);
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
  std::string path_;
  std::optional<ApiError> error_;
};

std::string clip(const std::string& s) {
  return s.size() <= 64 ? s : s.substr(0, 64) + "...";
}

using TextOrError = std::variant<std::string, ApiError>;

// One content part's text: the text kinds are read (input_text, output_text, refusal, and the
// summary_text/reasoning_text parts of reasoning items); images, files and audio are refused.
TextOrError part_text(const json& part, const std::string& at) {
  if (!part.is_object()) return ApiError::invalid(at, "'" + at + "' must be an object");
  const auto type = part.find("type");
  if (type == part.end() || !type->is_string())
    return ApiError::invalid(at + ".type", "'" + at + ".type' must be a string");
  const std::string t = type->get<std::string>();
  const char* field = t == "input_text" || t == "output_text" || t == "text" ||
                              t == "summary_text" || t == "reasoning_text"
                          ? "text"
                      : t == "refusal" ? "refusal"
                                       : nullptr;
  if (!field)
    return ApiError::invalid(at + ".type", "'" + at + ".type': content parts of type '" + clip(t) +
                                               "' are not supported (this server reads text "
                                               "only: input_text, output_text, refusal)");
  const auto v = part.find(field);
  if (v == part.end() || !v->is_string())
    return ApiError::invalid(at + "." + field, "'" + at + "." + field + "' must be a string");
  return v->get<std::string>();
}

// Message content or a function_call_output's output: a string or a list of text parts,
// joined without separators (as the chat templates join parts).
TextOrError text_of(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return ApiError::invalid(where, "'" + where + "' must be a string or a list of content parts");
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    auto piece = part_text(content[i], where + "[" + std::to_string(i) + "]");
    if (std::holds_alternative<ApiError>(piece)) return piece;
    text += std::get<std::string>(piece);
  }
  return text;
}

// A reasoning item's text: its reasoning_text content, else its summary parts (one paragraph
// each). An item carrying only encrypted_content (from another server) reads as empty.
TextOrError reasoning_text_of(const json& item, const std::string& where) {
  for (const char* field : {"content", "summary"}) {
    const auto it = item.find(field);
    if (it == item.end() || it->is_null()) continue;
    const std::string at = where + "." + field;
    if (!it->is_array()) return ApiError::invalid(at, "'" + at + "' must be a list");
    if (it->empty()) continue;
    std::string text;
    for (std::size_t i = 0; i < it->size(); ++i) {
      auto piece = part_text((*it)[i], at + "[" + std::to_string(i) + "]");
      if (std::holds_alternative<ApiError>(piece)) return piece;
      if (i > 0 && std::string_view(field) == "summary") text += "\n\n";
      text += std::get<std::string>(piece);
    }
    return text;
  }
  return std::string();
}

// Item types of the Responses API that name something this server cannot serve.
bool is_known_unsupported_item(const std::string& type) {
  for (const char* t : {"computer_call",     "computer_call_output",    "web_search_call",
                        "file_search_call",  "image_generation_call",   "code_interpreter_call",
                        "local_shell_call",  "local_shell_call_output", "shell_call",
                        "shell_call_output", "apply_patch_call",        "apply_patch_call_output",
                        "mcp_list_tools",    "mcp_approval_request",    "mcp_approval_response",
                        "mcp_call",          "custom_tool_call",        "custom_tool_call_output",
                        "tool_search_call",  "tool_search_output",      "item_reference",
                        "compaction",        "compaction_trigger",      "additional_tools",
                        "program",           "program_output"})
    if (type == t) return true;
  return false;
}

std::variant<ResponseItem, ApiError> parse_item(const json& j, const std::string& at) {
  if (!j.is_object()) return ApiError::invalid(at, "'" + at + "' must be an object");
  Reader r(j, at);
  std::string type;
  r.string("type", type);
  if (r.error()) return *r.error();
  if (type.empty() && r.get("role")) type = "message";  // EasyInputMessage: type is optional
  ResponseItem item;
  r.string("id", item.id);
  if (type == "message") {
    item.kind = ItemKind::kMessage;
    r.string("role", item.role);
    if (r.error()) return *r.error();
    if (item.role != "user" && item.role != "assistant" && item.role != "system" &&
        item.role != "developer")
      return ApiError::invalid(at + ".role", "'" + at +
                                                 ".role' must be 'user', 'assistant', 'system' "
                                                 "or 'developer'");
    const json* content = r.get("content");
    if (!content) return ApiError::invalid(at + ".content", "'" + at + ".content' is required");
    auto text = text_of(*content, at + ".content");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    item.text = std::move(std::get<std::string>(text));
  } else if (type == "function_call") {
    item.kind = ItemKind::kFunctionCall;
    r.string("call_id", item.call_id);
    r.string("name", item.name);
    r.string("arguments", item.arguments);
    std::string ns;  // rendered by the function's own name, as the tools are
    r.string("namespace", ns);
    if (r.error()) return *r.error();
    if (item.call_id.empty())
      return ApiError::invalid(at + ".call_id", "'" + at + ".call_id' is required");
    if (item.name.empty()) return ApiError::invalid(at + ".name", "'" + at + ".name' is required");
    if (item.arguments.empty()) item.arguments = "{}";
  } else if (type == "function_call_output") {
    item.kind = ItemKind::kFunctionCallOutput;
    r.string("call_id", item.call_id);
    if (r.error()) return *r.error();
    if (item.call_id.empty())
      return ApiError::invalid(at + ".call_id", "'" + at + ".call_id' is required");
    const json* output = r.get("output");
    if (!output) return ApiError::invalid(at + ".output", "'" + at + ".output' is required");
    auto text = text_of(*output, at + ".output");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    item.text = std::move(std::get<std::string>(text));
  } else if (type == "reasoning") {
    item.kind = ItemKind::kReasoning;
    auto text = reasoning_text_of(j, at);
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    item.text = std::move(std::get<std::string>(text));
  } else if (type.empty()) {
    return ApiError::invalid(at + ".type", "'" + at + ".type' is required (or a message 'role')");
  } else {
    return ApiError::invalid(
        at + ".type", "'" + at + ".type': input items of type '" + clip(type) +
                          "' are not supported" +
                          (is_known_unsupported_item(type) ? std::string(" by this server")
                                                           : std::string(" (unknown type)")) +
                          "; it serves message, function_call, function_call_output and "
                          "reasoning items");
  }
  if (r.error()) return *r.error();
  return item;
}

// One function tool, added to the rendered tools unless a function of that name is there.
void read_function_tool(Reader& f, const json& t, const std::string& at, const std::string& ns,
                        ResponsesRequest& r) {
  Reader tr(t, at);
  std::string name;
  std::optional<std::string> description;
  tr.string("name", name);
  tr.string("description", description);
  bool strict = false;
  tr.boolean("strict", strict);
  const json* params = tr.object("parameters");
  if (tr.error()) return f.fail_raw(*tr.error());
  if (name.empty())
    return f.fail_raw(ApiError::invalid(at + ".name", "'" + at + ".name' is required"));
  for (const auto& n : r.function_names)
    if (n == name) return;  // the model sees names only: the first of a name is the one
  json fn = {{"name", name}};
  if (description) fn["description"] = *description;
  if (params) fn["parameters"] = *params;
  r.tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  r.function_names.push_back(name);
  r.function_namespaces.push_back(ns);
}

// tools: function tools (top-level or in a namespace) are rendered; the others (hosted tools,
// custom, shell, mcp, ...) are not shown to the model and are only echoed.
void read_tools(Reader& f, ResponsesRequest& r) {
  const json* tools = f.get("tools");
  if (!tools || f.error()) return;
  if (!tools->is_array()) return f.fail("tools", "must be a list");
  for (std::size_t i = 0; i < tools->size() && !f.error(); ++i) {
    const json& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
      return f.fail_raw(
          ApiError::invalid(at, "'" + at + "' must be an object with a string 'type'"));
    if (t["type"] == "function") {
      read_function_tool(f, t, at, "", r);
    } else if (t["type"] == "namespace") {
      Reader nr(t, at);
      std::string ns;
      nr.string("name", ns);
      const json* inner = nr.get("tools");
      if (!nr.error() && (!inner || !inner->is_array()))
        nr.fail("tools", "must be a list of tools");
      if (nr.error()) return f.fail_raw(*nr.error());
      for (std::size_t k = 0; k < inner->size() && !f.error(); ++k) {
        const json& fn = (*inner)[k];
        const std::string in_at = at + ".tools[" + std::to_string(k) + "]";
        if (fn.is_object() && fn.value("type", "") == "function")
          read_function_tool(f, fn, in_at, ns, r);
      }
    }
  }
  if (!f.error()) r.echo_tools = *tools;
}

bool has_function(const ResponsesRequest& r, const std::string& name) {
  for (const auto& n : r.function_names)
    if (n == name) return true;
  return false;
}

// tool_choice: auto, none, required, {type: function, name}, or {type: allowed_tools, mode,
// tools: [{type: function, name}]} (the listed functions only).
void read_tool_choice(Reader& f, ResponsesRequest& r) {
  const json* tc = f.get("tool_choice");
  if (!tc || f.error()) return;
  r.echo_tool_choice = *tc;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "auto")
      r.tool_choice.mode = ToolChoice::Mode::kAuto;
    else if (s == "none")
      r.tool_choice.mode = ToolChoice::Mode::kNone;
    else if (s == "required")
      r.tool_choice.mode = ToolChoice::Mode::kRequired;
    else
      return f.fail("tool_choice",
                    "must be 'auto', 'none', 'required' or an object, got '" + clip(s) + "'");
    if (r.tool_choice.mode == ToolChoice::Mode::kRequired && r.function_names.empty())
      return f.fail("tool_choice", "is 'required' but no function tools are given");
    return;
  }
  if (!tc->is_object() || !tc->contains("type") || !(*tc)["type"].is_string())
    return f.fail("tool_choice", "must be a string or an object with a string 'type'");
  const std::string type = (*tc)["type"].get<std::string>();
  Reader tr(*tc, "tool_choice");
  if (type == "function") {
    std::string name;
    tr.string("name", name);
    if (tr.error()) return f.fail_raw(*tr.error());
    if (!has_function(r, name))
      return f.fail_raw(ApiError::invalid("tool_choice.name",
                                          "'tool_choice.name' names '" + clip(name) +
                                              "', which is not a function tool of this request"));
    r.tool_choice.mode = ToolChoice::Mode::kFunction;
    r.tool_choice.name = name;
    return;
  }
  if (type == "allowed_tools") {
    std::optional<std::string> mode;
    tr.one_of("mode", mode, {"auto", "required"});
    const json* list = tr.get("tools");
    if (tr.error()) return f.fail_raw(*tr.error());
    if (!list || !list->is_array()) return f.fail("tool_choice.tools", "must be a list of tools");
    std::vector<std::string> allowed;
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& t = (*list)[i];
      const std::string at = "tool_choice.tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("name") ||
          !t["name"].is_string())
        return f.fail_raw(ApiError::invalid(
            at, "'" + at + "' must be {type: 'function', name} (only function tools are served)"));
      allowed.push_back(t["name"].get<std::string>());
    }
    json kept = json::array();
    std::vector<std::string> names, namespaces;
    for (std::size_t i = 0; i < r.function_names.size(); ++i) {
      for (const auto& a : allowed)
        if (a == r.function_names[i]) {
          kept.push_back(r.tools[i]);
          names.push_back(a);
          namespaces.push_back(r.function_namespaces[i]);
          break;
        }
    }
    r.tools = std::move(kept);
    r.function_names = std::move(names);
    r.function_namespaces = std::move(namespaces);
    r.tool_choice.mode = mode == "required" ? ToolChoice::Mode::kRequired : ToolChoice::Mode::kAuto;
    if (r.tool_choice.mode == ToolChoice::Mode::kRequired && r.function_names.empty())
      return f.fail("tool_choice", "requires a call but allows none of this request's functions");
    return;
  }
  f.fail_raw(ApiError::invalid("tool_choice.type",
                               "'tool_choice.type' '" + clip(type) +
                                   "' is not supported; this server serves function tools only"));
}

void read_reasoning(Reader& f, ResponsesRequest& r) {
  const json* reasoning = f.object("reasoning");
  if (!reasoning) return;
  Reader rr(*reasoning, "reasoning");
  rr.one_of("effort", r.reasoning_effort, {"none", "minimal", "low", "medium", "high", "xhigh"});
  rr.one_of("summary", r.reasoning_summary, {"auto", "concise", "detailed"});
  // generate_summary: the older name of summary.
  std::optional<std::string> legacy;
  rr.one_of("generate_summary", legacy, {"auto", "concise", "detailed"});
  if (!r.reasoning_summary) r.reasoning_summary = legacy;
  if (rr.error()) return f.fail_raw(*rr.error());
  if (r.reasoning_effort == "none" || r.reasoning_effort == "minimal") r.enable_thinking = false;
}

void read_text(Reader& f, ResponsesRequest& r) {
  const json* text = f.object("text");
  if (!text) return;
  Reader tr(*text, "text");
  if (const json* format = tr.object("format")) {
    Reader fr(*format, "text.format");
    std::optional<std::string> type;
    fr.one_of("type", type, {"text", "json_object", "json_schema"});
    if (fr.error()) return f.fail_raw(*fr.error());
  }
  std::optional<std::string> verbosity;
  tr.one_of("verbosity", verbosity, {"low", "medium", "high"});
  if (tr.error()) return f.fail_raw(*tr.error());
  r.echo_text = *text;
  if (!r.echo_text.contains("format")) r.echo_text["format"] = {{"type", "text"}};
  if (!r.echo_text.contains("verbosity")) r.echo_text["verbosity"] = "medium";
}

// Fields that are read for their type only (the server does not act on them).
void read_ignored(Reader& f, ResponsesRequest& r) {
  if (const json* include = f.get("include"); include && !f.error()) {
    if (!include->is_array()) return f.fail("include", "must be a list of strings");
    for (const auto& s : *include)
      if (!s.is_string()) return f.fail("include", "must be a list of strings");
  }
  if (const json* metadata = f.object("metadata")) {
    for (const auto& [k, v] : metadata->items())
      if (!v.is_string())
        return f.fail_raw(ApiError::invalid("metadata." + clip(k),
                                            "'metadata." + clip(k) + "' must be a string"));
    r.echo_metadata = *metadata;
  }
  std::optional<std::string> truncation;
  f.one_of("truncation", truncation, {"auto", "disabled"});
  if (truncation) r.truncation = *truncation;
  f.string("user", r.user);
  f.string("prompt_cache_key", r.prompt_cache_key);
  f.string("safety_identifier", r.safety_identifier);
  std::optional<std::string> tier;
  f.string("service_tier", tier);
  std::optional<std::int64_t> top_logprobs;
  f.integer("top_logprobs", top_logprobs);
  if (top_logprobs) {
    if (*top_logprobs < 0 || *top_logprobs > 20)
      return f.fail("top_logprobs", "must be between 0 and 20");
    if (*top_logprobs > 0)
      return f.fail("top_logprobs", "is not supported (logprobs are not reported)");
  }
  std::optional<std::string> cache_retention;
  f.one_of("prompt_cache_retention", cache_retention, {"in_memory", "24h"});
  std::optional<std::int64_t> max_tool_calls;
  f.integer("max_tool_calls", max_tool_calls);
  // Features whose absence would change the answer are refused rather than ignored.
  bool background = false;
  f.boolean("background", background);
  if (background) return f.fail("background", "is not supported (responses run in the foreground)");
  if (f.get("conversation") && !f.error())
    return f.fail("conversation", "is not supported; use previous_response_id");
  if (f.get("prompt") && !f.error())
    return f.fail("prompt", "(a stored prompt template) is not supported");
}

}  // namespace

std::size_t ResponseItem::bytes() const {
  return sizeof(ResponseItem) + id.size() + role.size() + text.size() + call_id.size() +
         name.size() + arguments.size();
}

ParsedResponsesRequest parse_responses_request(std::string_view body, const RequestLimits& limits) {
  JsonLimits l;
  l.max_depth = limits.max_json_depth;
  l.max_values = limits.max_json_values;
  auto parsed = parse_ordered_json_bounded(body, l);
  if (!parsed.ok())
    return ApiError::invalid("", "the request body is refused: " + parsed.status().message(),
                             "invalid_json");
  const json& j = *parsed;
  if (!j.is_object()) return ApiError::invalid("", "the request body must be a JSON object");

  ResponsesRequest r;
  Reader f(j, "");
  f.string("model", r.model);
  f.string("instructions", r.instructions);
  f.string("previous_response_id", r.previous_response_id);
  f.boolean("stream", r.stream);
  f.boolean("store", r.store);
  f.boolean("parallel_tool_calls", r.parallel_tool_calls);
  r.sampler = limits.sampling_defaults;
  f.number("temperature", r.sampler.temperature, 0.0, 2.0);
  f.number("top_p", r.sampler.top_p, 0.0, 1.0);
  if (!f.error() && r.sampler.top_p <= 0.0) f.fail("top_p", "must be greater than 0 and at most 1");
  f.integer("max_output_tokens", r.max_output_tokens);
  if (r.max_output_tokens && *r.max_output_tokens < 1)
    f.fail("max_output_tokens", "must be at least 1, got " + std::to_string(*r.max_output_tokens));
  else if (r.max_output_tokens)  // clamped, as max_tokens is on the other APIs
    r.max_output_tokens = std::min(*r.max_output_tokens, limits.max_tokens);
  read_tools(f, r);
  read_tool_choice(f, r);
  r.tool_choice.parallel = r.parallel_tool_calls;
  read_reasoning(f, r);
  read_text(f, r);
  read_ignored(f, r);
  if (f.error()) return *f.error();

  const json* input = f.get("input");
  if (!input && r.previous_response_id.empty())
    return ApiError::invalid("input", "'input' is required");
  if (input && input->is_string()) {
    ResponseItem m;
    m.role = "user";
    m.text = input->get<std::string>();
    r.input.push_back(std::move(m));
  } else if (input && input->is_array()) {
    for (std::size_t i = 0; i < input->size(); ++i) {
      auto item = parse_item((*input)[i], "input[" + std::to_string(i) + "]");
      if (auto* e = std::get_if<ApiError>(&item)) return *e;
      r.input.push_back(std::move(std::get<ResponseItem>(item)));
    }
  } else if (input) {
    return ApiError::invalid("input", "'input' must be a string or a list of items");
  }
  if (r.input.empty() && r.previous_response_id.empty())
    return ApiError::invalid("input", "'input' is empty");
  if (auto s = r.sampler.validate(); !s.ok()) return ApiError::invalid("", s.message());
  return r;
}

ChatRequest conversation_chat(const std::optional<std::string>& instructions,
                              std::span<const ResponseItem> history,
                              std::span<const ResponseItem> input,
                              const nlohmann::ordered_json& tools,
                              std::optional<bool> enable_thinking) {
  ChatRequest chat;
  chat.tools = tools;
  chat.add_generation_prompt = true;
  chat.enable_thinking = enable_thinking;
  if (instructions) {
    ChatMessage m;
    m.role = "system";
    m.content = *instructions;
    chat.messages.push_back(std::move(m));
  }
  // The assistant message being assembled from consecutive output items, if any.
  bool open = false;
  const auto assistant = [&]() -> ChatMessage& {
    if (!open) {
      ChatMessage m;
      m.role = "assistant";
      chat.messages.push_back(std::move(m));
      open = true;
    }
    return chat.messages.back();
  };
  const auto add = [&](const ResponseItem& item) {
    switch (item.kind) {
      case ItemKind::kReasoning: {
        // Reasoning opens a turn: it precedes the turn's text and calls.
        if (open && (chat.messages.back().content || !chat.messages.back().tool_calls.empty()))
          open = false;
        ChatMessage& m = assistant();
        m.reasoning_content =
            m.reasoning_content ? *m.reasoning_content + "\n\n" + item.text : item.text;
        break;
      }
      case ItemKind::kMessage:
        if (item.role == "assistant") {
          // Text after a call belongs to a later turn (templates write calls after the text).
          if (open && !chat.messages.back().tool_calls.empty()) open = false;
          ChatMessage& m = assistant();
          m.content = m.content ? *m.content + item.text : item.text;
        } else {
          open = false;
          ChatMessage m;
          m.role = item.role == "developer" ? "system" : item.role;
          m.content = item.text;
          chat.messages.push_back(std::move(m));
        }
        break;
      case ItemKind::kFunctionCall: {
        ChatToolCall call;
        call.id = item.call_id;
        call.name = item.name;
        call.arguments = item.arguments;
        assistant().tool_calls.push_back(std::move(call));
        break;
      }
      case ItemKind::kFunctionCallOutput: {
        open = false;
        ChatMessage m;
        m.role = "tool";
        m.content = item.text;
        m.tool_call_id = item.call_id;
        chat.messages.push_back(std::move(m));
        break;
      }
    }
  };
  for (const auto& item : history) add(item);
  for (const auto& item : input) add(item);
  return chat;
}

}  // namespace fs::server
