// The chat output parser: every family's tool-call and reasoning syntax, whole and streamed at
// every split point (inside tags, special tokens and multi-byte characters), the malformed
// fallbacks, and round trips through the renderers that write the same syntax into prompts.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat/chat.h"
#include "tokenizer/chat/output_parser.h"
#include "tokenizer/utf8.h"

namespace fs {
namespace {

using ojson = nlohmann::ordered_json;

struct Call {
  std::string name, arguments;
  bool complete = true;
  bool operator==(const Call&) const = default;
};

// What a stream of events adds up to; checks the event protocol on the way.
struct Result {
  std::string content, reasoning;
  std::vector<Call> calls;
  std::vector<std::string> ids;
  bool operator==(const Result& o) const {
    return content == o.content && reasoning == o.reasoning && calls == o.calls;
  }
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "content=" << ojson(r.content).dump() << " reasoning=" << ojson(r.reasoning).dump();
  for (const Call& c : r.calls) {
    os << " call{" << c.name << ", " << c.arguments << (c.complete ? "" : ", incomplete") << "}";
  }
  return os;
}

class Collector {
 public:
  void add(const std::vector<OutputEvent>& events) {
    for (const OutputEvent& e : events) {
      switch (e.kind) {
        case OutputEventKind::kText:
        case OutputEventKind::kReasoning:
          EXPECT_FALSE(e.text.empty());
          EXPECT_FALSE(open_) << "text inside a call";
          EXPECT_TRUE(utf8::is_valid(e.text)) << "a piece splits a character";
          (e.kind == OutputEventKind::kText ? r_.content : r_.reasoning) += e.text;
          break;
        case OutputEventKind::kToolCallBegin:
          EXPECT_FALSE(open_);
          EXPECT_EQ(e.index, static_cast<int>(r_.calls.size()));
          EXPECT_FALSE(e.name.empty());
          r_.calls.push_back({e.name, "", true});
          r_.ids.push_back(e.id);
          open_ = true;
          break;
        case OutputEventKind::kToolCallArguments:
          EXPECT_TRUE(open_);
          EXPECT_EQ(e.index, static_cast<int>(r_.calls.size()) - 1);
          EXPECT_TRUE(utf8::is_valid(e.text)) << "a piece splits a character";
          if (!r_.calls.empty()) r_.calls.back().arguments += e.text;
          break;
        case OutputEventKind::kToolCallEnd:
          EXPECT_TRUE(open_);
          EXPECT_EQ(e.index, static_cast<int>(r_.calls.size()) - 1);
          if (!r_.calls.empty()) r_.calls.back().complete = e.complete;
          open_ = false;
          break;
      }
    }
  }
  Result done() {
    EXPECT_FALSE(open_) << "a call was left open";
    return r_;
  }

