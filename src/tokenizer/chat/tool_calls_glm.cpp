// GLM's tool calls (GLM-4.5 and later), as glm.cpp writes them after "\n":
//   <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>
// Later releases drop the newlines; whitespace between the parts is free. The call commits at the
// name (ended by a newline or the first tag) and each argument is emitted as a JSON member once
// its </arg_value> is read, by json_value_of's rule (the template writes strings as they are and
// everything else as JSON).
#include <memory>
#include <string>

#include "tokenizer/chat/tool_call_reader.h"
#include "tokenizer/utf8.h"

namespace fs::chat_detail {
namespace {

constexpr std::size_t kMaxName = 256;

class GlmReader final : public ToolCallReader {
 public:
  ReadResult read(CallInput& in, CallOutput& out) override {
    for (;;) {
      switch (step_) {
        case Step::kName: {
          const std::string_view s = in.rest();
          std::size_t n = 0;
          while (n < s.size() && s[n] != '\n' && s[n] != '<' && name_.size() + n < kMaxName) ++n;
          name_.append(s.substr(0, n));
          in.consume(n);
          if (name_.size() >= kMaxName) return ReadResult::kFailed;
          if (n == s.size()) return need_more(in);
          const std::string_view name = utf8::trim(name_);
          if (name.empty()) return ReadResult::kFailed;
          out.begin(std::string(name));
          step_ = Step::kBody;
          break;
        }
        case Step::kBody: {
          skip_space(in);
          const Match key = take_tag(in, "<arg_key>");
          if (key == Match::kYes) {
            step_ = Step::kKey;
            break;
          }
          const Match end = take_tag(in, "</tool_call>");
          if (end == Match::kYes) {
            out.arguments(first_ ? "{}" : "}");
            closed_ = true;
            out.end();
            return ReadResult::kDone;
          }
          if (key == Match::kPartial || end == Match::kPartial) return need_more(in);
          return ReadResult::kFailed;
        }
        case Step::kKey: {
          const Match m = take_name_until(in, "</arg_key>", key_, kMaxName);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo || utf8::trim(key_).empty()) return ReadResult::kFailed;
          step_ = Step::kValueOpen;
          break;
        }
        case Step::kValueOpen: {
          skip_space(in);
          const Match m = take_tag(in, "<arg_value>");
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          step_ = Step::kValue;
          break;
        }
        case Step::kValue: {
          if (!take_until(in, "</arg_value>", value_)) return need_more(in);
          std::string member = first_ ? "{" : ", ";
          append_all(member, {json_quote(utf8::trim(key_)), ": ", json_value_of(value_)});
          out.arguments(member);
          first_ = false;
          key_.clear();
          value_.clear();
          step_ = Step::kBody;
          break;
        }
      }
    }
  }

  bool abandon(CallOutput& out) override {
    if (!closed_) out.arguments(first_ ? "{}" : "}");
    return closed_;
  }

 private:
  enum class Step { kName, kBody, kKey, kValueOpen, kValue };

  Step step_ = Step::kName;
  bool first_ = true, closed_ = false;
  std::string name_, key_, value_;
};

}  // namespace

std::vector<CallOpener> glm_call_openers() {
  return {{"<tool_call>", 1,
           []() -> std::unique_ptr<ToolCallReader> { return std::make_unique<GlmReader>(); }}};
}

}  // namespace fs::chat_detail
