// Chat rendering units: message parsing and its errors, the tojson writer, family detection and
// the best-effort GLM format. Byte parity with the real Qwen3 and DeepSeek V3 templates is checked
// by the tokenizer.cli_parity test against @huggingface/jinja.
#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/chat/chat.h"

namespace fs {
namespace {

using ojson = nlohmann::ordered_json;

ChatRequest parse(const char* text) {
  auto r = parse_chat_request(ojson::parse(text));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : ChatRequest{};
}

TEST(Chat, ParsesOpenAiMessages) {
  const ChatRequest r = parse(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
        "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "ok"}],
    "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].text(), "ab");
  EXPECT_FALSE(r.messages[1].content.has_value());
  EXPECT_EQ(r.messages[1].text(), "");
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "f");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(r.messages[2].tool_call_id, "1");
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(parse(R"([{"role": "developer", "content": "x"}])").messages[0].role, "system");
}

TEST(Chat, RejectsMalformedMessages) {
  for (const char* bad :
       {R"([])", R"({"x": 1})", R"([{"content": "no role"}])",
        R"([{"role": "wizard", "content": ""}])", R"([{"role": "user", "content": 5}])",
        R"([{"role": "user", "content": [{"type": "image_url"}]}])",
        R"([{"role": "assistant", "tool_calls": [{"function": {}}]}])",
        R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})"}) {
    auto r = parse_chat_request(ojson::parse(bad));
    EXPECT_FALSE(r.ok()) << bad;
  }
  test::ScratchDir dir;
  test::write_text(dir.file("m.json"), "[{oops");
  auto r = parse_chat_request_file(dir.file("m.json"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("m.json"), std::string::npos);
}

TEST(Chat, ToJsonMatchesTheReferenceJinja) {
  const ojson j =
      ojson::parse(R"({"b": 1, "a": [true, null, 0.5, 2.0, -3], "s": "q\"\\\n\u0001é😀/"})");
  // Keys keep input order; integral floats print without a fraction; non-ASCII stays as is.
  EXPECT_EQ(to_json_text(j),
            "{\"b\": 1, \"a\": [true, null, 0.5, 2, -3], \"s\": \"q\\\"\\\\\\n\\u0001é😀/\"}");
  EXPECT_EQ(to_json_text(ojson(1e21)), "1e+21");
  EXPECT_EQ(to_json_text(ojson(1.5e-7)), "1.5e-7");
}

TEST(Chat, DetectsTheFamily) {
  test::ScratchDir dir;
  EXPECT_EQ(*detect_chat_family(dir.path().string(), "{{'<|im_start|>'}}"), ChatFamily::kQwen);
  EXPECT_EQ(*detect_chat_family(dir.path().string(), "{{'<｜User｜>'}}"), ChatFamily::kDeepSeek);
  EXPECT_EQ(*detect_chat_family(dir.path().string(), "[gMASK]<sop>"), ChatFamily::kGlm);
  EXPECT_FALSE(detect_chat_family(dir.path().string(), "").ok());
  test::write_text(dir.file("config.json"), R"({"model_type": "glm5_next"})");
  EXPECT_EQ(*detect_chat_family(dir.path().string(), "<|im_start|>"), ChatFamily::kGlm);
  EXPECT_FALSE(chat_family_from_name("llama").ok());
}

TEST(Chat, GlmBestEffortFormat) {
  ChatRequest r = parse(R"({"messages": [
      {"role": "system", "content": "Be nice."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "<think>check</think>Calling.", "tool_calls": [
        {"type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
      {"role": "tool", "content": "cold"}],
    "tools": [{"name": "get"}]})");
  r.add_generation_prompt = true;
  r.enable_thinking = false;
  auto text = render_chat(ChatFamily::kGlm, r, {});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(
      *text,
      "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with the "
      "user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML "
      "tags:\n<tools>\n{\"name\": \"get\"}\n"
      "</tools>\n\nFor each function call, output the function name and arguments within the "
      "following XML "
      "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</"
      "arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
      "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
      "<|system|>\nBe nice.<|user|>\nWeather?/nothink<|assistant|>\n<think>check</think>\nCalling."
      "\n<tool_call>get\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</"
      "arg_key>\n"
      "<arg_value>2</arg_value>\n</tool_call><|observation|>\n<tool_response>\ncold\n</"
      "tool_response>"
      "<|assistant|>\n<think></think>");
}

TEST(Chat, QwenThinkingSwitchAndDeepSeekBos) {
  ChatRequest r = parse(R"([{"role": "user", "content": "hi"}])");
  r.add_generation_prompt = true;
  EXPECT_EQ(*render_chat(ChatFamily::kQwen, r, {}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  r.enable_thinking = false;
  EXPECT_EQ(*render_chat(ChatFamily::kQwen, r, {}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeek, r, {"<s>"}), "<s><｜User｜>hi<｜Assistant｜>");
}

}  // namespace
}  // namespace fs
