// The Qwen3 chat template (ChatML with <think> blocks and <tool_call> JSON), as in Qwen3's
// tokenizer_config.json. Each branch below mirrors one branch of that template.
//
// The template's strip('\n')/lstrip('\n')/rstrip('\n') are rendered as the reference Jinja
// renders them, which ignores the argument and trims all JavaScript whitespace (see
// docs/ARCHITECTURE.md); utf8::trim* do exactly that.
#include <string>

#include "tokenizer/chat/chat.h"
#include "tokenizer/utf8.h"

namespace fs {
namespace {

constexpr std::string_view kToolsPreamble =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kToolsPostamble =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// A user turn that only wraps tool output does not count as the user's latest query.
bool is_tool_response_wrapper(const std::string& c) {
  return starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>");
}

}  // namespace

Expected<std::string> render_qwen3(const ChatRequest& request) {
  const auto& msgs = request.messages;
  if (msgs.empty()) return invalid_argument("no messages to render");
  const std::size_t n = msgs.size();
  std::string out;
  if (!request.tools.empty()) {
    out += "<|im_start|>system\n";
    if (msgs[0].role == "system") append_all(out, {msgs[0].text(), "\n\n"});
    out += kToolsPreamble;
    for (const auto& tool : request.tools) {
      out += "\n";
      out += to_json_text(tool);
    }
    out += kToolsPostamble;
  } else if (msgs[0].role == "system") {
    append_all(out, {"<|im_start|>system\n", msgs[0].text(), "<|im_end|>\n"});
  }

  // The latest real user query: thinking is shown only for assistant turns after it.
  std::size_t last_query = n - 1;
  for (std::size_t k = n; k-- > 0;) {
    if (msgs[k].role == "user" && !is_tool_response_wrapper(msgs[k].text())) {
      last_query = k;
      break;
    }
  }

  for (std::size_t i = 0; i < n; ++i) {
    const ChatMessage& m = msgs[i];
    const bool last = i + 1 == n;
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      append_all(out, {"<|im_start|>", m.role, "\n", m.text(), "<|im_end|>\n"});
    } else if (m.role == "assistant") {
      std::string content = m.text();
      std::string reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (const auto close = content.find("</think>"); close != std::string::npos) {
        // Reasoning inlined as <think>...</think>: split it out of the content.
        const std::string before = content.substr(0, close);
        const std::string after = content.substr(content.rfind("</think>") + 8);
        const std::string_view head = utf8::trim_end(before);
        const auto open = head.rfind("<think>");
        reasoning = std::string(
            utf8::trim_start(open == std::string_view::npos ? head : head.substr(open + 7)));
        content = std::string(utf8::trim_start(after));
      }
      if (i > last_query && (last || !reasoning.empty())) {
        append_all(out, {"<|im_start|>assistant\n<think>\n", utf8::trim(reasoning),
                         "\n</think>\n\n", utf8::trim_start(content)});
      } else {
        append_all(out, {"<|im_start|>assistant\n", content});
      }
      for (std::size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ChatToolCall& call = m.tool_calls[k];
        if (k > 0 || !content.empty()) out += "\n";
        append_all(out, {"<tool_call>\n{\"name\": \"", call.name, "\", \"arguments\": "});
        out += call.arguments.is_string() ? call.arguments.get<std::string>()
                                          : to_json_text(call.arguments);
        out += "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      // Consecutive tool results share one user turn.
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      append_all(out, {"\n<tool_response>\n", m.text(), "\n</tool_response>"});
      if (last || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (request.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (request.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace fs
