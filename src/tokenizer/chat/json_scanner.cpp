#include "tokenizer/chat/json_scanner.h"

#include <cstdio>

namespace fs {
namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

JsonScanner::Push JsonScanner::begin_value(char c) {
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return Push::kError;
      stack_.push_back(c);
      state_ = c == '{' ? State::kObjectFirst : State::kArrayFirst;
      return Push::kOk;
    case '"':
      in_key_ = false;
      state_ = State::kString;
      return Push::kOk;
    case '-':
      num_ = Num::kMinus;
      state_ = State::kNumber;
      return Push::kOk;
    case 't':
      literal_ = "rue";
      state_ = State::kLiteral;
      return Push::kOk;
    case 'f':
      literal_ = "alse";
      state_ = State::kLiteral;
      return Push::kOk;
    case 'n':
      literal_ = "ull";
      state_ = State::kLiteral;
      return Push::kOk;
    default:
      if (!is_digit(c)) return Push::kError;
      num_ = c == '0' ? Num::kZero : Num::kInt;
      state_ = State::kNumber;
      return Push::kOk;
  }
}

JsonScanner::Push JsonScanner::after(char c) {
  if (is_ws(c)) return Push::kOk;
  const char open = stack_.back();
  if (c == ',') {
    state_ = open == '{' ? State::kKey : State::kValue;
    return Push::kOk;
  }
  if ((c == '}' && open == '{') || (c == ']' && open == '[')) {
    stack_.pop_back();
    state_ = after_value();
    return Push::kOk;
  }
  return Push::kError;
}

JsonScanner::Push JsonScanner::push(char c) {
  switch (state_) {
    case State::kValue:
      if (is_ws(c)) return Push::kOk;
      return begin_value(c);
    case State::kArrayFirst:
      if (is_ws(c)) return Push::kOk;
      if (c == ']') {
        stack_.pop_back();
        state_ = after_value();
        return Push::kOk;
      }
      return begin_value(c);
    case State::kObjectFirst:
    case State::kKey:
      if (is_ws(c)) return Push::kOk;
      if (c == '}' && state_ == State::kObjectFirst) {
        stack_.pop_back();
        state_ = after_value();
        return Push::kOk;
      }
      if (c != '"') return Push::kError;
      in_key_ = true;
      state_ = State::kString;
      return Push::kOk;
    case State::kColon:
      if (is_ws(c)) return Push::kOk;
      if (c != ':') return Push::kError;
      state_ = State::kValue;
      return Push::kOk;
    case State::kAfter:
      return after(c);
    case State::kString:
      if (c == '"') {
        state_ = in_key_ ? State::kColon : after_value();
        in_key_ = false;
        return Push::kOk;
      }
      if (c == '\\') {
        state_ = State::kEscape;
        return Push::kOk;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        switch (c) {
          case '\n':
            escaped_ = "\\n";
            break;
          case '\t':
            escaped_ = "\\t";
            break;
          case '\r':
            escaped_ = "\\r";
            break;
          default: {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(c));
            escaped_ = hex;
          }
        }
        return Push::kEscaped;
      }
      return Push::kOk;
    case State::kEscape:
      if (c == 'u') {
        hex_left_ = 4;
        state_ = State::kHex;
        return Push::kOk;
      }
      for (const char e : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) {
        if (c == e) {
          state_ = State::kString;
          return Push::kOk;
        }
      }
      return Push::kError;
    case State::kHex:
      if (!is_hex(c)) return Push::kError;
      if (--hex_left_ == 0) state_ = State::kString;
      return Push::kOk;
    case State::kNumber:
      switch (num_) {
        case Num::kMinus:
          if (!is_digit(c)) return Push::kError;
          num_ = c == '0' ? Num::kZero : Num::kInt;
          return Push::kOk;
        case Num::kZero:
        case Num::kInt:
          if (is_digit(c) && num_ == Num::kInt) return Push::kOk;
          if (c == '.') {
            num_ = Num::kDot;
            return Push::kOk;
          }
          break;
        case Num::kDot:
          if (!is_digit(c)) return Push::kError;
          num_ = Num::kFrac;
          return Push::kOk;
        case Num::kFrac:
          if (is_digit(c)) return Push::kOk;
          break;
        case Num::kExpMark:
          if (c == '+' || c == '-') {
            num_ = Num::kExpSign;
            return Push::kOk;
          }
          [[fallthrough]];
        case Num::kExpSign:
          if (!is_digit(c)) return Push::kError;
          num_ = Num::kExpDigits;
          return Push::kOk;
        case Num::kExpDigits:
          if (is_digit(c)) return Push::kOk;
          break;
      }
      if ((c == 'e' || c == 'E') &&
          (num_ == Num::kZero || num_ == Num::kInt || num_ == Num::kFrac)) {
        num_ = Num::kExpMark;
        return Push::kOk;
      }
      // The number ended just before `c`; a number is never the whole document here (the
      // scanner reads objects), so `c` must continue the enclosing container.
      if (!number_may_end(num_) || stack_.empty()) return Push::kError;
      state_ = State::kAfter;
      return after(c);
    case State::kLiteral:
      if (c != *literal_) return Push::kError;
      if (*++literal_ == '\0') state_ = after_value();
      return Push::kOk;
    case State::kDone:
      return Push::kError;
  }
  return Push::kError;
}

}  // namespace fs
