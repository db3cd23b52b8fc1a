// The model's generated text split back into what the chat APIs report: reasoning (<think>),
// visible text, and tool calls, in each family's own syntax. The inverse of the renderers in
// chat.h: whatever render_chat writes for an assistant turn, this parser reads back.
//
// Incremental: feed() takes text as the stream decoder releases it (any split point, inside a
// tag or a multi-byte character included) and returns the events that are certain so far; a
// piece that may still be the start of a tag is held back until the next feed() or finish().
// Nothing is ever lost: a tool call that turns out malformed (bad JSON, a missing close tag at
// the end of the text) is released as plain text.
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
  // "Malformed calls" below): its arguments are what was streamed, which for the JSON syntaxes
  // may be an unfinished object. Added for the API layers, which may report such a call as
  // truncated; the other fields are unchanged.
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
  // The end of the output: whatever was held back is released (an unfinished tool call as
  // text, an unclosed <think> as reasoning).
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

}  // namespace fs