 private:
  Result r_;
  bool open_ = false;
};

Result whole(std::string_view text, const OutputParserOptions& o) {
  const ParsedOutput p = parse_chat_output(text, o);
  Result r{p.content, p.reasoning, {}, {}};
  for (const auto& c : p.tool_calls) {
    r.calls.push_back({c.name, c.arguments, c.complete});
    r.ids.push_back(c.id);
  }
  return r;
}

Result streamed(const std::vector<std::string_view>& pieces, const OutputParserOptions& o) {
  ChatOutputParser parser(o);
  Collector c;
  for (std::string_view p : pieces) c.add(parser.feed(p));
  c.add(parser.finish());
  return c.done();
}

// Parses `text` whole, then streamed in two pieces at every offset and byte by byte, and checks
// that all agree. Returns the whole-text result.
Result parse_everywhere(std::string_view text, const OutputParserOptions& o) {
  const Result expect = whole(text, o);
  EXPECT_EQ(streamed({text}, o), expect);
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const Result got = streamed({text.substr(0, i), text.substr(i)}, o);
    if (!(got == expect)) {
      ADD_FAILURE() << "split at " << i << " of " << ojson(std::string(text)).dump() << "\n got "
                    << got << "\nwant " << expect;
      break;
    }
  }
  std::vector<std::string_view> bytes;
  for (std::size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  EXPECT_EQ(streamed(bytes, o), expect) << "byte by byte";
  return expect;
}

OutputParserOptions family(ChatFamily f) {
  OutputParserOptions o;
  o.family = f;
  return o;
}

void expect_json_eq(const std::string& text, const char* want) {
  auto got = ojson::parse(text, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << "not JSON: " << text;
  EXPECT_EQ(got, ojson::parse(want)) << text;
}

ChatRequest request(const char* json) {
  auto r = parse_chat_request(ojson::parse(json));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : ChatRequest{};
}

// ---- Qwen ----

TEST(OutputParser, PlainTextPassesThrough) {
  const Result r = parse_everywhere("Hello, wörld: a < b && c > d 😀", family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, "Hello, wörld: a < b && c > d 😀");
  EXPECT_TRUE(r.reasoning.empty());
  EXPECT_TRUE(r.calls.empty());
}

TEST(OutputParser, QwenReasoningIsSplitOut) {
  const Result r = parse_everywhere("<think>\nFirst, 2+2.\n\nThen done.\n</think>\n\nIt is 4.",
                                    family(ChatFamily::kQwen));
  EXPECT_EQ(r.reasoning, "First, 2+2.\n\nThen done.");
  EXPECT_EQ(r.content, "It is 4.");
}

TEST(OutputParser, QwenJsonToolCall) {
  const Result r = parse_everywhere(
      "<think>\nNeed the file.\n</think>\n\nReading it.\n<tool_call>\n{\"name\": \"read_file\", "
      "\"arguments\": {\"path\": \"src/é.txt\", \"lines\": [1, -2.5e3, true, null], \"q\": "
      "\"a\\\"b\\u00e9\"}}\n</tool_call>",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.reasoning, "Need the file.");
  EXPECT_EQ(r.content, "Reading it.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "read_file");
  // The arguments are the object's text as written.
  EXPECT_EQ(r.calls[0].arguments,
            "{\"path\": \"src/é.txt\", \"lines\": [1, -2.5e3, true, null], \"q\": "
            "\"a\\\"b\\u00e9\"}");
  EXPECT_TRUE(r.calls[0].complete);
  ASSERT_EQ(r.ids.size(), 1u);
  EXPECT_EQ(r.ids[0].size(), 5u + 24u);
  EXPECT_EQ(r.ids[0].substr(0, 5), "call_");
  EXPECT_EQ(r.ids[0].find_first_not_of("0123456789abcdef", 5), std::string::npos);
}

TEST(OutputParser, QwenSeveralCallsAndMemberOrder) {
  const Result r = parse_everywhere(
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
      "{\"arguments\": {\"x\": {\"y\": [1]}}, \"id\": 7, \"name\": \"b\"}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"c\"}\n</tool_call>",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0], (Call{"a", "{}", true}));
  // Arguments before the name are held until the name is known; other members are ignored.
  EXPECT_EQ(r.calls[1], (Call{"b", "{\"x\": {\"y\": [1]}}", true}));
  // No arguments member: an empty object.
  EXPECT_EQ(r.calls[2], (Call{"c", "{}", true}));
  const std::set<std::string> ids(r.ids.begin(), r.ids.end());
  EXPECT_EQ(ids.size(), 3u);
}

TEST(OutputParser, WhitespaceAfterCallsIsTheSeparator) {
  Result r = parse_everywhere(
      "A.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\nDone.\n",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, "A.Done.\n");
  EXPECT_EQ(r.calls.size(), 1u);
  r = parse_everywhere("<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n",
                       family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, "");
  // <think> opens reasoning only before any visible text.
  r = parse_everywhere("Use <think> tags.", family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, "Use <think> tags.");
  EXPECT_EQ(r.reasoning, "");
}

TEST(OutputParser, QwenXmlToolCall) {
  const Result r = parse_everywhere(
      "Writing.\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
      "<parameter=content>\ndef f():\n    return \"x\" < 3\n\n</parameter>\n<parameter=mode>\n"
      "420\n</parameter>\n<parameter=opts>\n{\"force\": true}\n</parameter>\n"
      "<parameter=flag>\nfalse\n</parameter>\n<parameter=quoted>\n\"q\"\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=list>\n</function>\n</tool_call>",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, "Writing.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "write_file");
  expect_json_eq(r.calls[0].arguments,
                 R"({"path": "src/a.py", "content": "def f():\n    return \"x\" < 3\n",
                     "mode": 420, "opts": {"force": true}, "flag": false, "quoted": "\"q\""})");
  EXPECT_EQ(r.calls[1], (Call{"list", "{}", true}));
}

TEST(OutputParser, QwenToolCallInsideReasoningStaysReasoning) {
  const Result r = parse_everywhere(
      "<think>\nMaybe <tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call> later.\n"
      "</think>\n\nNo call.",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.reasoning,
            "Maybe <tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call> later.");
  EXPECT_EQ(r.content, "No call.");
  EXPECT_TRUE(r.calls.empty());
}

TEST(OutputParser, TagLookalikesAreText) {
  for (const char* text :
       {"use <tool and <think it over", "a <tool_cal>b</tool_call>", "<toolbox>", "x <thinker> y",
        "ends with <tool_c", "ends <thi", "<tool_call", "a\n", "a\n\n"}) {
    const Result r = parse_everywhere(text, family(ChatFamily::kQwen));
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
}

TEST(OutputParser, OnlyAPossibleTagIsHeldBack) {
  ChatOutputParser p(family(ChatFamily::kQwen));
  auto text_of = [](const std::vector<OutputEvent>& ev) {
    std::string s;
    for (const auto& e : ev) s += e.text;
    return s;
  };
  EXPECT_EQ(text_of(p.feed("Hello <to")), "Hello ");
  EXPECT_EQ(text_of(p.feed("ol")), "");
  EXPECT_EQ(text_of(p.feed("s> are")), "<tools> are");
  // A newline may lead a <tool_call>: it waits for the next byte.
  EXPECT_EQ(text_of(p.feed(" here\n")), " here");
  EXPECT_EQ(text_of(p.feed("x\xC3")), "\nx");  // half a character waits too
  EXPECT_EQ(text_of(p.feed("\xA9")), "\xC3\xA9");
  EXPECT_EQ(text_of(p.finish()), "");
}

TEST(OutputParser, ArgumentsStreamAsWritten) {
  ChatOutputParser p(family(ChatFamily::kQwen));
  EXPECT_TRUE(p.feed("<tool_call>\n{\"name\": \"f\", \"argu").empty());
  auto ev = p.feed("ments\": {\"a\": ");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, OutputEventKind::kToolCallBegin);
  EXPECT_EQ(ev[0].name, "f");
  EXPECT_EQ(ev[1].kind, OutputEventKind::kToolCallArguments);
  EXPECT_EQ(ev[1].text, "{\"a\": ");
  ev = p.feed("[1, 2]");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "[1, 2]");
  ev = p.feed("}}\n</tool_call>");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].text, "}");  // the wrapper's brace is not part of the arguments
  EXPECT_EQ(ev[1].kind, OutputEventKind::kToolCallEnd);
  EXPECT_TRUE(ev[1].complete);
  EXPECT_TRUE(p.finish().empty());
}

