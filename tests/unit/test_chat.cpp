// Chat rendering units: message parsing and its errors, the tojson writer, family detection, the
// GLM 5.3 and DeepSeek V4 formats (exact prompts, thinking on and off, tools and results). Byte
// parity with the real Qwen3 and DeepSeek V3 templates is checked by the tokenizer.cli_parity test
// against @huggingface/jinja.
#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/chat/output_parser.h"

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
  test::write_text(dir.file("config.json"), R"({"model_type": "deepseek_v4"})");
  EXPECT_EQ(*detect_chat_family(dir.path().string(), ""), ChatFamily::kDeepSeekV4);
  test::write_text(dir.file("config.json"), R"({"model_type": "deepseek_v3"})");
  EXPECT_EQ(*detect_chat_family(dir.path().string(), ""), ChatFamily::kDeepSeek);
  EXPECT_EQ(*chat_family_from_name("deepseek_v4"), ChatFamily::kDeepSeekV4);
  EXPECT_FALSE(chat_family_from_name("llama").ok());
}

// GLM 5.3's template (glm.cpp): no newlines between parts, the reasoning-effort line, every
// assistant turn with its think block, one observation per tool result, tools without
// defer_loading/strict.
TEST(Chat, Glm53Format) {
  ChatRequest r = parse(R"({"messages": [
      {"role": "system", "content": "Be nice."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "<think>check</think>Calling.", "tool_calls": [
        {"type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
      {"role": "tool", "content": "cold"},
      {"role": "tool", "content": "wet"},
      {"role": "assistant", "content": " It is cold. "},
      {"role": "user", "content": "Thanks"}],
    "tools": [{"type": "function", "function": {"name": "get", "strict": true, "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "later", "defer_loading": true}}]})");
  r.add_generation_prompt = true;
  auto text = render_chat(ChatFamily::kGlm, r, {});
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>\n# Tools\n\nYou may call one "
            "or more functions to assist with the user query.\n\nYou are provided with function "
            "signatures within <tools></tools> XML tags:\n<tools>\n{\"name\": \"get\", "
            "\"parameters\": {\"type\": \"object\"}}\n</tools>\n\nFor each function call, output "
            "the function name and arguments within the following XML format:\n<tool_call>"
            "{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
            "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
            "<|system|>Be nice.<|user|>Weather?<|assistant|><think>check</think>Calling."
            "<tool_call>get<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days"
            "</arg_key><arg_value>2</arg_value></tool_call><|observation|><tool_response>cold"
            "</tool_response><|observation|><tool_response>wet</tool_response><|assistant|>"
            "<think></think>It is cold.<|user|>Thanks<|assistant|><think>");
}

TEST(Chat, Glm53ThinkingSwitchAndEffort) {
  ChatRequest r = parse(R"([{"role": "user", "content": "hi"}])");
  r.add_generation_prompt = true;
  EXPECT_EQ(*render_chat(ChatFamily::kGlm, r, {}),
            "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>hi<|assistant|><think>");
  r.enable_thinking = false;
  r.reasoning_effort = "low";
  EXPECT_EQ(*render_chat(ChatFamily::kGlm, r, {}),
            "[gMASK]<sop><|system|>Reasoning Effort: Low<|user|>hi<|assistant|><think></think>");
  r.reasoning_effort = "medium";  // not a level of the template: Max
  r.enable_thinking = true;
  EXPECT_EQ(*render_chat(ChatFamily::kGlm, r, {}),
            "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>hi<|assistant|><think>");
}

// DeepSeek V4 (deepseek_v4.cpp, after the release's encoding_dsv4.py).
TEST(Chat, DeepSeekV4ThinkingSwitch) {
  ChatRequest r = parse(R"([{"role": "system", "content": "S"},
      {"role": "user", "content": "a"},
      {"role": "assistant", "content": "x", "reasoning_content": "r"},
      {"role": "user", "content": "b"}])");
  r.add_generation_prompt = true;
  const ChatSpecialTokens bos{"<B>"};
  // The default is chat mode: every turn opened with </think>.
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeekV4, r, bos),
            "<B>S<｜User｜>a<｜Assistant｜></think>x<｜end▁of▁sentence｜><｜User｜>b"
            "<｜Assistant｜></think>");
  r.enable_thinking = false;
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeekV4, r, bos),
            "<B>S<｜User｜>a<｜Assistant｜></think>x<｜end▁of▁sentence｜><｜User｜>b"
            "<｜Assistant｜></think>");
  // Thinking: the last turn opens <think>; the earlier one loses its reasoning (no tools).
  r.enable_thinking = true;
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeekV4, r, bos),
            "<B>S<｜User｜>a<｜Assistant｜></think>x<｜end▁of▁sentence｜><｜User｜>b"
            "<｜Assistant｜><think>");
  // No generation prompt: the conversation as it stands; without a bos token the release's.
  r.add_generation_prompt = false;
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeekV4, r, {}),
            "<｜begin▁of▁sentence｜>S<｜User｜>a<｜Assistant｜></think>x<｜end▁of▁sentence｜>"
            "<｜User｜>b");
}

