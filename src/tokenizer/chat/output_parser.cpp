// The chat output parser: ordinary text, <think> reasoning, and the family's tool-call openers,
// each call handed to the family's reader (tool_calls_*.cpp). See output_parser.h for the rules.
#include "tokenizer/chat/output_parser.h"

#include <cstdint>
#include <random>

#include "tokenizer/chat/tool_call_reader.h"
#include "tokenizer/utf8.h"

namespace fs {
namespace {

using chat_detail::CallOpener;
using chat_detail::Match;
using chat_detail::starts_with_tag;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

std::string new_call_id() {
  // 96 random bits per id; the generator is seeded once per thread from the OS.
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  std::uint64_t bits = 0;
  for (int i = 0; i < 24; ++i) {
    if (i % 16 == 0) bits = rng();
    id += kHex[bits & 15];
    bits >>= 4;
  }
  return id;
}

std::vector<CallOpener> openers_for(ChatFamily family) {
  switch (family) {
    case ChatFamily::kQwen:
      return chat_detail::qwen_call_openers();
    case ChatFamily::kDeepSeek:
    case ChatFamily::kDeepSeekV4:
      return chat_detail::deepseek_call_openers();
    case ChatFamily::kGlm:
      return chat_detail::glm_call_openers();
  }
  return {};
}

std::size_t leading_space(std::string_view s) {
  std::size_t n = 0;
  while (n < s.size() && chat_detail::is_ascii_space(s[n])) ++n;
  return n;
}

std::size_t trailing_space(std::string_view s) {
  std::size_t n = 0;
  while (n < s.size() && chat_detail::is_ascii_space(s[s.size() - 1 - n])) ++n;
  return n;
}

}  // namespace

struct ChatOutputParser::Impl final : chat_detail::CallOutput {
  enum class Mode { kContent, kReasoning, kCall };

  explicit Impl(OutputParserOptions o) : options(o) {
    if (options.parse_tool_calls) openers = openers_for(options.family);
    for (const CallOpener& op : openers) max_lead = std::max(max_lead, op.lead_newlines);
    if (options.starts_in_reasoning && options.parse_reasoning) mode = Mode::kReasoning;
  }

  std::vector<OutputEvent> feed(std::string_view text) {
    if (finished) return {};
    buffer.append(text);
    run(false);
    return take(false);
  }

  std::vector<OutputEvent> finish() {
    if (finished) return {};
    finished = true;
    run(true);
    return take(true);
  }

  // ---- the modes ----

  void run(bool at_end) {
    for (;;) {
      bool again = false;
      switch (mode) {
        case Mode::kContent:
          again = step_content(at_end);
          break;
        case Mode::kReasoning:
          again = step_reasoning(at_end);
          break;
        case Mode::kCall:
          again = step_call(at_end);
          break;
      }
      if (!again) return;
    }
  }

  // Drops the whitespace that templates write after a tag. False while only whitespace is here.
  bool skip_leading_space() {
    if (!skip_space) return true;
    buffer.erase(0, leading_space(buffer));
    if (buffer.empty()) return false;
    skip_space = false;
    return true;
  }

  // Ordinary text up to a <think> or a tool-call opener. True when the mode changed.
  bool step_content(bool at_end) {
    if (!skip_leading_space()) return false;
    const std::string_view in = buffer;
    std::size_t hold = in.size();
    for (std::size_t i = in.find('<'); i != std::string_view::npos; i = in.find('<', i + 1)) {
      const std::string_view at = in.substr(i);
      bool partial = false;
      if (options.parse_reasoning && !text_seen && i == 0) {
        const Match m = starts_with_tag(at, kThinkOpen);
        if (m == Match::kYes) {
          piece(OutputEventKind::kText, in.substr(0, i));
          buffer.erase(0, i + kThinkOpen.size());
          mode = Mode::kReasoning;
          skip_space = true;
          return true;
        }
        partial = m == Match::kPartial;
      }
      for (const CallOpener& op : openers) {
        const Match m = starts_with_tag(at, op.tag);
        if (m == Match::kYes) {
          std::size_t lead = 0;
          while (lead < static_cast<std::size_t>(op.lead_newlines) && lead < i &&
                 in[i - 1 - lead] == '\n') {
            ++lead;
          }
          piece(OutputEventKind::kText, in.substr(0, i - lead));
          consumed = in.substr(i - lead, lead + op.tag.size());
          buffer.erase(0, i + op.tag.size());
          reader = op.make();
          mode = Mode::kCall;
          return true;
        }
        partial = partial || m == Match::kPartial;
      }
      if (partial) {
        hold = i;
        break;
      }
    }
    if (at_end) {
      hold = in.size();
    } else {
      // Newlines a tool-call opener may take as its lead.
      for (int k = 0; k < max_lead && hold > 0 && in[hold - 1] == '\n'; ++k) --hold;
    }
    piece(OutputEventKind::kText, in.substr(0, hold));
    buffer.erase(0, hold);
    return false;
  }

  // Reasoning up to </think>, without the whitespace around it. True when the mode changed.
  bool step_reasoning(bool at_end) {
    if (!skip_leading_space()) return false;
    const std::string_view in = buffer;
    if (const std::size_t close = in.find(kThinkClose); close != std::string_view::npos) {
      const std::string_view r = in.substr(0, close);
      piece(OutputEventKind::kReasoning, r.substr(0, r.size() - trailing_space(r)));
      buffer.erase(0, close + kThinkClose.size());
      mode = Mode::kContent;
      skip_space = true;
      return true;
    }
    std::size_t hold = in.size();
    for (std::size_t i = in.size() > kThinkClose.size() ? in.size() - kThinkClose.size() : 0;
         i < in.size() && !at_end; ++i) {
      if (in[i] == '<' && starts_with_tag(in.substr(i), kThinkClose) == Match::kPartial) {
        hold = i;
        break;
      }
    }
    // At the end an unclosed block is reasoning; its trailing whitespace goes as </think>'s would.
    hold -= trailing_space(in.substr(0, hold));
    piece(OutputEventKind::kReasoning, in.substr(0, hold));
    buffer.erase(0, at_end ? in.size() : hold);
    return false;
  }

