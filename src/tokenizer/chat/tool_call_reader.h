// The pieces the chat output parser (output_parser.cpp) shares with its per-family tool-call
// readers: the input a reader consumes, the events it emits, and the scanning helpers the XML-like
// syntaxes have in common. Internal to tokenizer/chat.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat/json_scanner.h"
#include "tokenizer/chat/output_parser.h"

namespace fs::chat_detail {

// The unread output as a reader sees it. Whatever a reader consumes is part of the call's syntax;
// the parser keeps the bytes consumed since the last emitted event (or sync()), so that a call
// that turns out malformed is released as the text it was.
class CallInput {
 public:
  // `consumed` collects what the reader consumes (the parser clears it on each event).
  CallInput(std::string_view rest, bool at_end, std::string& consumed)
      : rest_(rest), at_end_(at_end), consumed_(consumed) {}
  std::string_view rest() const { return rest_.substr(used_); }
  // No more output will come: a reader must decide (kDone or kFailed), never kNeedMore.
  bool at_end() const { return at_end_; }
  void consume(std::size_t n) {
    consumed_.append(rest_.substr(used_, n));
    used_ += n;
  }
  std::size_t used() const { return used_; }

 private:
  std::string_view rest_;
  bool at_end_;
  std::string& consumed_;
  std::size_t used_ = 0;
};

// Where readers send calls. begin() commits a call (from then on it is a call, not text);
// every event, and sync(), accepts the syntax consumed so far.
class CallOutput {
 public:
  virtual ~CallOutput() = default;
  virtual void begin(std::string name) = 0;
  virtual void arguments(std::string_view piece) = 0;
  virtual void end() = 0;
  virtual void sync() = 0;
  virtual bool call_open() const = 0;
};

enum class ReadResult {
  kNeedMore,  // everything readable was consumed; more output is needed
  kDone,      // the calls ended; the unread rest is ordinary output
  kFailed,    // the rest (from the first unconsumed byte) does not continue the syntax
};

// One family's tool-call syntax, constructed after its opening tag was read.
class ToolCallReader {
 public:
  virtual ~ToolCallReader() = default;
  virtual ReadResult read(CallInput& in, CallOutput& out) = 0;
  // The open call cannot go on (bad syntax, or the output ended inside it): emits what closes
  // its arguments, if anything can, and says whether the call was complete (its arguments whole).
  virtual bool abandon(CallOutput& out) = 0;
};

// A tag that opens tool calls in ordinary output, and the reader that follows it.
struct CallOpener {
  std::string_view tag;
  // Newlines the template writes before the tag, taken as part of it when present.
  int lead_newlines = 0;
  std::unique_ptr<ToolCallReader> (*make)() = nullptr;
};

std::vector<CallOpener> qwen_call_openers();
std::vector<CallOpener> deepseek_call_openers();
std::vector<CallOpener> glm_call_openers();

// ---- scanning helpers ----

enum class Match { kYes, kPartial, kNo };

// Whether `s` starts with `tag`: kPartial when `s` is a proper prefix of it (more may complete it).
Match starts_with_tag(std::string_view s, std::string_view tag);

bool is_ascii_space(char c);
// Consumes ASCII whitespace.
void skip_space(CallInput& in);
// Consumes `tag` when the input starts with it; kPartial consumes nothing.
Match take_tag(CallInput& in, std::string_view tag);
// Consumes input up to and including `tag`, appending what precedes it to `value`; holds back only
// a possible start of `tag`. True once `tag` was consumed.
//
// Readers fail at the first byte that cannot continue their syntax and consume nothing past it,
// so that where a call fails, and so what is text, does not depend on how the output was split.
bool take_until(CallInput& in, std::string_view tag, std::string& value);

// The same for several tags (each starting with '<'): consumes the value and, when `consume_tag`,
// the first tag found; returns its index, or -1 while none is complete.
int take_until_any(CallInput& in, std::initializer_list<std::string_view> tags, std::string& value,
                   bool consume_tag);

// Consumes a name up to `terminator` (consumed too), appending it to `name`. kNo, consuming
// nothing more, at a '<' or a newline (a tag cannot hold them) or past `max_bytes`.
Match take_name(CallInput& in, char terminator, std::string& name, std::size_t max_bytes = 256);
// The same, ended by `tag` instead of one character.
Match take_name_until(CallInput& in, std::string_view tag, std::string& name,
                      std::size_t max_bytes = 256);
// What a reader returns when the input ran out: more may come, unless the output ended.
inline ReadResult need_more(const CallInput& in) {
  return in.at_end() ? ReadResult::kFailed : ReadResult::kNeedMore;
}

// A JSON string literal for `s` (UTF-8 kept; invalid bytes replaced).
std::string json_quote(std::string_view s);
// An XML-style parameter value as JSON: the value itself when it is a JSON number, boolean,
// null, object or array, else a JSON string of it (the tool's schema is not known here).
std::string json_value_of(std::string_view value);

// A JSON arguments object written inline by the model, validated byte by byte and passed on as
// it is accepted (the syntaxes whose arguments are JSON text: Qwen's JSON form, DeepSeek's).
class ArgumentsStream {
 public:
  // Reads the object's bytes (the first must be '{'), sending accepted text to
  // out.arguments(). kDone once the object closed, kFailed at a byte that cannot continue it.
  ReadResult read(CallInput& in, CallOutput& out);
  bool started() const { return started_; }
  bool complete() const { return scanner_.done(); }

 private:
  JsonScanner scanner_;
  bool started_ = false;
};

}  // namespace fs::chat_detail
