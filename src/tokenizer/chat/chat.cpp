#include "tokenizer/chat/chat.h"

#include <charconv>
#include <cmath>
#include <filesystem>

#include "format/config_json.h"
#include "format/json_parse.h"
#include "util/mapped_file.h"

namespace fs {

using ojson = nlohmann::ordered_json;

namespace {

Expected<std::optional<std::string>> parse_content(const ojson& m, std::size_t index) {
  const std::string where = "message " + std::to_string(index);
  const auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_array()) {
    std::string joined;
    for (const auto& part : *it) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        return unsupported(where + ": only content parts of type \"text\" are supported, got " +
                           (part.is_object() && part.contains("type") && part["type"].is_string()
                                ? "type \"" + part["type"].get<std::string>().substr(0, 64) + "\""
                                : std::string("a ") + part.type_name()));
      }
      joined += part["text"].get<std::string>();
    }
    return std::optional<std::string>(std::move(joined));
  }
  return invalid_argument(where + ": 'content' must be a string, null or a list of text parts");
}

// Moves what it keeps out of `t`: a tool call's arguments are client JSON and are never copied.
Expected<ChatToolCall> parse_tool_call(ojson& t, const std::string& where) {
  if (!t.is_object()) return invalid_argument(where + ": a tool call must be an object");
  ChatToolCall call;
  if (const auto id = t.find("id"); id != t.end() && id->is_string())
    call.id = id->get<std::string>();
  if (t.contains("type")) {
    if (!t["type"].is_string())
      return invalid_argument(where + ": tool call 'type' must be a string");
    call.type = t["type"].get<std::string>();
  }
  // OpenAI nests name/arguments under "function"; accept them at the top level too.
  ojson& f = t.contains("function") && t["function"].is_object() ? t["function"] : t;
  if (!f.contains("name") || !f["name"].is_string())
    return invalid_argument(where + ": tool call has no function name");
  call.name = f["name"].get<std::string>();
  if (f.contains("arguments")) {
    call.arguments = std::move(f["arguments"]);
    if (!call.arguments.is_string() && !call.arguments.is_object()) {
      return invalid_argument(where + ": tool call arguments must be a JSON string or an object");
    }
  } else {
    call.arguments = "{}";
  }
  return call;
}

}  // namespace

Expected<ChatRequest> parse_chat_messages(ojson messages, ojson tools) {
  ChatRequest req;
  if (!tools.is_null()) {
    if (!tools.is_array()) return invalid_argument("'tools' must be a list");
    req.tools = std::move(tools);
  }
  ojson* list = &messages;
  if (!list->is_array()) return invalid_argument("'messages' must be a list of messages");
  if (list->empty()) return invalid_argument("'messages' is empty");
  for (std::size_t i = 0; i < list->size(); ++i) {
    ojson& m = (*list)[i];
    const std::string where = "message " + std::to_string(i);
    if (!m.is_object()) return invalid_argument(where + ": not an object");
    ChatMessage msg;
    if (!m.contains("role") || !m["role"].is_string())
      return invalid_argument(where + ": 'role' is missing or not a string");
    msg.role = m["role"].get<std::string>();
    // OpenAI's newer name for the system role; the templates know only "system".
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool") {
      return invalid_argument(where + ": unknown role '" + msg.role +
                              "' (system, user, assistant or tool)");
    }
    auto content = parse_content(m, i);
    if (!content.ok()) return content.status();
    msg.content = std::move(*content);
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      if (!m["reasoning_content"].is_string())
        return invalid_argument(where + ": 'reasoning_content' must be a string");
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array())
        return invalid_argument(where + ": 'tool_calls' must be a list");
      for (std::size_t k = 0; k < m["tool_calls"].size(); ++k) {
        auto call = parse_tool_call(m["tool_calls"][k], where + " tool call " + std::to_string(k));
        if (!call.ok()) return call.status();
        msg.tool_calls.push_back(std::move(*call));
      }
    }
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string())
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    req.messages.push_back(std::move(msg));
  }
  return req;
}

Expected<ChatRequest> parse_chat_request(const ojson& j) {
  if (!j.is_object()) return parse_chat_messages(j, nullptr);
  if (!j.contains("messages")) return invalid_argument("the request has no 'messages'");
  return parse_chat_messages(j["messages"], j.contains("tools") ? j["tools"] : ojson());
}