TEST(OutputParser, MalformedCallBeforeItStreamsIsText) {
  for (const char* text :
       {"See <tool_call>\n{\"name\": oops}\n</tool_call> done",
        "<tool_call>\nnot json\n</tool_call>", "<tool_call>\n{\"name\": 3, \"arguments\": {}}",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n<function=a b\n</tool_call>"}) {
    const Result r = parse_everywhere(text, family(ChatFamily::kQwen));
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
  // The text after a failed opener is read again: a real call there is found.
  const Result r = parse_everywhere(
      "x\n<tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, "x\n<tool_call>\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], (Call{"f", "{}", true}));
}

TEST(OutputParser, UnterminatedCallBeforeItStreamsIsText) {
  const char* text = "Let me.\n<tool_call>\n{\"name\": \"read_fi";
  const Result r = parse_everywhere(text, family(ChatFamily::kQwen));
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
}

TEST(OutputParser, CallThatBreaksAfterStreamingEndsIncomplete) {
  // Bad JSON inside the arguments: the call keeps the valid text it streamed and ends
  // incomplete; the rest, from the offending byte, is text.
  Result r =
      parse_everywhere("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1 x}}\n</tool_call>",
                       family(ChatFamily::kQwen));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], (Call{"f", "{\"a\": 1 ", false}));
  EXPECT_EQ(r.content, "x}}\n</tool_call>");
  // Cut off inside the arguments (max_tokens): the same, with nothing left over.
  r = parse_everywhere("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"hel",
                       family(ChatFamily::kQwen));
  EXPECT_EQ(r.calls.at(0), (Call{"f", "{\"a\": \"hel", false}));
  EXPECT_EQ(r.content, "");
  // Cut off after complete arguments: the call is complete; the partial close tag is text.
  r = parse_everywhere("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_",
                       family(ChatFamily::kQwen));
  EXPECT_EQ(r.calls.at(0), (Call{"f", "{\"a\": 1}", true}));
  EXPECT_EQ(r.content, "\n</tool_");
  // XML form cut inside a parameter: the object of the parameters that completed, closed; the
  // unfinished parameter is text.
  r = parse_everywhere(
      "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nhal",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.calls.at(0), (Call{"f", "{\"a\": 1}", false}));
  EXPECT_EQ(r.content, "\n<parameter=b>\nhal");
}

