// The DeepSeek V4 chat format. DeepSeek ships no Jinja template for V4 (nor for V3.2): the
// release's encoding/encoding_dsv4.py builds the prompt in Python, and this file follows it:
//
//   <bos>SYSTEM[\n\n## Tools ...]<｜User｜>USER<｜Assistant｜></think>REPLY<eos><｜User｜>...
//
// - Thinking on (thinking_mode "thinking"): a user turn that the model answers next ends with
//   <｜Assistant｜><think>; thinking off ("chat"): with <｜Assistant｜></think>. Without tools,
//   assistant turns before the last user turn lose their reasoning and are opened with </think>
//   ("drop_thinking"); with tools every turn keeps it (REASONING</think>REPLY).
// - Tool results are no role of their own: consecutive tool and user messages merge into one user
//   turn, each result as <tool_result>...</tool_result>, the blocks joined by "\n\n", the
//   results put in the order of the calls they answer.
// - Tool calls are DSML (see tool_calls_deepseek.cpp), after "\n\n" at the end of the reply.
// - The tools' schemas go into the system prompt after "\n\n"; OpenAI's top-level `tools` are
//   attached to the first system message, or to an empty one put first (as the inference
//   servers do when they call the encoder).
// Not rendered: the reasoning-effort preambles (the published encodings disagree on their text
// and levels), the task and latest_reminder roles (no API field maps to them). Thinking is off
// unless asked for (enable_thinking nullopt = chat mode, DeepSeek's API default).
#include <algorithm>
#include <string>
#include <vector>

#include "format/json_parse.h"
#include "tokenizer/chat/chat.h"

