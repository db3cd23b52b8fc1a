// DeepSeek's tool calls, in the three syntaxes its releases use:
//   V3 (deepseek_v3.cpp writes it into prompts):
//     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
//     <｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>...<｜tool▁calls▁end｜>
//   V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> in the same block
//   V3.2/V4 (DSML), after "\n\n":
//     <｜DSML｜tool_calls>\n<｜DSML｜invoke name="NAME">\n
//     <｜DSML｜parameter name="P" string="true">VALUE</｜DSML｜parameter>\n...</｜DSML｜invoke>\n
//     </｜DSML｜tool_calls>            (V3.2 spells the block function_calls)
// V3 and V3.1 are told apart after <｜tool▁sep｜>: V3.1's arguments follow at once ('{'), V3's
// function name does. The block's closing token is optional (V3's own template omits it after a
// single call): a call followed by anything else ends the block there. JSON arguments stream as
// written; a DSML parameter is emitted once its closing tag is read, as a string when
// string="true", as JSON when string="false" and it parses, else by json_value_of's rule.
#include <memory>
#include <string>

#include "tokenizer/chat/tool_call_reader.h"
#include "tokenizer/utf8.h"

namespace fs::chat_detail {
namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::size_t kMaxName = 256;

// V3 and V3.1 calls, from inside the block (or from a bare <｜tool▁call▁begin｜>).
class DeepSeekReader final : public ToolCallReader {
 public:
  explicit DeepSeekReader(bool in_call) : step_(in_call ? Step::kHead : Step::kBetween) {}

  ReadResult read(CallInput& in, CallOutput& out) override {
    for (;;) {
      switch (step_) {
        case Step::kBetween: {
          skip_space(in);
          const Match call = take_tag(in, kCallBegin);
          if (call == Match::kYes) {
            step_ = Step::kHead;
            break;
          }
          const Match end = take_tag(in, kCallsEnd);
          if (end == Match::kYes) {
            // An empty block calls nothing: it stays text.
            if (calls_ == 0) return ReadResult::kFailed;
            out.sync();
            return ReadResult::kDone;
          }
          if ((call == Match::kPartial || end == Match::kPartial) && !in.at_end()) {
            return ReadResult::kNeedMore;
          }
          // Anything else after a call ends the block; before the first it is not a block.
          return calls_ > 0 ? ReadResult::kDone : ReadResult::kFailed;
        }
        case Step::kHead: {
          const Match m = take_name_until(in, kSep, head_, kMaxName);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          step_ = Step::kAfterSep;
          break;
        }
        case Step::kAfterSep: {
          skip_space(in);
          const std::string_view s = in.rest();
          if (s.empty()) return need_more(in);
          if (s[0] == '{') {
            v3_ = false;  // V3.1: the head was the name
            if (!start_call(utf8::trim(head_), out)) return ReadResult::kFailed;
            step_ = Step::kArguments;
            break;
          }
          step_ = Step::kName;
          break;
        }
        case Step::kName: {
          const Match m = take_name(in, '\n', name_);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          step_ = Step::kFence;
          break;
        }
        case Step::kFence: {
          const Match m = take_tag(in, "```json");
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          step_ = Step::kFenceSpace;
          break;
        }
        case Step::kFenceSpace: {
          skip_space(in);
          const std::string_view s = in.rest();
          if (s.empty()) return need_more(in);
          if (s[0] != '{' || !start_call(utf8::trim(name_), out)) return ReadResult::kFailed;
          step_ = Step::kArguments;
          break;
        }
        case Step::kArguments: {
          const ReadResult r = arguments_.read(in, out);
          if (r != ReadResult::kDone) return r;
          step_ = v3_ ? Step::kFenceClose : Step::kCallEnd;
          break;
        }
        case Step::kFenceClose: {
          skip_space(in);
          const Match m = take_tag(in, "```");
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          step_ = Step::kCallEnd;
          break;
        }
        case Step::kCallEnd: {
          skip_space(in);
          const Match m = take_tag(in, kCallEnd);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          out.end();
          ++calls_;
          head_.clear();
          name_.clear();
          arguments_ = ArgumentsStream();
          v3_ = true;
          step_ = Step::kBetween;
          break;
        }
      }
    }
  }

  bool abandon(CallOutput&) override { return arguments_.complete(); }

 private:
  enum class Step {
    kBetween,
    kHead,
    kAfterSep,
    kName,
    kFence,
    kFenceSpace,
    kArguments,
    kFenceClose,
    kCallEnd
  };

  static bool start_call(std::string_view name, CallOutput& out) {
    if (name.empty()) return false;
    out.begin(std::string(name));
    return true;
  }