TEST(OutputParser, HostileCallsAreBounded) {
  // Nesting past the scanner's bound breaks the call there (no unbounded stack).
  const std::string deep =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(100, '[') +
      std::string(100, ']') + "}}\n</tool_call>";
  Result r = whole(deep, family(ChatFamily::kQwen));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": " + std::string(62, '['));  // 64 open with the wrapper
  EXPECT_EQ(r.content, std::string(38, '[') + std::string(100, ']') + "}}\n</tool_call>");
  // A name longer than 256 bytes is no name: the call is text.
  const std::string long_name =
      "<tool_call>\n<function=" + std::string(300, 'n') + ">\n</function>";
  r = whole(long_name, family(ChatFamily::kQwen));
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, long_name);
}

TEST(OutputParser, QwenTolerances) {
  // The wrapper's closing brace forgotten before </tool_call>.
  Result r =
      parse_everywhere("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>",
                       family(ChatFamily::kQwen));
  EXPECT_EQ(r.calls.at(0), (Call{"f", "{\"a\": 1}", true}));
  EXPECT_EQ(r.content, "");
  // A raw newline inside a string is escaped (JSON forbids it raw).
  r = parse_everywhere(
      "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"s\": \"a\nb\tc\"}}\n</tool_call>",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.calls.at(0), (Call{"w", "{\"s\": \"a\\nb\\tc\"}", true}));
  // XML form: a forgotten </parameter> ends the value at the next tag.
  r = parse_everywhere(
      "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\n2\n</function>\n</tool_call>",
      family(ChatFamily::kQwen));
  EXPECT_EQ(r.calls.at(0), (Call{"f", "{\"a\": \"x\", \"b\": 2}", true}));
}

TEST(OutputParser, OptionsSwitchParsingOff) {
  OutputParserOptions o = family(ChatFamily::kQwen);
  o.parse_tool_calls = false;
  const char* call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  Result r = parse_everywhere(call, o);
  EXPECT_EQ(r.content, call);
  EXPECT_TRUE(r.calls.empty());
  o = family(ChatFamily::kQwen);
  o.parse_reasoning = false;
  r = parse_everywhere("<think>\nr\n</think>\n\nc", o);
  EXPECT_EQ(r.content, "<think>\nr\n</think>\n\nc");
  o = family(ChatFamily::kQwen);
  o.starts_in_reasoning = true;
  r = parse_everywhere("\nthe plan\n</think>\n\nthe answer", o);
  EXPECT_EQ(r.reasoning, "the plan");
  EXPECT_EQ(r.content, "the answer");
  // An unclosed block is reasoning.
  r = parse_everywhere("still thinking <tool_call>\n", o);
  EXPECT_EQ(r.reasoning, "still thinking <tool_call>");
  EXPECT_EQ(r.content, "");
  r = parse_everywhere("cut in the tag </thi", o);
  EXPECT_EQ(r.reasoning, "cut in the tag </thi");
}

TEST(OutputParser, PromptsThatOpenReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(
      prompt_opens_reasoning("<|im_start|>user\nWhat is <think>?<|im_end|>\n"
                             "<|im_start|>assistant\n"));
  // What the renderers write: Qwen3 with thinking off closes the block; DeepSeek V3 has none.
  ChatRequest r = request(R"({"messages": [{"role": "user", "content": "hi"}]})");
  r.add_generation_prompt = true;
  r.enable_thinking = false;
  EXPECT_FALSE(prompt_opens_reasoning(*render_chat(ChatFamily::kQwen, r, {})));
  EXPECT_FALSE(prompt_opens_reasoning(*render_chat(ChatFamily::kDeepSeek, r, {})));
}

