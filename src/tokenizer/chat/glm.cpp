// GLM chat format: BEST EFFORT, not checked against a reference template. No GLM template is
// published on the npm registry (the only source of reference templates these tests may use),
// so this follows the documented GLM-4.5 conversation format: "[gMASK]<sop>", role markers
// <|system|> <|user|> <|assistant|> <|observation|>, a <think>...</think> block on assistant
// turns after the last user query (empty otherwise), tool calls as
// <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call> with one key/value
// pair per line, tool results as <tool_response> blocks, and "/nothink" plus an empty think
// block when thinking is off. Replace it with a byte-checked renderer once the real GLM 5.3
// template is available.
#include <string>

#include "tokenizer/chat/chat.h"

#include "format/json_parse.h"
#include "tokenizer/utf8.h"

namespace fs {
namespace {

constexpr std::string_view kToolsHeader =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr std::string_view kToolsFooter =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML "
    "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</"
    "arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>";

void append_tool_call(std::string& out, const ChatToolCall& call) {
  append_all(out, {"\n<tool_call>", call.name});
  // Arguments sent as a JSON string are parsed (bounded: they come from the client); an object is
  // read in place.
  nlohmann::ordered_json parsed;
  if (call.arguments.is_string()) {
    auto p = parse_ordered_json_bounded(call.arguments.get_ref<const std::string&>());
    if (p.ok()) parsed = std::move(*p);
  }
  const nlohmann::ordered_json& args = call.arguments.is_string() ? parsed : call.arguments;
  if (args.is_object()) {
    for (auto it = args.begin(); it != args.end(); ++it) {
      append_all(out, {"\n<arg_key>", it.key(), "</arg_key>\n<arg_value>"});
      out += it.value().is_string() ? it.value().get<std::string>() : to_json_text(it.value());
      out += "</arg_value>";
    }
  } else {
    // Arguments that are not a JSON object are passed through as one value.
    append_all(out,
               {"\n<arg_value>", call.arguments.get_ref<const std::string&>(), "</arg_value>"});
  }
  out += "\n</tool_call>";
}

}  // namespace

Expected<std::string> render_glm(const ChatRequest& request) {
  const auto& msgs = request.messages;
  if (msgs.empty()) return invalid_argument("no messages to render");
  const bool thinking_off = request.enable_thinking == false;
  std::string out = "[gMASK]<sop>";
  if (!request.tools.empty()) {
    out += kToolsHeader;
    for (const auto& tool : request.tools) out += to_json_text(tool) + "\n";
    out += kToolsFooter;
  }
  std::size_t last_user = 0;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    if (msgs[i].role == "user") last_user = i;
  }
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      append_all(out, {"<|system|>\n", m.text()});
    } else if (m.role == "user") {
      append_all(out, {"<|user|>\n", m.text()});
      if (thinking_off && !m.text().ends_with("/nothink")) out += "/nothink";
    } else if (m.role == "assistant") {
      std::string content = m.text();
      std::string reasoning = m.reasoning_content.value_or("");
      if (!m.reasoning_content) {
        if (const auto close = content.find("</think>"); close != std::string::npos) {
          const std::string head = content.substr(0, close);
          const auto open = head.rfind("<think>");
          reasoning = open == std::string::npos ? head : head.substr(open + 7);
          content = content.substr(content.rfind("</think>") + 8);
        }
      }
      out += "<|assistant|>";
      const std::string_view r = utf8::trim(reasoning);
      append_all(out, {"\n<think>", i > last_user ? r : std::string_view(), "</think>"});
      if (const std::string_view c = utf8::trim(content); !c.empty()) append_all(out, {"\n", c});
      for (const ChatToolCall& call : m.tool_calls) append_tool_call(out, call);
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|observation|>";
      append_all(out, {"\n<tool_response>\n", m.text(), "\n</tool_response>"});
    }
  }
  if (request.add_generation_prompt) {
    out += "<|assistant|>";
    if (thinking_off) out += "\n<think></think>";
  }
  return out;
}

}  // namespace fs
