// The GLM 5.3 Flash chat template (zai-org/GLM-5.3-Flash chat_template.jinja, rendered by HF with
// trim_blocks and lstrip_blocks), branch by branch:
//
//   [gMASK]<sop><|system|>Reasoning Effort: Max[<|system|>\n# Tools ...]<|system|>SYSTEM
//   <|user|>USER<|assistant|><think>REASONING</think>REPLY<tool_call>NAME<arg_key>K</arg_key>
//   <arg_value>V</arg_value></tool_call><|observation|><tool_response>R</tool_response>...
//   <|assistant|><think>
//
// (one line in the prompt; broken here for reading). No end token between turns: the next role
// token ends a turn. The reasoning effort is "Low" or "High" when the client asks for low or high
// and "Max" otherwise (the template's rule). Every assistant turn keeps its reasoning
// (clear_thinking defaults to false in the template): reasoning_content, else what the content
// has before </think>; a turn without either gets an empty <think></think>. A tool's schema is
// its `function` object without `defer_loading` and `strict`; a tool marked defer_loading is left
// out. Arguments are written one <arg_key>/<arg_value> pair each, strings as they are and other
// values as JSON.
//
// Thinking off: the 5.3 template always opens <think> in the generation prompt (it reads no
// enable_thinking); with enable_thinking false this writes GLM 5.2's empty block
// "<|assistant|><think></think>" instead, which the 5.x models are trained to answer directly.
#include <string>

#include "format/json_parse.h"
#include "tokenizer/chat/chat.h"

namespace fs {
namespace {

constexpr std::string_view kToolsHeader =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr std::string_view kToolsFooter =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>"
    "{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>"
    "...</tool_call>";

// Python's str.strip() with no argument: ASCII whitespace and the other Unicode spaces are rare
// in chat content; the ASCII set is what matters here.
std::string_view py_strip(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\v\f";
  const auto b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

std::string effort_line(const std::optional<std::string>& effort) {
  if (effort == "low") return "<|system|>Reasoning Effort: Low";
  if (effort == "high") return "<|system|>Reasoning Effort: High";
  return "<|system|>Reasoning Effort: Max";
}

void append_tools(std::string& out, const nlohmann::ordered_json& tools) {
  out += kToolsHeader;
  for (const auto& entry : tools) {
    const nlohmann::ordered_json& tool =
        entry.is_object() && entry.contains("function") ? entry["function"] : entry;
    if (!tool.is_object()) continue;
    if (const auto d = tool.find("defer_loading");
        d != tool.end() && d->is_boolean() && d->get<bool>()) {
      continue;
    }
    out += '{';
    bool first = true;
    for (auto it = tool.begin(); it != tool.end(); ++it) {
      if (it.key() == "defer_loading" || it.key() == "strict") continue;
      if (!first) out += ", ";
      first = false;
      append_all(out, {"\"", it.key(), "\": ", to_json_text(it.value())});
    }
    out += "}\n";
  }
  out += kToolsFooter;
}

void append_tool_call(std::string& out, const ChatToolCall& call) {
  append_all(out, {"<tool_call>", call.name});
  // Arguments sent as a JSON string are parsed (bounded: they come from the client); an object is
  // read in place. The template iterates a mapping; anything else becomes one value.
  nlohmann::ordered_json parsed;
  if (call.arguments.is_string()) {
    auto p = parse_ordered_json_bounded(call.arguments.get_ref<const std::string&>());
    if (p.ok()) parsed = std::move(*p);
  }
  const nlohmann::ordered_json& args = call.arguments.is_string() ? parsed : call.arguments;
  if (args.is_object()) {
    for (auto it = args.begin(); it != args.end(); ++it) {
      append_all(out, {"<arg_key>", it.key(), "</arg_key><arg_value>"});
      out += it.value().is_string() ? it.value().get<std::string>() : to_json_text(it.value());
      out += "</arg_value>";
    }
  } else {
    append_all(out, {"<arg_value>", call.arguments.get_ref<const std::string&>(), "</arg_value>"});
  }
  out += "</tool_call>";
}

void append_assistant(std::string& out, const ChatMessage& m) {
  std::string content = m.text();
  std::optional<std::string> reasoning = m.reasoning_content;
  if (!reasoning) {
    if (const auto close = content.find("</think>"); close != std::string::npos) {
      // content.split('</think>')[0].split('<think>')[-1], and the last piece after </think>.
      const std::string head = content.substr(0, close);
      const auto open = head.rfind("<think>");
      reasoning = open == std::string::npos ? head : head.substr(open + 7);
      content = content.substr(content.rfind("</think>") + 8);
    }
  }
  append_all(out, {"<|assistant|><think>", reasoning.value_or(""), "</think>", py_strip(content)});
  for (const ChatToolCall& call : m.tool_calls) append_tool_call(out, call);
}

}  // namespace

Expected<std::string> render_glm(const ChatRequest& request) {
  if (request.messages.empty()) return invalid_argument("no messages to render");
  std::string out = "[gMASK]<sop>";
  out += effort_line(request.reasoning_effort);
  if (!request.tools.empty()) append_tools(out, request.tools);
  for (const ChatMessage& m : request.messages) {
    if (m.role == "system") {
      append_all(out, {"<|system|>", m.text()});
    } else if (m.role == "user") {
      append_all(out, {"<|user|>", m.text()});
    } else if (m.role == "assistant") {
      append_assistant(out, m);
    } else if (m.role == "tool") {
      append_all(out, {"<|observation|><tool_response>", m.text(), "</tool_response>"});
    }
  }
  if (request.add_generation_prompt)
    out +=
        request.enable_thinking == false ? "<|assistant|><think></think>" : "<|assistant|><think>";
  return out;
}

}  // namespace fs
