// The model's generated text split back into what the chat APIs report: reasoning (<think>),
// visible text, and tool calls, in each family's own syntax. The inverse of the renderers in
// chat.h: whatever render_chat writes for an assistant turn, this parser reads back.
//
// Syntaxes (the readers in tool_calls_*.cpp document each in full):
//   Qwen3 (qwen3.cpp):  <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>
//   Qwen3-Coder:        <tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n...
//                       </function>\n</tool_call>
//   DeepSeek V3 (deepseek_v3.cpp):
//       <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```
//       <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   DeepSeek V3.1, in the same block:  <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//   DeepSeek V4 (V3.2 spells the block function_calls):
//       <｜DSML｜tool_calls><｜DSML｜invoke name="N">
//       <｜DSML｜parameter name="P" string="true|false">V</｜DSML｜parameter>...
//       </｜DSML｜invoke></｜DSML｜tool_calls>
//   GLM (glm.cpp):  <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>
// and for all three <think>...</think>, recognised before any visible text (or from the start
// when the prompt opened it: starts_in_reasoning). A <tool_call> inside reasoning is reasoning.
// Arguments are JSON object text: the JSON syntaxes pass the model's object on as written (raw
// control characters inside strings escaped); the XML-like ones build an object, a value being
// JSON when it parses as a JSON number, boolean, null, object or array and a string otherwise
// (DSML's string="true" is always a string).
//
// Whitespace the templates write around tags is not content: (ASCII) whitespace after <think>,
// after </think>, at the start of the output and after a block of calls is dropped, as is
// whitespace before </think> and the newlines a template writes before a call's opening tag (up
// to two for Qwen and DSML, one for GLM).
//
// Incremental: feed() takes text as the stream decoder releases it (any split point, inside a
// tag, a special token or a multi-byte character included) and returns the events that are
// certain so far. Held back are only: what may still be the start of a tag, a call until it
// commits (below), an XML-like parameter until its closing tag, the whitespace above, and the
// end of a piece that would split a UTF-8 character; everything else is released at once. The
// events of any split, concatenated, equal those of the whole text (parse_chat_output), call
// ids apart. An empty DeepSeek/DSML block, which calls nothing, stays text.
//
// Malformed calls. A call commits when its name is known and its arguments have begun (JSON
// syntaxes: the arguments' '{'; XML-like ones: the name's tag): kToolCallBegin is sent and the
// arguments stream from then on. Before the commit nothing of the call is sent; if the text stops
// fitting the syntax, or the output ends, the opening tag and everything read with it are released
// as text, exactly as written, and parsing resumes at the first byte that did not fit (so a real
// call after a broken one is still found). After the commit the call stays a call: when the text
// stops fitting or the output ends, the call ends with kToolCallEnd{complete = false} unless its
// arguments were already whole (then complete = true, e.g. output cut just before </tool_call>).
// Its arguments are what was streamed: for the JSON syntaxes the valid beginning of the object
// (possibly unfinished, as an OpenAI call cut by max_tokens is), for the XML-like ones the
// parameters that were complete, closed into an object. The syntax read since the last event
// (a parameter without its closing tag, a partial close tag) is released as text, and parsing
// resumes at the first byte that did not fit. Nothing is duplicated, and nothing but the tags
// and separators of the calls that were accepted is dropped.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat/chat.h"

namespace fs {

enum class OutputEventKind {
  kText,               // visible content
  kReasoning,          // inside <think>...</think>
  kToolCallBegin,      // a call's name is known: index, id, name
  kToolCallArguments,  // the next piece of the call's arguments (JSON object text); index
  kToolCallEnd,        // the call is complete; arguments concatenated form one JSON object
};

struct OutputEvent {
  OutputEventKind kind = OutputEventKind::kText;
  std::string text;  // kText, kReasoning, kToolCallArguments
  int index = -1;    // tool calls: 0, 1, ... in order of appearance within this output
  std::string id;    // kToolCallBegin: "call_" + random hex, unique per call
  std::string name;  // kToolCallBegin
  // kToolCallEnd: false when the call was cut off or broke after it began streaming (see
  // "Malformed calls" at the top): its arguments are what was streamed, which for the JSON
  // syntaxes may be an unfinished object. Added for the API layers, which may report such a call
  // as truncated; the other fields are unchanged.
  bool complete = true;
};

struct OutputParserOptions {
  ChatFamily family = ChatFamily::kQwen;
  // The prompt already opened a <think> block (a template that ends its generation prompt with
  // "<think>\n"): the output starts as reasoning.
  bool starts_in_reasoning = false;
  // Whether to look for tool calls at all (a request without tools gets plain text).
  bool parse_tool_calls = true;
  // Whether to split <think> sections out as reasoning (false: they stay in the text).
  bool parse_reasoning = true;
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(OutputParserOptions options);
  ~ChatOutputParser();
  ChatOutputParser(ChatOutputParser&&) noexcept;
  ChatOutputParser& operator=(ChatOutputParser&&) noexcept;

  // The events that `text` makes certain, in order. Adjacent pieces of the same kind may be
  // merged.
  std::vector<OutputEvent> feed(std::string_view text);
  // The end of the output: whatever was held back is released (a call not yet committed as
  // text, an open call ended as above, an unclosed <think> as reasoning). Later calls of either
  // return nothing.
  std::vector<OutputEvent> finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A whole output at once: the assistant message the APIs return (content, reasoning_content,
// tool_calls with arguments as JSON text).
struct ParsedOutput {
  std::string content;
  std::string reasoning;
  struct Call {
    std::string id, name, arguments;
    bool complete = true;  // as OutputEvent::complete (added with it)
  };
  std::vector<Call> tool_calls;
};
ParsedOutput parse_chat_output(std::string_view text, const OutputParserOptions& options);

// Whether a rendered prompt leaves a <think> block open for the output (it ends with <think> and
// maybe whitespace, as generation prompts that start the model thinking do), so that the output
// starts as reasoning: OutputParserOptions::starts_in_reasoning. A <think> earlier in the prompt
// (quoted by a user, say) does not count. Added so that each API layer need not look for itself.
bool prompt_opens_reasoning(std::string_view prompt);

}  // namespace fs