  bool step_call(bool at_end) {
    chat_detail::CallInput in(buffer, at_end, consumed);
    chat_detail::ReadResult r = reader->read(in, *this);
    buffer.erase(0, in.used());
    if (r == chat_detail::ReadResult::kNeedMore) {
      if (!at_end) return false;
      r = chat_detail::ReadResult::kFailed;  // a reader must decide at the end; be safe
    }
    // Whatever the reader consumed without accepting it goes back out as the text it was.
    std::string unaccepted = std::move(consumed);
    consumed.clear();
    if (r == chat_detail::ReadResult::kFailed && open) {
      const bool complete = reader->abandon(*this);
      end_call(complete);
    }
    if (r == chat_detail::ReadResult::kDone && leading_space(unaccepted) == unaccepted.size()) {
      // Whitespace after calls is the template's separator (between calls, before the end).
      unaccepted.clear();
      skip_space = true;
    }
    piece(OutputEventKind::kText, unaccepted);
    reader.reset();
    mode = Mode::kContent;
    return true;
  }

  // ---- events ----

  void piece(OutputEventKind kind, std::string_view text, int index = -1) {
    if (text.empty()) return;
    if (kind == OutputEventKind::kText) text_seen = true;
    if (have_current && current.kind == kind && current.index == index) {
      current.text.append(text);
      return;
    }
    flush_current();
    current = OutputEvent{};
    current.kind = kind;
    current.text = std::string(text);
    current.index = index;
    have_current = true;
  }

  void flush_current() {
    if (have_current && !current.text.empty()) events.push_back(std::move(current));
    have_current = false;
  }

  // The events so far. Mid-stream, a piece's unfinished UTF-8 character waits for its last bytes.
  std::vector<OutputEvent> take(bool at_end) {
    if (have_current) {
      const std::size_t tail = at_end ? 0 : utf8::incomplete_suffix(current.text);
      if (tail == 0) {
        flush_current();
      } else if (tail < current.text.size()) {
        OutputEvent head = current;
        head.text.resize(current.text.size() - tail);
        events.push_back(std::move(head));
        current.text.erase(0, current.text.size() - tail);
      }
    }
    return std::move(events);
  }

  void begin(std::string name) override {
    flush_current();
    consumed.clear();
    OutputEvent e;
    e.kind = OutputEventKind::kToolCallBegin;
    e.index = next_index;
    e.id = new_call_id();
    e.name = std::move(name);
    events.push_back(std::move(e));
    open = true;
  }

  void arguments(std::string_view text) override {
    consumed.clear();
    piece(OutputEventKind::kToolCallArguments, text, next_index);
  }

  void end() override {
    consumed.clear();
    end_call(true);
  }

  void end_call(bool complete) {
    flush_current();
    OutputEvent e;
    e.kind = OutputEventKind::kToolCallEnd;
    e.index = next_index++;
    e.complete = complete;
    events.push_back(std::move(e));
    open = false;
  }

  void sync() override { consumed.clear(); }
  bool call_open() const override { return open; }

  OutputParserOptions options;
  std::vector<CallOpener> openers;
  int max_lead = 0;
  Mode mode = Mode::kContent;
  // Templates write whitespace after these tags; the output starts as if after one.
  bool skip_space = true;
  bool finished = false;
  // Visible text came: a <think> from here on is text (models think before they answer).
  bool text_seen = false;
  std::string buffer;    // output not yet read
  std::string consumed;  // read by the reader since its last event
  std::unique_ptr<chat_detail::ToolCallReader> reader;
  bool open = false;  // a call began and has not ended
  int next_index = 0;

  std::vector<OutputEvent> events;
  OutputEvent current;
  bool have_current = false;
};

ChatOutputParser::ChatOutputParser(OutputParserOptions options)
    : impl_(std::make_unique<Impl>(options)) {}
ChatOutputParser::~ChatOutputParser() = default;
ChatOutputParser::ChatOutputParser(ChatOutputParser&&) noexcept = default;
ChatOutputParser& ChatOutputParser::operator=(ChatOutputParser&&) noexcept = default;

std::vector<OutputEvent> ChatOutputParser::feed(std::string_view text) {
  return impl_->feed(text);
}
std::vector<OutputEvent> ChatOutputParser::finish() {
  return impl_->finish();
}

ParsedOutput parse_chat_output(std::string_view text, const OutputParserOptions& options) {
  ChatOutputParser parser(options);
  std::vector<OutputEvent> events = parser.feed(text);
  for (OutputEvent& e : parser.finish()) events.push_back(std::move(e));
  ParsedOutput out;
  for (OutputEvent& e : events) {
    switch (e.kind) {
      case OutputEventKind::kText:
        out.content += e.text;
        break;
      case OutputEventKind::kReasoning:
        out.reasoning += e.text;
        break;
      case OutputEventKind::kToolCallBegin:
        out.tool_calls.push_back({std::move(e.id), std::move(e.name), "", true});
        break;
      case OutputEventKind::kToolCallArguments:
        out.tool_calls.back().arguments += e.text;
        break;
      case OutputEventKind::kToolCallEnd:
        out.tool_calls.back().complete = e.complete;
        break;
    }
  }
  return out;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  prompt.remove_suffix(trailing_space(prompt));
  return prompt.ends_with(kThinkOpen);
}

}  // namespace fs