  Step step_;
  bool v3_ = true;
  int calls_ = 0;
  std::string head_, name_;
  ArgumentsStream arguments_;
};

// DSML (V3.2, V4): invokes inside a <｜DSML｜tool_calls> (or function_calls) block.
class DsmlReader final : public ToolCallReader {
 public:
  explicit DsmlReader(std::string_view block_end) : block_end_(block_end) {}

  ReadResult read(CallInput& in, CallOutput& out) override {
    for (;;) {
      switch (step_) {
        case Step::kBetween: {
          skip_space(in);
          const Match invoke = take_tag(in, "<｜DSML｜invoke name=\"");
          if (invoke == Match::kYes) {
            step_ = Step::kName;
            break;
          }
          const Match end = take_tag(in, block_end_);
          if (end == Match::kYes) {
            // An empty block calls nothing: it stays text.
            if (calls_ == 0) return ReadResult::kFailed;
            out.sync();
            return ReadResult::kDone;
          }
          if ((invoke == Match::kPartial || end == Match::kPartial) && !in.at_end()) {
            return ReadResult::kNeedMore;
          }
          return calls_ > 0 ? ReadResult::kDone : ReadResult::kFailed;
        }
        case Step::kName: {
          const Match m = take_name(in, '"', name_, kMaxName);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          step_ = Step::kNameEnd;
          break;
        }
        case Step::kNameEnd: {
          const Match m = take_tag(in, ">");
          if (m == Match::kPartial) return need_more(in);
          const std::string_view name = utf8::trim(name_);
          if (m == Match::kNo || name.empty()) return ReadResult::kFailed;
          out.begin(std::string(name));
          step_ = Step::kBody;
          break;
        }
        case Step::kBody: {
          skip_space(in);
          const Match param = take_tag(in, "<｜DSML｜parameter name=\"");
          if (param == Match::kYes) {
            step_ = Step::kParamName;
            break;
          }
          const Match end = take_tag(in, "</｜DSML｜invoke>");
          if (end == Match::kYes) {
            out.arguments(first_ ? "{}" : "}");
            out.end();
            ++calls_;
            name_.clear();
            first_ = true;
            step_ = Step::kBetween;
            break;
          }
          if (param == Match::kPartial || end == Match::kPartial) return need_more(in);
          return ReadResult::kFailed;
        }
        case Step::kParamName: {
          const Match m = take_name(in, '"', key_, kMaxName);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo || utf8::trim(key_).empty()) return ReadResult::kFailed;
          step_ = Step::kAttributes;
          break;
        }
        case Step::kAttributes: {
          const Match m = take_name(in, '>', attributes_, kMaxName);
          if (m == Match::kPartial) return need_more(in);
          if (m == Match::kNo) return ReadResult::kFailed;
          step_ = Step::kValue;
          break;
        }
        case Step::kValue: {
          if (!take_until(in, "</｜DSML｜parameter>", value_)) return need_more(in);
          std::string member = first_ ? "{" : ", ";
          append_all(member, {json_quote(utf8::trim(key_)), ": ", value_json()});
          out.arguments(member);
          first_ = false;
          key_.clear();
          attributes_.clear();
          value_.clear();
          step_ = Step::kBody;
          break;
        }
      }
    }
  }

  bool abandon(CallOutput& out) override {
    out.arguments(first_ ? "{}" : "}");
    return false;  // an invoke that ended was closed at once
  }

 private:
  enum class Step { kBetween, kName, kNameEnd, kBody, kParamName, kAttributes, kValue };

  std::string value_json() const {
    if (attributes_.find("string=\"true\"") != std::string::npos) return json_quote(value_);
    return json_value_of(value_);
  }

  std::string_view block_end_;
  Step step_ = Step::kBetween;
  int calls_ = 0;
  bool first_ = true;
  std::string name_, key_, attributes_, value_;
};

}  // namespace

std::vector<CallOpener> deepseek_call_openers() {
  return {
      {kCallsBegin, 0,
       []() -> std::unique_ptr<ToolCallReader> { return std::make_unique<DeepSeekReader>(false); }},
      {kCallBegin, 0,
       []() -> std::unique_ptr<ToolCallReader> { return std::make_unique<DeepSeekReader>(true); }},
      {"<｜DSML｜tool_calls>", 2,
       []() -> std::unique_ptr<ToolCallReader> {
         return std::make_unique<DsmlReader>("</｜DSML｜tool_calls>");
       }},
      {"<｜DSML｜function_calls>", 2,
       []() -> std::unique_ptr<ToolCallReader> {
         return std::make_unique<DsmlReader>("</｜DSML｜function_calls>");
       }},
  };
}

}  // namespace fs::chat_detail
