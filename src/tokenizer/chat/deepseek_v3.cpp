// The DeepSeek V3 chat template, as in DeepSeek V3's tokenizer_config.json, quirks included:
// its flags is_first (a tool-call block was opened) and is_output_first (a tool-output block was
// opened) are never reset, so a second tool-calling turn continues rather than reopens the
// block, and an assistant turn with content drops its tool calls. The template has no thinking
// switch; enable_thinking is ignored.
#include <string>

#include "tokenizer/chat/chat.h"

namespace fs {
namespace {

// DeepSeek's special tokens use a full-width bar (U+FF5C) and U+2581 in place of spaces.
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kOutputEnd = "<｜tool▁output▁end｜>";

std::string arguments_text(const ChatToolCall& call) {
  return call.arguments.is_string() ? call.arguments.get<std::string>()
                                    : to_json_text(call.arguments);
}

void append_call(std::string& out, const ChatToolCall& call) {
  append_all(out, {kCallBegin, call.type, kSep, call.name, "\n```json\n", arguments_text(call),
                   "\n```", kCallEnd});
}

}  // namespace

Expected<std::string> render_deepseek_v3(const ChatRequest& request,
                                         const ChatSpecialTokens& tokens) {
  std::string system;
  bool first_system = true;
  for (const ChatMessage& m : request.messages) {
    if (m.role != "system") continue;
    if (!first_system) system += "\n\n";
    system += m.text();
    first_system = false;
  }
  std::string out = tokens.bos + system;
  bool calls_opened = false, in_tool = false, first_output = true;
  for (const ChatMessage& m : request.messages) {
    if (m.role == "user") {
      in_tool = false;
      append_all(out, {kUser, m.text()});
    } else if (m.role == "assistant" && !m.content) {
      in_tool = false;
      for (const ChatToolCall& call : m.tool_calls) {
        if (!calls_opened) {
          append_all(out, {kAssistant, kCallsBegin});
          append_call(out, call);
          calls_opened = true;
        } else {
          out += "\n";
          append_call(out, call);
          append_all(out, {kCallsEnd, kEos});
        }
      }
    } else if (m.role == "assistant") {
      if (in_tool) {
        append_all(out, {kOutputsEnd, *m.content, kEos});
        in_tool = false;
      } else {
        append_all(out, {kAssistant, *m.content, kEos});
      }
    } else if (m.role == "tool") {
      in_tool = true;
      if (first_output) {
        append_all(out, {kOutputsBegin, kOutputBegin, m.text(), kOutputEnd});
        first_output = false;
      } else {
        append_all(out, {"\n", kOutputBegin, m.text(), kOutputEnd});
      }
    }
  }
  if (in_tool) out += kOutputsEnd;
  if (request.add_generation_prompt && !in_tool) out += kAssistant;
  return out;
}

}  // namespace fs