Expected<ChatRequest> parse_chat_request_file(const std::string& path) {
  auto text = read_text_file(path);
  if (!text.ok()) return text.status();
  auto j = parse_ordered_json_bounded(*text);
  if (!j.ok()) return j.status().with_context(path);
  auto req = parse_chat_request(*j);
  if (!req.ok()) return req.status().with_context(path);
  return req;
}

std::string_view chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::kQwen:
      return "qwen";
    case ChatFamily::kDeepSeek:
      return "deepseek";
    case ChatFamily::kGlm:
      return "glm";
    case ChatFamily::kDeepSeekV4:
      return "deepseek_v4";
  }
  return "?";
}

Expected<ChatFamily> chat_family_from_name(std::string_view name) {
  if (name == "qwen") return ChatFamily::kQwen;
  if (name == "deepseek") return ChatFamily::kDeepSeek;
  if (name == "glm") return ChatFamily::kGlm;
  if (name == "deepseek_v4") return ChatFamily::kDeepSeekV4;
  return invalid_argument("unknown chat family '" + std::string(name) +
                          "' (qwen, deepseek, deepseek_v4 or glm)");
}

Expected<ChatFamily> detect_chat_family(const std::string& dir, const std::string& chat_template,
                                        const std::string& model_type) {
  std::string t = model_type;
  const std::string config = (std::filesystem::path(dir) / "config.json").string();
  if (t.empty() && std::filesystem::exists(config)) {
    auto reader = ConfigReader::from_file(config);
    if (!reader.ok()) return reader.status();
    auto type = read_model_type(reader->root(), config);
    if (type.ok()) t = *type;
  }
  if (t.rfind("qwen", 0) == 0) return ChatFamily::kQwen;
  if (t.rfind("deepseek_v4", 0) == 0) return ChatFamily::kDeepSeekV4;
  if (t.rfind("deepseek", 0) == 0) return ChatFamily::kDeepSeek;
  if (t.rfind("glm", 0) == 0) return ChatFamily::kGlm;
  if (chat_template.find("<|im_start|>") != std::string::npos) return ChatFamily::kQwen;
  if (chat_template.find("<\xEF\xBD\x9CUser\xEF\xBD\x9C>") != std::string::npos)
    return ChatFamily::kDeepSeek;
  if (chat_template.find("[gMASK]") != std::string::npos) return ChatFamily::kGlm;
  return unsupported(dir +
                     ": cannot tell the chat family (no config.json model_type, no known "
                     "template); pass --family");
}

Expected<std::string> render_chat(ChatFamily family, const ChatRequest& request,
                                  const ChatSpecialTokens& tokens) {
  switch (family) {
    case ChatFamily::kQwen:
      return render_qwen3(request);
    case ChatFamily::kDeepSeek:
      return render_deepseek_v3(request, tokens);
    case ChatFamily::kGlm:
      return render_glm(request);
    case ChatFamily::kDeepSeekV4:
      return render_deepseek_v4(request, tokens);
  }
  return internal_error("unknown chat family");
}

namespace {

void append_json_string(std::string& out, const std::string& s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// JavaScript's Number-to-string: integral values without a fraction, exponents as "1e+21".
void append_js_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[64];
  const double a = std::fabs(v);
  std::to_chars_result r{};
  if (a == 0 || (a >= 1e-6 && a < 1e21)) {
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
    out.append(buf, r.ptr);
    return;
  }
  r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  const auto e = s.find('e');
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  const char sign = exp[0] == '-' ? '-' : '+';
  exp = exp.substr(exp[0] == '-' || exp[0] == '+' ? 1 : 0);
  exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
  out += mant + "e" + sign + exp;
}

void append_json(std::string& out, const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null:
      out += "null";
      break;
    case ojson::value_t::boolean:
      out += j.get<bool>() ? "true" : "false";
      break;
    case ojson::value_t::number_integer:
      out += std::to_string(j.get<std::int64_t>());
      break;
    case ojson::value_t::number_unsigned:
      out += std::to_string(j.get<std::uint64_t>());
      break;
    case ojson::value_t::number_float:
      append_js_number(out, j.get<double>());
      break;
    case ojson::value_t::string:
      append_json_string(out, j.get_ref<const std::string&>());
      break;
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : j) {
        if (!first) out += ", ";
        first = false;
        append_json(out, e);
      }
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, it.key());
        out += ": ";
        append_json(out, it.value());
      }
      out += '}';
      break;
    }
    default:
      out += "null";
      break;
  }
}

}  // namespace

std::string to_json_text(const ojson& j) {
  std::string out;
  append_json(out, j);
  return out;
}

}  // namespace fs
