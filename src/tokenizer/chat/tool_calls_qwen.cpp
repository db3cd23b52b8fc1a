// Qwen's tool calls, after "<tool_call>" (qwen3.cpp writes the JSON form into prompts):
//   JSON form (Qwen3):       \n{"name": NAME, "arguments": {...}}\n</tool_call>
//   XML form (Qwen3-Coder):  \n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
//                            </function>\n</tool_call>
// Whitespace between the parts is free. The JSON form commits once the name is known and the
// arguments object has begun, then streams the arguments as written; the wrapper's members may come
// in either order, other members are ignored, and a missing closing brace of the wrapper before
// </tool_call> is tolerated (a common slip). The XML form commits at the function name and emits
// each parameter as a JSON member once its </parameter> is read (or, that tag forgotten, the
// next <parameter= or </function>).
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "format/json_parse.h"
#include "tokenizer/chat/tool_call_reader.h"
#include "tokenizer/utf8.h"

namespace fs::chat_detail {
namespace {

constexpr std::string_view kClose = "</tool_call>";

// A JSON string literal (quotes included) decoded, or nullopt.
std::optional<std::string> decode_string(const std::string& literal) {
  auto j = parse_json_bounded(literal);
  if (!j.ok() || !j->is_string()) return std::nullopt;
  return j->get<std::string>();
}

class QwenReader final : public ToolCallReader {
 public:
  ReadResult read(CallInput& in, CallOutput& out) override {
    for (;;) {
      switch (step_) {
        case Step::kStart: {
          skip_space(in);
          const std::string_view s = in.rest();
          if (s.empty()) return need_more(in);
          if (s[0] == '{') {
            step_ = Step::kJson;
            break;
          }
          const Match m = take_tag(in, "<function=");
          if (m == Match::kNo) return ReadResult::kFailed;
          if (m == Match::kPartial) return need_more(in);
          step_ = Step::kXmlName;
          break;
        }
        case Step::kJson:
          if (const ReadResult r = read_json(in, out); r != ReadResult::kDone) return r;
          step_ = Step::kClose;
          break;
        case Step::kXmlName: {
          const Match m = take_name(in, '>', acc_);
          if (m == Match::kPartial) return need_more(in);
          const std::string name(utf8::trim(acc_));
          if (m == Match::kNo || name.empty()) return ReadResult::kFailed;
          out.begin(name);
          acc_.clear();
          step_ = Step::kXmlBody;
          break;
        }
        case Step::kXmlBody: {
          skip_space(in);
          if (in.rest().empty()) return need_more(in);
          const Match param = take_tag(in, "<parameter=");
          if (param == Match::kYes) {
            step_ = Step::kParamName;
            break;
          }
          const Match end = take_tag(in, "</function>");
          if (end == Match::kYes) {
            out.arguments(first_param_ ? "{}" : "}");
            arguments_closed_ = true;
            step_ = Step::kClose;
            break;
          }
          if (param == Match::kPartial || end == Match::kPartial) return need_more(in);
          return ReadResult::kFailed;
        }
        case Step::kParamName: {
          const Match m = take_name(in, '>', key_);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo || utf8::trim(key_).empty()) return ReadResult::kFailed;
          step_ = Step::kParamValue;
          break;
        }
        case Step::kParamValue: {
          // A missing </parameter> (a slip Qwen3-Coder makes) ends the value at the next tag.
          const int tag =
              take_until_any(in, {"</parameter>", "<parameter=", "</function>"}, acc_, false);
          if (tag < 0) return need_more(in);
          if (tag == 0) in.consume(std::string_view("</parameter>").size());
          // The template writes the value between newlines.
          std::string_view v = acc_;
          if (v.starts_with('\n')) v.remove_prefix(1);
          if (v.ends_with('\n')) v.remove_suffix(1);
          std::string member = first_param_ ? "{" : ", ";
          append_all(member, {json_quote(utf8::trim(key_)), ": ", json_value_of(v)});
          out.arguments(member);
          first_param_ = false;
          acc_.clear();
          key_.clear();
          step_ = Step::kXmlBody;
          break;
        }
        case Step::kClose: {
          skip_space(in);
          const Match m = take_tag(in, kClose);
          if (m == Match::kYes) {
            out.end();
            return ReadResult::kDone;
          }
          if (m == Match::kPartial) return need_more(in);
          return ReadResult::kFailed;
        }
      }
    }
  }

  bool abandon(CallOutput& out) override {
    if (xml()) {
      if (!arguments_closed_) out.arguments(first_param_ ? "{}" : "}");
      return arguments_closed_;
    }
    return arguments_done_;
  }

 private:
  enum class Step { kStart, kJson, kXmlName, kXmlBody, kParamName, kParamValue, kClose };
  enum class Member { kNone, kName, kArguments, kOther };