namespace fs {
namespace {

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";

constexpr std::string_view kToolsHead =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";

// One turn after the merge of tool results into user turns.
struct Turn {
  const ChatMessage* message = nullptr;  // system and assistant turns
  std::string role;
  bool tools = false;  // the system turn that carries the tool schemas
  struct Block {
    bool tool_result = false;
    std::string text;
    std::string call_id;
  };
  std::vector<Block> blocks;  // user turns: their texts and tool results, in order
};

std::string tools_text(const nlohmann::ordered_json& tools) {
  std::string out(kToolsHead);
  bool first = true;
  for (const auto& tool : tools) {
    if (!first) out += "\n";
    first = false;
    out += to_json_text(tool.is_object() && tool.contains("function") ? tool["function"] : tool);
  }
  out += kToolsTail;
  return out;
}

// Arguments are a JSON object (as text or as an object); anything else is passed on as one
// parameter named "arguments", as the inference servers' adapters do.
nlohmann::ordered_json arguments_object(const ChatToolCall& call) {
  if (call.arguments.is_object()) return call.arguments;
  const std::string& text = call.arguments.get_ref<const std::string&>();
  auto parsed = parse_ordered_json_bounded(text);
  if (parsed.ok() && parsed->is_object()) return std::move(*parsed);
  return nlohmann::ordered_json{{"arguments", text}};
}

void append_calls(std::string& out, const std::vector<ChatToolCall>& calls) {
  if (calls.empty()) return;
  append_all(out, {"\n\n<", kDsml, "tool_calls>\n"});
  for (std::size_t k = 0; k < calls.size(); ++k) {
    if (k > 0) out += "\n";
    append_all(out, {"<", kDsml, "invoke name=\"", calls[k].name, "\">\n"});
    const nlohmann::ordered_json args = arguments_object(calls[k]);
    bool first = true;
    for (auto it = args.begin(); it != args.end(); ++it) {
      if (!first) out += "\n";
      first = false;
      const bool is_string = it.value().is_string();
      append_all(out, {"<", kDsml, "parameter name=\"", it.key(), "\" string=\"",
                       is_string ? "true" : "false", "\">"});
      out += is_string ? it.value().get<std::string>() : to_json_text(it.value());
      append_all(out, {"</", kDsml, "parameter>"});
    }
    append_all(out, {"\n</", kDsml, "invoke>"});
  }
  append_all(out, {"\n</", kDsml, "tool_calls>"});
}

// Merges consecutive user and tool messages into user turns and attaches the tools to a system
// turn.
std::vector<Turn> merge_turns(const ChatRequest& request) {
  std::vector<Turn> turns;
  const bool have_tools = !request.tools.empty();
  bool tools_placed = false;
  if (have_tools && (request.messages.empty() || request.messages[0].role != "system")) {
    Turn t;
    t.role = "system";
    t.tools = true;
    turns.push_back(std::move(t));
    tools_placed = true;
  }
  for (const ChatMessage& m : request.messages) {
    if (m.role == "tool" || m.role == "user") {
      if (turns.empty() || turns.back().role != "user") {
        Turn t;
        t.role = "user";
        turns.push_back(std::move(t));
      }
      turns.back().blocks.push_back({m.role == "tool", m.text(), m.tool_call_id});
      continue;
    }
    Turn t;
    t.message = &m;
    t.role = m.role;
    if (m.role == "system" && have_tools && !tools_placed) {
      t.tools = true;
      tools_placed = true;
    }
    turns.push_back(std::move(t));
  }
  // Results in the order of the calls they answer, in the slots the results had (a result with
  // no known id after the known ones).
  std::vector<std::string> ids;
  for (Turn& t : turns) {
    if (t.role == "assistant") {
      ids.clear();
      for (const ChatToolCall& c : t.message->tool_calls) ids.push_back(c.id);
      continue;
    }
    if (t.role != "user" || ids.empty()) continue;
    auto rank = [&](const Turn::Block& b) {
      const auto it = std::find(ids.begin(), ids.end(), b.call_id);
      return b.call_id.empty() || it == ids.end() ? ids.size()
                                                  : static_cast<std::size_t>(it - ids.begin());
    };
    std::vector<Turn::Block> results;
    for (const Turn::Block& b : t.blocks)
      if (b.tool_result) results.push_back(b);
    std::stable_sort(results.begin(), results.end(),
                     [&](const Turn::Block& a, const Turn::Block& b) { return rank(a) < rank(b); });
    std::size_t next = 0;
    for (Turn::Block& b : t.blocks)
      if (b.tool_result) b = results[next++];
    ids.clear();
  }
  return turns;
}

}  // namespace

Expected<std::string> render_deepseek_v4(const ChatRequest& request,
                                         const ChatSpecialTokens& tokens) {
  if (request.messages.empty()) return invalid_argument("no messages to render");
  const bool thinking = request.enable_thinking.value_or(false);
  const bool drop_thinking = request.tools.empty();
  const std::vector<Turn> turns = merge_turns(request);
  std::size_t last_user = 0;
  bool any_user = false;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    if (turns[i].role == "user") {
      last_user = i;
      any_user = true;
    }
  }
  std::string out = tokens.bos.empty() ? "<｜begin▁of▁sentence｜>" : tokens.bos;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    if (t.role == "system") {
      if (t.message) out += t.message->text();
      if (t.tools) append_all(out, {"\n\n", tools_text(request.tools)});
    } else if (t.role == "user") {
      out += kUser;
      for (std::size_t k = 0; k < t.blocks.size(); ++k) {
        if (k > 0) out += "\n\n";
        const Turn::Block& b = t.blocks[k];
        if (b.tool_result) {
          append_all(out, {"<tool_result>", b.text, "</tool_result>"});
        } else {
          out += b.text;
        }
      }
    } else if (t.role == "assistant") {
      const ChatMessage& m = *t.message;
      if (thinking && (!drop_thinking || !any_user || i > last_user))
        append_all(out, {m.reasoning_content.value_or(""), kThinkClose});
      out += m.text();
      append_calls(out, m.tool_calls);
      out += kEos;
    }
    // A user turn the model answers next opens the assistant's turn.
    const bool last = i + 1 == turns.size();
    if (t.role != "user") continue;
    if (last ? !request.add_generation_prompt : turns[i + 1].role != "assistant") continue;
    out += kAssistant;
    out += thinking && (!drop_thinking || i >= last_user) ? kThinkOpen : kThinkClose;
  }
  return out;
}

}  // namespace fs