// ---- DeepSeek ----

TEST(OutputParser, DeepSeekV3Calls) {
  const Result r = parse_everywhere(
      "<think>Hmm.</"
      "think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
      "get_weather\n```json\n{\"city\": \"東京\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>"
      "function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      family(ChatFamily::kDeepSeek));
  EXPECT_EQ(r.reasoning, "Hmm.");
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (Call{"get_weather", "{\"city\": \"東京\"}", true}));
  EXPECT_EQ(r.calls[1], (Call{"get_time", "{}", true}));
}

TEST(OutputParser, DeepSeekV31Calls) {
  OutputParserOptions o = family(ChatFamily::kDeepSeek);
  o.starts_in_reasoning = true;
  const Result r = parse_everywhere(
      "plan</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"a b\", "
      "\"n\": 3}<｜tool▁call▁end｜><｜tool▁call▁begin｜>open<｜tool▁sep｜>{\"id\": 1}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      o);
  EXPECT_EQ(r.reasoning, "plan");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (Call{"search", "{\"q\": \"a b\", \"n\": 3}", true}));
  EXPECT_EQ(r.calls[1], (Call{"open", "{\"id\": 1}", true}));
}

TEST(OutputParser, DeepSeekBlockWithoutItsEnd) {
  // V3's template writes a single call without <｜tool▁calls▁end｜>; what follows is text.
  const Result r = parse_everywhere(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": "
      "[1]}\n```"
      "<｜tool▁call▁end｜> and more",
      family(ChatFamily::kDeepSeek));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], (Call{"f", "{\"a\": [1]}", true}));
  EXPECT_EQ(r.content, "and more");
}

TEST(OutputParser, DeepSeekDsmlCalls) {
  OutputParserOptions o = family(ChatFamily::kDeepSeek);
  o.starts_in_reasoning = true;
  const Result r = parse_everywhere(
      "Let me look.</think>Looking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
      "name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Zürich 42</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">5</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"unit\": \"C\"}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      o);
  EXPECT_EQ(r.reasoning, "Let me look.");
  EXPECT_EQ(r.content, "Looking.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  expect_json_eq(r.calls[0].arguments,
                 R"({"city": "Zürich 42", "days": 5, "opts": {"unit": "C"}})");
  EXPECT_EQ(r.calls[1], (Call{"now", "{}", true}));
  // V3.2 spells the block function_calls.
  const Result v32 = parse_everywhere(
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" "
      "string=\"true\">007</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
      family(ChatFamily::kDeepSeek));
  EXPECT_EQ(v32.calls.at(0), (Call{"f", "{\"x\": \"007\"}", true}));
}

TEST(OutputParser, DeepSeekMalformed) {
  for (const char* text :
       {"<｜tool▁calls▁begin｜>hello",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"
        "```python\n{}\n```<｜tool▁call▁end｜>",
        "a <｜DSML｜tool_calls>\n<｜DSML｜invoke nam", "<｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]",
        "<｜tool▁calls▁begin｜>\n<｜tool▁calls▁end｜>"}) {
    const Result r = parse_everywhere(text, family(ChatFamily::kDeepSeek));
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
  // Cut inside a DSML parameter: the completed parameters, closed; the rest is text.
  const Result r = parse_everywhere(
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"true\">x</｜DSML｜parameter>\n<｜DSML｜parameter name=\"b\" string=\"true\">y",
      family(ChatFamily::kDeepSeek));
  EXPECT_EQ(r.calls.at(0), (Call{"f", "{\"a\": \"x\"}", false}));
  EXPECT_EQ(r.content, "\n<｜DSML｜parameter name=\"b\" string=\"true\">y");
}

// ---- GLM ----

TEST(OutputParser, GlmCalls) {
  const Result r = parse_everywhere(
      "\n<think>Weather first.</think>\nSure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>北京</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
      "</tool_call>\n<tool_call>now</tool_call><tool_call>f<arg_key>a</arg_key><arg_value>[1, 2]"
      "</arg_value></tool_call>",
      family(ChatFamily::kGlm));
  EXPECT_EQ(r.reasoning, "Weather first.");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0], (Call{"get_weather", "{\"city\": \"北京\", \"days\": 3}", true}));
  EXPECT_EQ(r.calls[1], (Call{"now", "{}", true}));
  EXPECT_EQ(r.calls[2], (Call{"f", "{\"a\": [1, 2]}", true}));
}