  bool xml() const { return step_ >= Step::kXmlName && !json_; }

  // The wrapper object, byte by byte. kDone once it closed (or, tolerated, once '<' follows the
  // complete arguments where its closing brace should be).
  ReadResult read_json(CallInput& in, CallOutput& out) {
    json_ = true;
    const std::string_view s = in.rest();
    std::size_t consumed = 0;  // of s, already given to `in`
    std::string piece;         // accepted argument text not yet sent
    auto send = [&](std::size_t upto) {
      in.consume(upto - consumed);
      consumed = upto;
      if (out.call_open()) {
        if (!piece.empty()) out.arguments(piece);
      } else {
        pending_arguments_ += piece;
      }
      piece.clear();
    };
    for (std::size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      const std::size_t depth = wrapper_.depth();
      const JsonScanner::State before = wrapper_.state();
      const JsonScanner::Push p = wrapper_.push(c);
      if (p == JsonScanner::Push::kError) {
        send(i);
        if (c == '<' && depth == 1 && before == JsonScanner::State::kAfter && arguments_done_ &&
            out.call_open()) {
          out.sync();
          return ReadResult::kDone;
        }
        return ReadResult::kFailed;
      }
      if (depth == 1 &&
          (before == JsonScanner::State::kObjectFirst || before == JsonScanner::State::kKey) &&
          c == '"') {
        in_key_ = true;
        key_.clear();
      }
      if (in_key_) {
        key_ += c;
        if (wrapper_.state() == JsonScanner::State::kColon) {
          in_key_ = false;
          const auto k = decode_string(key_);
          member_ = !k                  ? Member::kOther
                    : *k == "name"      ? Member::kName
                    : *k == "arguments" ? Member::kArguments
                                        : Member::kOther;
          if ((member_ == Member::kName && have_name_) ||
              (member_ == Member::kArguments && arguments_started_)) {
            send(i);
            return ReadResult::kFailed;
          }
        }
        continue;
      }
      if (depth == 1 && before == JsonScanner::State::kValue && !is_ascii_space(c)) {
        if ((member_ == Member::kName && c != '"') || (member_ == Member::kArguments && c != '{')) {
          send(i);
          return ReadResult::kFailed;
        }
        if (member_ == Member::kName) in_name_ = true;
        if (member_ == Member::kArguments) arguments_started_ = true;
      }
      if (in_name_) {
        name_literal_ += c;
        if (wrapper_.depth() == 1 && wrapper_.state() == JsonScanner::State::kAfter) {
          in_name_ = false;
          auto name = decode_string(name_literal_);
          if (!name || utf8::trim(*name).empty()) {
            send(i);
            return ReadResult::kFailed;
          }
          name_ = std::string(utf8::trim(*name));
          have_name_ = true;
        }
      } else if (arguments_started_ && !arguments_done_) {
        if (p == JsonScanner::Push::kEscaped) {
          piece += wrapper_.escaped();
        } else {
          piece += c;
        }
        if (wrapper_.depth() == 1) arguments_done_ = true;
      }
      if (!out.call_open() && have_name_ && (arguments_started_ || wrapper_.done())) {
        // Commit: the name is known and the arguments have begun (or there are none).
        in.consume(i + 1 - consumed);
        consumed = i + 1;
        out.begin(name_);
        if (!arguments_started_) {
          pending_arguments_ = "{}";
          arguments_done_ = true;
        }
        pending_arguments_ += piece;
        piece.clear();
        if (!pending_arguments_.empty()) out.arguments(pending_arguments_);
        pending_arguments_.clear();
      }
      if (wrapper_.done()) {
        send(i + 1);
        if (!out.call_open()) return ReadResult::kFailed;  // no name
        out.sync();
        return ReadResult::kDone;
      }
    }
    send(s.size());
    return need_more(in);
  }

  Step step_ = Step::kStart;
  bool json_ = false;
  // JSON form.
  JsonScanner wrapper_;
  Member member_ = Member::kNone;
  bool in_key_ = false, in_name_ = false;
  std::string key_, name_literal_, name_, pending_arguments_;
  bool have_name_ = false, arguments_started_ = false, arguments_done_ = false;
  // XML form (key_ is the parameter's name).
  std::string acc_;
  bool first_param_ = true, arguments_closed_ = false;
};

}  // namespace

std::vector<CallOpener> qwen_call_openers() {
  // Qwen3 writes "\n" before a call, Qwen3-Coder "\n\n" after content.
  return {{"<tool_call>", 2,
           []() -> std::unique_ptr<ToolCallReader> { return std::make_unique<QwenReader>(); }}};
}

}  // namespace fs::chat_detail