constexpr std::string_view kDsv4ToolsPrompt =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter "
    "name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set "
    "`string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value "
    "in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by "
    "<think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool "
    "calls or final response.\n\nOtherwise, output directly after </think> with tool calls or "
    "final response.\n\n### Available Tool Schemas\n\n"
    "{\"name\": \"get\", \"parameters\": {\"type\": \"object\"}}\n"
    "{\"name\": \"now\"}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n";

TEST(Chat, DeepSeekV4ToolsAndResults) {
  const char* body = R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "reasoning_content": "need data", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}},
        {"id": "c2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
      {"role": "tool", "tool_call_id": "c1", "content": "cold"}],
    "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "now"}}]})";
  ChatRequest r = parse(body);
  r.add_generation_prompt = true;
  r.enable_thinking = true;
  const std::string calls =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get\">\n<｜DSML｜parameter name=\"city\" "
      "string=\"true\">Oslo</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" "
      "string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n"
      "\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
  // With tools every turn keeps its reasoning; the results merge into one user turn in the
  // calls' order.
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeekV4, r, {"<B>"}),
            "<B>Be brief.\n\n" + std::string(kDsv4ToolsPrompt) +
                "<｜User｜>Weather?<｜Assistant｜><think>need data</think>" + calls +
                "<｜User｜><tool_result>cold</tool_result>\n\n<tool_result>12:00</tool_result>"
                "<｜Assistant｜><think>");
  r.enable_thinking = false;
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeekV4, r, {"<B>"}),
            "<B>Be brief.\n\n" + std::string(kDsv4ToolsPrompt) +
                "<｜User｜>Weather?<｜Assistant｜></think>" + calls +
                "<｜User｜><tool_result>cold</tool_result>\n\n<tool_result>12:00</tool_result>"
                "<｜Assistant｜></think>");
  // No system message: the tools go into an empty one put first.
  ChatRequest bare = parse(R"({"messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "now"}}]})");
  bare.add_generation_prompt = true;
  EXPECT_EQ(*render_chat(ChatFamily::kDeepSeekV4, bare, {"<B>"}),
            "<B>\n\n" + std::string(kDsv4ToolsPrompt) + "<｜User｜>hi<｜Assistant｜></think>");
}

// What the renderers write for an assistant turn, the output parser reads back.
TEST(Chat, Glm53AndDeepSeekV4CallsParseBack) {
  ChatRequest r = parse(R"({"messages": [{"role": "user", "content": "q"},
      {"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]}],
    "tools": [{"type": "function", "function": {"name": "get"}}]})");
  r.enable_thinking = true;
  for (const ChatFamily family : {ChatFamily::kGlm, ChatFamily::kDeepSeekV4}) {
    auto text = render_chat(family, r, {"<B>"});
    ASSERT_TRUE(text.ok());
    // The assistant turn's output: what follows the last opening of an assistant turn.
    const std::string marker = family == ChatFamily::kGlm ? "<|assistant|><think>" : "<think>";
    std::string out = text->substr(text->rfind(marker) + marker.size());
    if (family == ChatFamily::kDeepSeekV4) out = out.substr(0, out.rfind("<｜end▁of▁sentence｜>"));
    OutputParserOptions o;
    o.family = family;
    o.starts_in_reasoning = true;
    const ParsedOutput p = parse_chat_output(out, o);
    EXPECT_EQ(p.content, "ok") << chat_family_name(family);
    ASSERT_EQ(p.tool_calls.size(), 1u) << chat_family_name(family) << ": " << out;
    EXPECT_EQ(p.tool_calls[0].name, "get");
    EXPECT_EQ(p.tool_calls[0].arguments, "{\"city\": \"Oslo\", \"days\": 2}");
  }
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
