// An incremental JSON syntax checker, one byte at a time: the output parser streams a tool call's
// arguments as the model writes them and must know, at each byte, whether the text so far can
// still be the start of a valid document, and where a value begins and ends. It builds nothing;
// nesting is bounded so hostile text cannot grow its stack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fs {

class JsonScanner {
 public:
  enum class State : std::uint8_t {
    kValue,        // a value is expected (the document's start, after ':' or ',' in an array)
    kArrayFirst,   // after '[': a value or ']'
    kObjectFirst,  // after '{': a key or '}'
    kKey,          // after ',' in an object: a key
    kColon,        // after a key: ':'
    kAfter,        // after a value: ',' or the closing bracket
    kString,
    kEscape,
    kHex,
    kNumber,
    kLiteral,
    kDone,  // the document is complete
  };

  enum class Push : std::uint8_t {
    kOk,
    kError,
    // A raw control character inside a string (JSON forbids it; models write literal newlines
    // into code they quote): accepted, and `escaped()` is the text that replaces it.
    kEscaped,
  };

  static constexpr std::size_t kMaxDepth = 64;

  Push push(char c);

  State state() const { return state_; }
  // Open arrays and objects.
  std::size_t depth() const { return stack_.size(); }
  bool in_key() const { return in_key_; }
  bool done() const { return state_ == State::kDone; }
  // The JSON escape for the control character of the last kEscaped push.
  const std::string& escaped() const { return escaped_; }

 private:
  // The state after a value completes.
  State after_value() const { return stack_.empty() ? State::kDone : State::kAfter; }
  Push begin_value(char c);
  Push after(char c);
  // Number grammar positions; the number may end only in the "complete" ones.
  enum class Num : std::uint8_t {
    kMinus,
    kZero,
    kInt,
    kDot,
    kFrac,
    kExpMark,
    kExpSign,
    kExpDigits
  };
  static bool number_may_end(Num n) {
    return n == Num::kZero || n == Num::kInt || n == Num::kFrac || n == Num::kExpDigits;
  }

  State state_ = State::kValue;
  std::vector<char> stack_;
  bool in_key_ = false;
  Num num_ = Num::kInt;
  const char* literal_ = nullptr;  // the rest of "true", "false" or "null" still expected
  int hex_left_ = 0;
  std::string escaped_;
};

}  // namespace fs