TEST(OutputParser, GlmMalformed) {
  for (const char* text : {"<tool_call>\n</tool_call>", "<tool_call>f<arg_value>1</arg_value>",
                           "<tool_call>f\n<arg_key>a</arg_key>x"}) {
    const Result r = parse_everywhere(text, family(ChatFamily::kGlm));
    if (r.calls.empty()) {
      EXPECT_EQ(r.content, text);
    } else {
      // Committed at the name: ends incomplete, the rest is text.
      EXPECT_FALSE(r.calls[0].complete) << text;
    }
  }
  const Result r =
      parse_everywhere("<tool_call>f\n<arg_key>a</arg_key>x", family(ChatFamily::kGlm));
  EXPECT_EQ(r.calls.at(0), (Call{"f", "{}", false}));
  EXPECT_EQ(r.content, "\n<arg_key>a</arg_key>x");
}

// ---- Random text made of the syntaxes' fragments ----

TEST(OutputParser, RandomFragmentsStreamLikeTheWhole) {
  // Seeded, so a failure reproduces; each string is checked whole, byte by byte and at every
  // split, with the event protocol checked throughout.
  const std::vector<std::string_view> fragments = {
      "<tool_call>", "</tool_call>", "\n", " ", "{", "}", "[", "]", "\"name\"", "\"arguments\"",
      ": ", ", ", "\"f\"", "1", "tr", "ue", "\"", "\\", "<think>", "</think>", "é", "😀", "x",
      "<function=g>", "</function>", "<parameter=p>", "</parameter>", "<arg_key>", "</arg_key>",
      "<arg_value>", "</arg_value>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
      "<｜tool▁sep｜>", "function", "```json", "```", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>",
      "<｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"h\">",
      "<｜DSML｜parameter name=\"q\" string=\"true\">", "</｜DSML｜parameter>", "</｜DSML｜invoke>",
      "</｜DSML｜tool_calls>", "<", "<tool", "<｜",
      // Whole calls, so that valid ones occur among the broken.
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1]}}\n</tool_call>",
      "<tool_call>\n<function=g>\n<parameter=p>\n2\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>k\n<arg_key>a</arg_key>\n<arg_value>v</arg_value>\n</tool_call>",
      "<｜tool▁call▁begin｜>m<｜tool▁sep｜>{\"b\": null}<｜tool▁call▁end｜>",
      "<｜DSML｜invoke name=\"h\">\n<｜DSML｜parameter name=\"q\" string=\"false\">[]"
      "</｜DSML｜parameter>\n</｜DSML｜invoke>"};
  std::mt19937 rng(12);
  std::size_t calls = 0;
  for (const ChatFamily f : {ChatFamily::kQwen, ChatFamily::kDeepSeek, ChatFamily::kGlm}) {
    for (int n = 0; n < 150; ++n) {
      std::string text;
      const int parts = 1 + static_cast<int>(rng() % 24);
      for (int k = 0; k < parts; ++k) text += fragments[rng() % fragments.size()];
      OutputParserOptions o = family(f);
      o.starts_in_reasoning = rng() % 4 == 0;
      SCOPED_TRACE(ojson(text).dump());
      calls += parse_everywhere(text, o).calls.size();
      // Nothing lost: without reasoning, text with no call in it comes back whole (less the
      // whitespace that starts the output).
      o.parse_reasoning = false;
      const Result plain = whole(text, o);
      if (plain.calls.empty()) {
        EXPECT_EQ(plain.content, text.substr(std::min(text.find_first_not_of(" \n"), text.size())));
      }
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(calls, 50u);  // the mix does hold calls
}

// ---- Round trips through the renderers ----

// The part of `prompt` after the last `marker`, up to `end` (or the end of the prompt).
std::string generated_part(const std::string& prompt, std::string_view marker,
                           std::string_view end) {
  const std::size_t at = prompt.rfind(marker);
  EXPECT_NE(at, std::string::npos);
  std::string part = prompt.substr(at + marker.size());
  if (!end.empty() && part.ends_with(end)) part.resize(part.size() - end.size());
  return part;
}

void expect_round_trip(ChatFamily f, const ChatRequest& req, std::string_view marker,
                       std::string_view end) {
  auto prompt = render_chat(f, req, {});
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  const std::string part = generated_part(*prompt, marker, end);
  const Result r = parse_everywhere(part, family(f));
  const ChatMessage& m = req.messages.back();
  EXPECT_EQ(r.content, m.text()) << part;
  EXPECT_EQ(r.reasoning, m.reasoning_content.value_or("")) << part;
  ASSERT_EQ(r.calls.size(), m.tool_calls.size()) << part;
  for (std::size_t i = 0; i < r.calls.size(); ++i) {
    EXPECT_EQ(r.calls[i].name, m.tool_calls[i].name);
    EXPECT_TRUE(r.calls[i].complete);
    const ojson& want = m.tool_calls[i].arguments;
    EXPECT_EQ(ojson::parse(r.calls[i].arguments),
              want.is_string() ? ojson::parse(want.get<std::string>()) : want)
        << r.calls[i].arguments;
  }
}

constexpr const char* kTools = R"("tools": [{"type": "function", "function": {"name": "read"}}])";

TEST(OutputParser, RoundTripsQwen) {
  const std::string calls = R"("tool_calls": [
      {"type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a b/ü.txt\"}"}},
      {"type": "function", "function": {"name": "grep", "arguments": {"pattern": "<tool_call>",
        "n": 2, "deep": {"x": [true, null]}}}}])";
  for (
      const std::string& msg :
      {R"({"role": "assistant", "content": "Two calls:\nhere.", "reasoning_content": "Think\n\nhard.", )" +
           calls + "}",
       R"({"role": "assistant", "content": "", "reasoning_content": "R", )" + calls + "}",
       std::string(
           R"({"role": "assistant", "content": "Just text 😀", "reasoning_content": "why"})")}) {
    SCOPED_TRACE(msg);
    const ChatRequest req = request(
        (R"({"messages": [{"role": "user", "content": "go"}, )" + msg + "], " + kTools + "}")
            .c_str());
    expect_round_trip(ChatFamily::kQwen, req, "<|im_start|>assistant\n", "<|im_end|>\n");
  }
}

