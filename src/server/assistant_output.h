// The glue between a turn's generated text and the APIs' assistant messages, shared by every
// chat API (chat/completions, messages, responses): the family's output parser splits the text
// into reasoning, visible text and tool calls; stop sequences are matched on the visible text;
// and everything emitted is accumulated into the whole message. It runs on the engine worker, so
// a stop sequence ends the turn like a stop token (the turn is banked), and the HTTP threads
// receive events they only have to format.
//
// Also here: how a request's tool_choice shapes the prompt (forcing a call by starting the
// assistant turn with the family's call prefix), since the output must start with that prefix.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/request.h"
#include "server/stop_matcher.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/chat/output_parser.h"

namespace fs::server {

struct AssistantOutputOptions {
  // false: plain text, nothing parsed (/v1/completions); stop sequences then apply to all of it.
  bool parse = true;
  OutputParserOptions parser;
  // Output the prompt already holds (a forced call's opening): parsed as if generated, first.
  std::string forced_prefix;
  // Stop sequences, matched on the visible text only (not in reasoning or tool-call arguments,
  // where a match would cut a call in half).
  std::vector<std::string> stop;
  // 1: the turn ends once its first call is complete (parallel_tool_calls: false,
  // disable_parallel_tool_use); 0: no limit.
  int max_tool_calls = 0;
};

class AssistantOutput {
 public:
  explicit AssistantOutput(AssistantOutputOptions options);

  // The events that the generated `text` makes certain, in order; after a stop sequence matched,
  // nothing more.
  std::vector<OutputEvent> feed(std::string_view text);
  // The end of generation: what was held back is released (see ChatOutputParser::finish).
  std::vector<OutputEvent> finish();

  // A stop sequence matched, or the last allowed call completed: the turn ends here.
  bool stopped() const { return stops_.stopped() || calls_done_; }
  // The last output was reasoning (a think block is open, as far as the events show).
  bool in_reasoning() const { return in_reasoning_; }
  const std::string& stop_sequence() const { return stops_.matched(); }
  // Everything emitted so far, as one message.
  const ParsedOutput& message() const { return message_; }

 private:
  void absorb(std::vector<OutputEvent> in, std::vector<OutputEvent>& out);
  void emit_text(std::string text, std::vector<OutputEvent>& out);

  AssistantOutputOptions options_;
  ChatOutputParser parser_;
  StopMatcher stops_;
  ParsedOutput message_;
  std::vector<OutputEvent> pending_;  // the forced prefix's events, returned by the first feed
  bool calls_done_ = false;
  bool in_reasoning_ = false;
};

// The text that opens a tool call in `family`'s output format, as its template writes an assistant
// tool call, up to and including the name when `name` is not empty (then the arguments follow).
std::string tool_call_prefix(ChatFamily family, std::string_view name);
// What the output parser is fed for a forced call: the opening and, where the family's syntax
// does not close the name (GLM's runs up to a newline or the next tag), a newline that closes
// it, so that a call forced by name keeps that name whatever the model writes next. The prompt
// gets tool_call_prefix alone.
std::string forced_call_feed(ChatFamily family, std::string_view name);

// The parts of a turn that depend on the request's tools and thinking: what to append to the
// rendered prompt and how to read the output. `rendered` is the prompt as rendered.
struct OutputPlan {
  std::string prompt_suffix;  // appended to the prompt (a forced call's opening)
  AssistantOutputOptions output;
  // What closes a think block in the family's format, as its template writes it (empty: the
  // family has no thinking switch); a reasoning budget writes it when the budget is spent.
  std::string reasoning_close;
};
// A forced call (tool_choice required/function) opens right after the generation prompt, so the
// model does not think first; the thinking setting is left alone, since switching it off would
// change the prompt where the next turn's does not (an empty think block) and cost the warm prefix.
OutputPlan plan_output(ChatFamily family, const GenerationRequest& request,
                       std::string_view rendered);

}  // namespace fs::server