TEST(OutputParser, RoundTripsDeepSeek) {
  // The V3 template drops the tool calls of a turn that has content, so calls go without.
  for (const char* msg : {R"({"role": "assistant", "content": null, "tool_calls": [
            {"type": "function", "function": {"name": "read", "arguments": "{\"path\": \"x\"}"}}]})",
                          R"({"role": "assistant", "content": null, "tool_calls": [
            {"type": "function", "function": {"name": "read", "arguments": {"path": "é"}}},
            {"type": "function", "function": {"name": "ls", "arguments": {}}}]})",
                          R"({"role": "assistant", "content": "Plain answer."})"}) {
    SCOPED_TRACE(msg);
    const ChatRequest req =
        request((std::string(R"({"messages": [{"role": "user", "content": "go"}, )") + msg + "], " +
                 kTools + "}")
                    .c_str());
    expect_round_trip(ChatFamily::kDeepSeek, req, "<｜Assistant｜>", "<｜end▁of▁sentence｜>");
  }
}

TEST(OutputParser, RoundTripsGlm) {
  for (const char* msg :
       {R"({"role": "assistant", "content": "On it.", "reasoning_content": "Plan.", "tool_calls": [
            {"type": "function", "function": {"name": "read", "arguments": {"path": "a.txt",
              "lines": [1, 2], "all": false}}},
            {"type": "function", "function": {"name": "ls", "arguments": "{}"}}]})",
        R"({"role": "assistant", "content": "Answer.", "reasoning_content": "Why."})"}) {
    SCOPED_TRACE(msg);
    const ChatRequest req =
        request((std::string(R"({"messages": [{"role": "user", "content": "go"}, )") + msg + "], " +
                 kTools + "}")
                    .c_str());
    expect_round_trip(ChatFamily::kGlm, req, "<|assistant|>", "");
  }
}

}  // namespace
}  // namespace fs
