// What coding agents send and receive: Anthropic Messages and OpenAI chat requests with tools,
// tool results, thinking and logprobs (shapes from the clients' documented examples and from
// Claude Code's real request), tool_choice forcing, and the output glue (model text -> parser
// events -> response bodies and stream events), checked event by event.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/assistant_output.h"
#include "server/format.h"
#include "server/request.h"

namespace fs::server {
namespace {

using json = nlohmann::json;

const RequestLimits kLimits;

GenerationRequest ok(const ParsedRequest& p) {
  if (const auto* e = std::get_if<ApiError>(&p)) {
    ADD_FAILURE() << "unexpected error: " << e->param << ": " << e->message;
    return {};
  }
  return std::get<GenerationRequest>(p);
}

ApiError error_of(const ParsedRequest& p) {
  if (const auto* e = std::get_if<ApiError>(&p)) return *e;
  ADD_FAILURE() << "expected an error";
  return {};
}

// The weather tool of Anthropic's tool-use guide.
const char* kAnthropicWeatherTool = R"({
  "name": "get_weather",
  "description": "Get the current weather in a given location",
  "input_schema": {"type": "object",
    "properties": {"location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["location"]}})";

std::string anthropic_body(const std::string& extra, const std::string& messages) {
  return std::string(R"({"model": "claude-sonnet-4-5", "max_tokens": 1024, "tools": [)") +
         kAnthropicWeatherTool + "], \"messages\": " + messages + extra + "}";
}

// The shape of Claude Code 2.1's first request (issue 12): a system-role message inside
// `messages`, a `system` block array with cache_control, tools, adaptive thinking, and fields the
// server does not use.
TEST(ServerAgentAnthropic, ClaudeCodeRequestShapeIsAccepted) {
  const auto r = ok(parse_anthropic_messages(R"({
    "model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "stream": true,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                   {"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral"}}]},
      {"role": "system", "content": "Later system note."}],
    "tools": [{"name": "Bash", "description": "Run a command",
               "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                "required": ["command"], "additionalProperties": false,
                                "$schema": "http://json-schema.org/draft-07/schema#"},
               "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "metadata": {"user_id": "user_abc_account__session_1"},
    "service_tier": "auto", "container": null, "mcp_servers": [], "some_future_field": {"x": [1]}})",
                                             kLimits));
  EXPECT_EQ(r.kind, ApiKind::kMessages);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.max_tokens, 32000);  // clamped to the context when the job is made, not refused
  ASSERT_EQ(r.chat.messages.size(), 2u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  // `system` first, then the system-role messages, in order.
  EXPECT_EQ(r.chat.messages[0].text(), "You are Claude Code.Be concise.\n\nLater system note.");
  EXPECT_EQ(r.chat.messages[1].role, "user");
  EXPECT_EQ(r.chat.messages[1].text(), "<system-reminder>ctx</system-reminder>list the files");
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0]["type"], "function");
  EXPECT_EQ(r.chat.tools[0]["function"]["name"], "Bash");
  EXPECT_EQ(r.chat.tools[0]["function"]["description"], "Run a command");
  EXPECT_EQ(r.chat.tools[0]["function"]["parameters"]["required"][0], "command");
  EXPECT_FALSE(r.chat.tools[0].contains("cache_control"));
  EXPECT_EQ(r.chat.enable_thinking, std::optional<bool>(true));
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::kAuto);
}

// Anthropic's tool-use guide: a tool_use turn and its tool_result (a string, a block list, an
// error), as the OpenAI-shaped message list the templates render.
TEST(ServerAgentAnthropic, ToolUseAndToolResultBlocks) {
  const auto r = ok(parse_anthropic_messages(anthropic_body("", R"J([
    {"role": "user", "content": "What's the weather like in San Francisco?"},
    {"role": "assistant", "content": [
      {"type": "text", "text": "I'll check."},
      {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
       "input": {"location": "San Francisco, CA", "unit": "celsius"}}]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9", "content": "15 degrees"},
      {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "sunny"}]},
      {"type": "tool_result", "tool_use_id": "toolu_3", "is_error": true,
       "content": "ConnectionError: the weather service API is not available (HTTP 500)"},
      {"type": "tool_result", "tool_use_id": "toolu_4"},
      {"type": "text", "text": "Thanks!"}]}])J"),
                                             kLimits));
  const auto& m = r.chat.messages;
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[1].role, "assistant");
  EXPECT_EQ(m[1].text(), "I'll check.");
  ASSERT_EQ(m[1].tool_calls.size(), 1u);
  EXPECT_EQ(m[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(
      m[1].tool_calls[0].arguments,
      nlohmann::ordered_json::parse(R"({"location": "San Francisco, CA", "unit": "celsius"})"));
  EXPECT_EQ(m[2].role, "tool");
  EXPECT_EQ(m[2].tool_call_id, "toolu_01A09q90qw90lq917835lq9");
  EXPECT_EQ(m[2].text(), "15 degrees");
  EXPECT_EQ(m[3].text(), "sunny");
  EXPECT_EQ(m[4].text(),
            "Error: ConnectionError: the weather service API is not available (HTTP 500)");
  EXPECT_EQ(m[5].text(), "");
  EXPECT_EQ(m[6].role, "user");
  EXPECT_EQ(m[6].text(), "Thanks!");
  // An assistant turn of tool calls only has no content (DeepSeek's template tells them apart).
  const auto calls_only = ok(parse_anthropic_messages(anthropic_body("", R"([
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}])"),
                                                      kLimits));
  EXPECT_FALSE(calls_only.chat.messages[1].content.has_value());
  // The Qwen template renders the call and the result.
  const auto prompt = render_chat(ChatFamily::kQwen, r.chat, {});
  ASSERT_TRUE(prompt.ok());
  EXPECT_NE(prompt->find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
                         "\"San Francisco, CA\", \"unit\": \"celsius\"}}\n</tool_call>"),
            std::string::npos)
      << *prompt;
  EXPECT_NE(prompt->find("<tool_response>\n15 degrees\n</tool_response>"), std::string::npos);
  EXPECT_NE(prompt->find("\"name\": \"get_weather\", \"description\": \"Get the current weather"),
            std::string::npos);
}

// Anthropic's extended-thinking guide: thinking blocks of earlier turns come back with their
// signature; redacted_thinking is opaque.
TEST(ServerAgentAnthropic, ThinkingConfigAndBlocks) {
  const auto r = ok(parse_anthropic_messages(
      anthropic_body(R"(, "thinking": {"type": "enabled", "budget_tokens": 10000})", R"([
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "The user wants Paris weather.", "signature": "WaUjzkypQ2mUEVM36O2T"},
      {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"location": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "14C"}]}])"),
      kLimits));
  EXPECT_EQ(r.chat.enable_thinking, std::optional<bool>(true));
  EXPECT_EQ(r.thinking_budget, std::optional<std::int64_t>(10000));
  EXPECT_EQ(r.chat.messages[1].reasoning_content,
            std::optional<std::string>("The user wants Paris weather."));
  EXPECT_EQ(r.chat.messages[1].tool_calls.size(), 1u);

  const auto thinking = [](const std::string& t) {
    return parse_anthropic_messages(
        R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": )" + t +
            "}",
        kLimits);
  };
  EXPECT_EQ(ok(thinking(R"({"type": "disabled"})")).chat.enable_thinking,
            std::optional<bool>(false));
  EXPECT_EQ(ok(thinking(R"({"type": "adaptive"})")).chat.enable_thinking,
            std::optional<bool>(true));
  EXPECT_FALSE(ok(thinking("null")).chat.enable_thinking.has_value());  // the template's default
  EXPECT_EQ(error_of(thinking(R"({"type": "enabled"})")).param, "thinking.budget_tokens");
  EXPECT_EQ(error_of(thinking(R"({"type": "enabled", "budget_tokens": "lots"})")).param,
            "thinking.budget_tokens");
  EXPECT_EQ(error_of(thinking(R"({"type": "deep"})")).param, "thinking.type");
  EXPECT_EQ(error_of(thinking(R"("on")")).param, "thinking");
}

TEST(ServerAgentAnthropic, ToolChoice) {
  const auto choice = [](const std::string& c) {
    return parse_anthropic_messages(
        anthropic_body(", \"tool_choice\": " + c, R"([{"role": "user", "content": "x"}])"),
        kLimits);
  };
  EXPECT_EQ(ok(choice(R"({"type": "auto"})")).tool_choice.mode, ToolChoice::Mode::kAuto);
  // "any" with the one tool of the request is a call of that tool.
  const auto any = ok(choice(R"({"type": "any"})"));
  EXPECT_EQ(any.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(any.tool_choice.name, "get_weather");
  const auto tool =
      ok(choice(R"({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true})"));
  EXPECT_EQ(tool.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(tool.tool_choice.name, "get_weather");
  EXPECT_FALSE(tool.tool_choice.parallel);
  // none: the tools leave the prompt, and the output is not searched for calls.
  const auto none = ok(choice(R"({"type": "none"})"));
  EXPECT_EQ(none.tool_choice.mode, ToolChoice::Mode::kNone);
  EXPECT_TRUE(none.chat.tools.empty());
  EXPECT_FALSE(plan_output(ChatFamily::kQwen, none, "").output.parser.parse_tool_calls);

  EXPECT_EQ(error_of(choice(R"({"type": "tool", "name": "nope"})")).param, "tool_choice");
  EXPECT_EQ(error_of(choice(R"({"type": "tool"})")).param, "tool_choice.name");
  EXPECT_EQ(error_of(choice(R"({"type": "sometimes"})")).param, "tool_choice.type");
  EXPECT_EQ(error_of(choice(R"("auto")")).param, "tool_choice");
  EXPECT_EQ(error_of(choice(R"({"type": "any", "disable_parallel_tool_use": "yes"})")).param,
            "tool_choice.disable_parallel_tool_use");
  EXPECT_EQ(error_of(parse_anthropic_messages(
                         R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                             "tool_choice": {"type": "any"}})",
                         kLimits))
                .param,
            "tool_choice");
}

// Wrong types of the fields the server reads are 400s naming the field; images are refused
// with a message that says why.
TEST(ServerAgentAnthropic, WrongTypesNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"max_tokens": 5, "system": 5, "messages": [{"role": "user", "content": "x"}]})",
       "system"},
      {R"({"max_tokens": 5, "system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]})",
       "system[0].type"},
      {R"({"max_tokens": 5, "tools": "x", "messages": [{"role": "user", "content": "x"}]})",
       "tools"},
      {R"({"max_tokens": 5, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "x"}]})",
       "tools[0].input_schema"},
      {R"({"max_tokens": 5, "tools": [{"name": 5, "input_schema": {}}], "messages": [{"role": "user", "content": "x"}]})",
       "tools[0].name"},
      {R"({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}], "messages": [{"role": "user", "content": "x"}]})",
       "tools[0].type"},
      {R"({"max_tokens": 5, "metadata": 5, "messages": [{"role": "user", "content": "x"}]})",
       "metadata"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]})",
       "messages[0].content[0].is_error"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})",
       "messages[0].content[0].tool_use_id"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]})",
       "messages[1].content[0].input"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": 5}]}]})",
       "messages[1].content[0].thinking"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}]}]})",
       "messages[0].content[1].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]})",
       "messages[0].content[0].content[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "only a system prompt"}]})",
       "messages"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = error_of(parse_anthropic_messages(body, kLimits));
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
    EXPECT_NE(e.message.find(param.substr(0, param.find('.'))), std::string::npos) << e.message;
  }
  const ApiError image = error_of(parse_anthropic_messages(cases[12].first, kLimits));
  EXPECT_NE(image.message.find("text only"), std::string::npos) << image.message;
}

TEST(ServerAgentAnthropic, CountTokensTakesToolsSystemAndThinking) {
  const auto r = ok(parse_anthropic_count_tokens(
      std::string(
          R"({"model": "m", "system": "s", "thinking": {"type": "enabled", "budget_tokens": 2000}, "tools": [)") +
          kAnthropicWeatherTool + R"(], "messages": [{"role": "user", "content": "x"}]})",
      kLimits));
  EXPECT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  EXPECT_EQ(r.chat.enable_thinking, std::optional<bool>(true));
}

// OpenAI's function-calling guide: tools, the assistant's tool_calls, the tool message.
TEST(ServerAgentOpenAi, FunctionCallingRequests) {
  const std::string tools = R"("tools": [{"type": "function", "function": {
      "name": "get_weather", "description": "Get current temperature for a given location.",
      "parameters": {"type": "object", "properties": {"location": {"type": "string",
        "description": "City and country e.g. Bogotá, Colombia"}}, "required": ["location"],
        "additionalProperties": false}, "strict": true}}])";
  const auto r = ok(parse_openai_chat(R"({"model": "gpt-4.1", )" + tools + R"(,
    "messages": [
      {"role": "developer", "content": "You are terse."},
      {"role": "user", "content": "What is the weather like in Paris today?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_12345xyz", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris, France\"}"}}]},
      {"role": "tool", "tool_call_id": "call_12345xyz", "content": "14"}],
    "tool_choice": "auto", "parallel_tool_calls": false, "reasoning_effort": "low",
    "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 50,
    "stream": true, "stream_options": {"include_usage": true}, "store": false,
    "metadata": {"k": "v"}, "user": "u", "service_tier": "auto", "prompt_cache_key": "abc",
    "response_format": {"type": "text"}, "a_future_field": [1, 2]})",
                                      kLimits));
  ASSERT_EQ(r.chat.messages.size(), 4u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  EXPECT_EQ(r.chat.messages[2].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.chat.messages[3].tool_call_id, "call_12345xyz");
  EXPECT_EQ(r.chat.tools.size(), 1u);
  EXPECT_FALSE(r.tool_choice.parallel);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.max_tokens, 50);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.chat.enable_thinking.has_value());  // "low": the template's default

  const auto with = [&](const std::string& extra) {
    return parse_openai_chat(
        R"({"messages": [{"role": "user", "content": "x"}], )" + tools + ", " + extra + "}",
        kLimits);
  };
  // "required" with one tool is a call of that tool (its name forced too); with two, the model
  // picks the tool.
  const auto required = ok(with(R"("tool_choice": "required")"));
  EXPECT_EQ(required.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(required.tool_choice.name, "get_weather");
  const std::string second = R"({"type": "function", "function": {"name": "get_time",
      "parameters": {"type": "object", "properties": {}}}})";
  const auto two = ok(parse_openai_chat(R"({"messages": [{"role": "user", "content": "x"}], )" +
                                            tools.substr(0, tools.size() - 1) + ", " + second +
                                            R"(], "tool_choice": "required"})",
                                        kLimits));
  EXPECT_EQ(two.chat.tools.size(), 2u);
  EXPECT_EQ(two.tool_choice.mode, ToolChoice::Mode::kRequired);
  const auto named =
      ok(with(R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(named.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(named.tool_choice.name, "get_weather");
  const auto none = ok(with(R"("tool_choice": "none")"));
  EXPECT_TRUE(none.chat.tools.empty());
  EXPECT_EQ(ok(with(R"("reasoning_effort": "none")")).chat.enable_thinking,
            std::optional<bool>(false));
  EXPECT_EQ(ok(with(R"("chat_template_kwargs": {"enable_thinking": false})")).chat.enable_thinking,
            std::optional<bool>(false));
  EXPECT_EQ(ok(with(R"("enable_thinking": true)")).chat.enable_thinking, std::optional<bool>(true));
}

TEST(ServerAgentOpenAi, WrongTypesNameTheField) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string tool = R"({"type": "function", "function": {"name": "f", "parameters": {}}})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("tools": {})", "tools"},
      {R"("tools": [5])", "tools[0]"},
      {R"("tools": [{"type": "custom", "custom": {"name": "f"}}])", "tools[0].type"},
      {R"("tools": [{"type": "function"}])", "tools[0].function"},
      {R"("tools": [{"type": "function", "function": {"name": 5}}])", "tools[0].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}])",
       "tools[0].function.parameters"},
      {R"("tools": [)" + tool + R"(], "tool_choice": "sometimes")", "tool_choice"},
      {R"("tools": [)" + tool +
           R"(], "tool_choice": {"type": "function", "function": {"name": "g"}})",
       "tool_choice"},
      {R"("tool_choice": "required")", "tool_choice"},
      {R"("tools": [)" + tool + R"(], "parallel_tool_calls": "yes")", "parallel_tool_calls"},
      {R"("logprobs": "yes")", "logprobs"},
      {R"("logprobs": true, "top_logprobs": 21)", "top_logprobs"},
      {R"("top_logprobs": 2)", "top_logprobs"},
      {R"("reasoning_effort": 3)", "reasoning_effort"},
      {R"("chat_template_kwargs": {"enable_thinking": "no"})",
       "chat_template_kwargs.enable_thinking"},
      {R"("max_completion_tokens": "9")", "max_completion_tokens"},
      {R"("metadata": [])", "metadata"},
  };
  for (const auto& [extra, param] : cases) {
    const std::string body = "{" + msgs + ", " + extra + "}";
    const ApiError e = error_of(parse_openai_chat(body, kLimits));
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
  }
  // The legacy completions API's logprobs is a count.
  EXPECT_EQ(ok(parse_openai_completion(R"({"prompt": "x", "logprobs": 2})", kLimits)).top_logprobs,
            2);
  EXPECT_EQ(error_of(parse_openai_completion(R"({"prompt": "x", "logprobs": 6})", kLimits)).param,
            "logprobs");
}

// tool_choice forcing: the prompt ends with the family's call opening, thinking is off for the
// turn, and the output starts with that opening.
TEST(ServerAgentToolChoice, ForcingWritesTheCallPrefixIntoThePrompt) {
  EXPECT_EQ(tool_call_prefix(ChatFamily::kQwen, "get_weather"),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(tool_call_prefix(ChatFamily::kQwen, ""), "<tool_call>\n{\"name\": \"");
  EXPECT_EQ(tool_call_prefix(ChatFamily::kGlm, "f"), "<tool_call>f");
  EXPECT_EQ(tool_call_prefix(ChatFamily::kDeepSeekV4, "f"),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n");
  EXPECT_EQ(tool_call_prefix(ChatFamily::kDeepSeekV4, ""),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"");
  EXPECT_NE(tool_call_prefix(ChatFamily::kDeepSeek, "f")
                .find("function<\xEF\xBD\x9Ctool\xE2\x96\x81sep\xEF\xBD\x9C>f\n```json\n"),
            std::string::npos);

  const auto r = ok(parse_anthropic_messages(
      anthropic_body(
          R"(, "thinking": {"type": "adaptive"}, "tool_choice": {"type": "tool", "name": "get_weather"})",
          R"([{"role": "user", "content": "weather?"}])"),
      kLimits));
  EXPECT_EQ(r.chat.enable_thinking, std::optional<bool>(true));
  const auto rendered = render_chat(ChatFamily::kQwen, r.chat, {});
  ASSERT_TRUE(rendered.ok());
  const OutputPlan plan = plan_output(ChatFamily::kQwen, r, *rendered);
  EXPECT_EQ(plan.prompt_suffix, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(plan.output.forced_prefix, plan.prompt_suffix);
  EXPECT_TRUE(plan.output.parser.parse_tool_calls);
  EXPECT_TRUE(
      std::string(*rendered + plan.prompt_suffix)
          .ends_with("<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<tool_call>"
                     "\n{\"name\": \"get_weather\", \"arguments\": "));
  // The forced opening is a prefix of how the next turn renders the call: that turn is warm.
  ChatRequest next = r.chat;
  ChatMessage call;
  call.role = "assistant";
  call.tool_calls.push_back(
      {"function", "get_weather", nlohmann::ordered_json::parse(R"({"location": "Paris"})"), ""});
  next.messages.push_back(call);
  ChatMessage result;
  result.role = "tool";
  result.content = "14C";
  next.messages.push_back(result);
  const auto next_prompt = render_chat(ChatFamily::kQwen, next, {});
  ASSERT_TRUE(next_prompt.ok());
  EXPECT_TRUE(next_prompt->starts_with(*rendered + plan.prompt_suffix)) << *next_prompt;
  // auto: nothing is forced.
  const auto a =
      ok(parse_anthropic_messages(anthropic_body(R"(, "thinking": {"type": "adaptive"})",
                                                 R"([{"role": "user", "content": "x"}])"),
                                  kLimits));
  EXPECT_TRUE(plan_output(ChatFamily::kQwen, a, "").prompt_suffix.empty());
  // any with one tool: that tool's call is opened, name and all.
  const auto any =
      ok(parse_anthropic_messages(anthropic_body(R"(, "tool_choice": {"type": "any"})",
                                                 R"([{"role": "user", "content": "x"}])"),
                                  kLimits));
  EXPECT_EQ(plan_output(ChatFamily::kQwen, any, "").prompt_suffix,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  // any with several: the opening without a name.
  const auto any2 = ok(parse_anthropic_messages(
      std::string(R"({"model": "m", "max_tokens": 64, "tools": [)") + kAnthropicWeatherTool +
          R"(, {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}],
          "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "x"}]})",
      kLimits));
  EXPECT_EQ(plan_output(ChatFamily::kQwen, any2, "").prompt_suffix, "<tool_call>\n{\"name\": \"");
  // GLM 5.3 opens the think block in its generation prompt: a forced call closes it first, and the
  // output (the call) starts outside it.
  {
    ChatRequest glm = r.chat;
    glm.enable_thinking.reset();
    const auto glm_prompt = render_chat(ChatFamily::kGlm, glm, {});
    ASSERT_TRUE(glm_prompt.ok());
    ASSERT_TRUE(glm_prompt->ends_with("<|assistant|><think>")) << *glm_prompt;
    const OutputPlan g = plan_output(ChatFamily::kGlm, r, *glm_prompt);
    EXPECT_EQ(g.prompt_suffix, "</think><tool_call>get_weather");
    EXPECT_EQ(g.output.forced_prefix,
              "<tool_call>get_weather\n");  // the name closed for the parser
    EXPECT_FALSE(g.output.parser.starts_in_reasoning);
    EXPECT_EQ(g.reasoning_close, "</think>");
  }
  // A template that opens the think block itself starts the output in reasoning.
  EXPECT_TRUE(plan_output(ChatFamily::kQwen, a, "...<|im_start|>assistant\n<think>\n")
                  .output.parser.starts_in_reasoning);
  // Completions are plain text.
  auto c = ok(parse_openai_completion(R"({"prompt": "x", "stop": ["\n"]})", kLimits));
  const auto cp = plan_output(ChatFamily::kQwen, c, "x");
  EXPECT_FALSE(cp.output.parse);
  EXPECT_EQ(cp.output.stop, std::vector<std::string>{"\n"});
}

// --- The glue: synthetic model text through the parser, the stop matcher and the formatters.

OutputEvent event(OutputEventKind kind, std::string text = {}, int index = -1, std::string id = {},
                  std::string name = {}) {
  OutputEvent e;
  e.kind = kind;
  e.text = std::move(text);
  e.index = index;
  e.id = std::move(id);
  e.name = std::move(name);
  return e;
}

// The data payloads of an SSE text, and the event names.
std::vector<json> payloads(const std::string& sse) {
  std::vector<json> out;
  for (std::size_t at = 0; (at = sse.find("data: ", at)) != std::string::npos;) {
    const std::size_t end = sse.find("\n\n", at);
    const std::string data = sse.substr(at + 6, end - at - 6);
    if (data != "[DONE]") out.push_back(json::parse(data));
    at = end;
  }
  return out;
}

const std::vector<OutputEvent> kCallTurn = {
    event(OutputEventKind::kReasoning, "The user wants Paris."),
    event(OutputEventKind::kText, "Checking."),
    event(OutputEventKind::kToolCallBegin, "", 0, "call_abc123", "get_weather"),
    event(OutputEventKind::kToolCallArguments, "{\"location\": ", 0),
    event(OutputEventKind::kToolCallArguments, "\"Paris\"}", 0),
    event(OutputEventKind::kToolCallEnd, "", 0),
};

ParsedOutput call_turn_message() {
  ParsedOutput m;
  m.reasoning = "The user wants Paris.";
  m.content = "Checking.";
  m.tool_calls.push_back({"call_abc123", "get_weather", "{\"location\": \"Paris\"}"});
  return m;
}

JobSummary summary(std::string finish = "stop") {
  JobSummary s;
  s.finish_reason = std::move(finish);
  s.prompt_tokens = 40;
  s.reused_tokens = 30;
  s.completion_tokens = 12;
  return s;
}

TEST(ServerAgentStream, AnthropicBlocksForThinkingTextAndToolUse) {
  auto f = make_stream_formatter(ApiKind::kMessages, {"msg_1", 1, "m", 40}, {});
  // One call per statement: the order of the operands of + is unspecified.
  std::string sse = f->start(summary());
  sse += f->events(kCallTurn, {});
  sse += f->finish(summary(), call_turn_message());
  const auto p = payloads(sse);
  std::vector<std::string> got;
  for (const auto& e : p) {
    std::string line = e["type"];
    if (e.contains("index")) line += " " + std::to_string(e["index"].get<int>());
    if (e.contains("content_block")) line += " " + e["content_block"]["type"].get<std::string>();
    if (e.contains("delta") && e["delta"].contains("type"))
      line += " " + e["delta"]["type"].get<std::string>();
    got.push_back(line);
  }
  EXPECT_EQ(
      got,
      (std::vector<std::string>{
          "message_start", "content_block_start 0 thinking", "content_block_delta 0 thinking_delta",
          "content_block_delta 0 signature_delta", "content_block_stop 0",
          "content_block_start 1 text", "content_block_delta 1 text_delta", "content_block_stop 1",
          "content_block_start 2 tool_use", "content_block_delta 2 input_json_delta",
          "content_block_delta 2 input_json_delta", "content_block_stop 2", "message_delta",
          "message_stop"}));
  EXPECT_EQ(p[0]["message"]["usage"]["input_tokens"], 10);
  EXPECT_EQ(p[0]["message"]["usage"]["cache_read_input_tokens"], 30);
  EXPECT_EQ(p[0]["message"]["usage"]["cache_creation_input_tokens"], 0);
  EXPECT_EQ(p[1]["content_block"]["signature"], "");
  EXPECT_EQ(p[2]["delta"]["thinking"], "The user wants Paris.");
  EXPECT_EQ(p[3]["delta"]["signature"], thinking_signature("The user wants Paris."));
  EXPECT_EQ(p[6]["delta"]["text"], "Checking.");
  EXPECT_EQ(p[8]["content_block"]["id"], "toolu_abc123");
  EXPECT_EQ(p[8]["content_block"]["name"], "get_weather");
  EXPECT_EQ(p[8]["content_block"]["input"], json::object());
  EXPECT_EQ(json::parse(p[9]["delta"]["partial_json"].get<std::string>() +
                        p[10]["delta"]["partial_json"].get<std::string>()),
            json::parse(R"({"location": "Paris"})"));
  EXPECT_EQ(p[12]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(p[12]["usage"]["output_tokens"], 12);

  // The same turn, not streamed.
  const json body =
      complete_response(ApiKind::kMessages, {"msg_1", 1, "m", 40}, call_turn_message(), summary());
  ASSERT_EQ(body["content"].size(), 3u);
  EXPECT_EQ(body["content"][0]["type"], "thinking");
  EXPECT_EQ(body["content"][0]["signature"], p[3]["delta"]["signature"]);
  EXPECT_EQ(body["content"][1], json({{"type", "text"}, {"text", "Checking."}}));
  EXPECT_EQ(body["content"][2]["input"], json::parse(R"({"location": "Paris"})"));
  EXPECT_EQ(body["stop_reason"], "tool_use");
  EXPECT_EQ(body["usage"]["input_tokens"], 10);
  EXPECT_EQ(body["usage"]["cache_read_input_tokens"], 30);
  // max_tokens wins over a finished call: the turn was cut.
  EXPECT_EQ(complete_response(ApiKind::kMessages, {}, call_turn_message(),
                              summary("length"))["stop_reason"],
            "max_tokens");
}

TEST(ServerAgentStream, OpenAiToolCallDeltasAndReasoning) {
  auto f = make_stream_formatter(ApiKind::kChat, {"chatcmpl-1", 1, "m", 40}, {});
  // One call per statement: the order of the operands of + is unspecified.
  std::string sse = f->start(summary());
  sse += f->events(kCallTurn, {});
  sse += f->finish(summary(), call_turn_message());
  const auto p = payloads(sse);
  std::vector<json> deltas;
  for (const auto& c : p) deltas.push_back(c["choices"][0]["delta"]);
  ASSERT_EQ(deltas.size(), 7u);
  EXPECT_EQ(deltas[0], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(deltas[1], json({{"reasoning_content", "The user wants Paris."}}));
  EXPECT_EQ(deltas[2], json({{"content", "Checking."}}));
  EXPECT_EQ(deltas[3], json::parse(R"({"tool_calls": [{"index": 0, "id": "call_abc123",
      "type": "function", "function": {"name": "get_weather", "arguments": ""}}]})"));
  EXPECT_EQ(deltas[4],
            json::parse(
                R"({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\": "}}]})"));
  EXPECT_EQ(
      deltas[5],
      json::parse(R"({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]})"));
  EXPECT_EQ(deltas[6], json::object());
  EXPECT_EQ(p[6]["choices"][0]["finish_reason"], "tool_calls");

  const json body =
      complete_response(ApiKind::kChat, {"chatcmpl-1", 1, "m", 40}, call_turn_message(), summary());
  const json& m = body["choices"][0]["message"];
  EXPECT_EQ(m["content"], "Checking.");
  EXPECT_EQ(m["reasoning_content"], "The user wants Paris.");
  EXPECT_EQ(m["tool_calls"][0], json::parse(R"({"id": "call_abc123", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  ParsedOutput calls_only = call_turn_message();
  calls_only.content.clear();
  calls_only.reasoning.clear();
  const json m2 =
      complete_response(ApiKind::kChat, {}, calls_only, summary())["choices"][0]["message"];
  EXPECT_TRUE(m2["content"].is_null());
  EXPECT_FALSE(m2.contains("reasoning_content"));
}

TEST(ServerAgentStream, Logprobs) {
  const std::vector<TokenLogprob> lps = {{"He", -0.25, {{"He", -0.25}, {"Hi", -1.5}}},
                                         {"\xC3", -0.5, {{"\xC3", -0.5}}}};
  ParsedOutput m;
  m.content = "He";
  const json body = complete_response(ApiKind::kChat, {}, m, summary(), &lps);
  const json& c = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["token"], "He");
  EXPECT_DOUBLE_EQ(c[0]["logprob"].get<double>(), -0.25);
  EXPECT_EQ(c[0]["bytes"], json::parse("[72, 101]"));
  EXPECT_EQ(c[0]["top_logprobs"][1]["token"], "Hi");
  EXPECT_EQ(c[1]["bytes"], json::parse("[195]"));  // part of a character: the bytes say which
  const json legacy = complete_response(ApiKind::kCompletion, {}, m, summary(), &lps);
  EXPECT_EQ(legacy["choices"][0]["logprobs"]["tokens"][0], "He");
  EXPECT_EQ(legacy["choices"][0]["logprobs"]["text_offset"], json::parse("[0, 2]"));
  EXPECT_DOUBLE_EQ(legacy["choices"][0]["logprobs"]["top_logprobs"][0]["Hi"].get<double>(), -1.5);

  // Streamed: a chunk carries the logprobs of the tokens since the last chunk; those of tokens
  // whose text is still held back ride on the next chunk.
  auto f = make_stream_formatter(ApiKind::kChat, {}, StreamOptions{false, true});
  std::string sse = f->start(summary());
  EXPECT_EQ(f->events({}, {lps[0]}), "");
  sse += f->events({event(OutputEventKind::kText, "He")}, {lps[1]});
  sse += f->finish(summary(), m);
  const auto p = payloads(sse);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_TRUE(p[0]["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(p[1]["choices"][0]["logprobs"]["content"].size(), 2u);
  EXPECT_TRUE(p[2]["choices"][0]["logprobs"].is_null());
}

// The glue with the real parser: a Qwen turn with reasoning, text and a call, fed in pieces of
// every size, gives the same message and the same concatenated events as the whole text.
const std::string kQwenTurn =
    "<think>\nThe user wants Paris.\n</think>\n\nChecking.<tool_call>\n{\"name\": "
    "\"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>";

AssistantOutputOptions qwen_options(bool tools = true) {
  AssistantOutputOptions o;
  o.parser.family = ChatFamily::kQwen;
  o.parser.parse_tool_calls = tools;
  return o;
}

// Feeds `text` in pieces of `step` bytes; returns the events.
std::vector<OutputEvent> run_glue(AssistantOutput& out, const std::string& text, std::size_t step) {
  std::vector<OutputEvent> events;
  for (std::size_t at = 0; at < text.size(); at += step)
    for (auto& e : out.feed(std::string_view(text).substr(at, step)))
      events.push_back(std::move(e));
  for (auto& e : out.finish()) events.push_back(std::move(e));
  return events;
}

// Rebuilds a message from events, as a streaming client does.
ParsedOutput rebuild(const std::vector<OutputEvent>& events) {
  ParsedOutput m;
  for (const auto& e : events) {
    if (e.kind == OutputEventKind::kText) m.content += e.text;
    if (e.kind == OutputEventKind::kReasoning) m.reasoning += e.text;
    if (e.kind == OutputEventKind::kToolCallBegin) m.tool_calls.push_back({e.id, e.name, ""});
    if (e.kind == OutputEventKind::kToolCallArguments) m.tool_calls.at(e.index).arguments += e.text;
  }
  return m;
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (std::size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(json::parse(a.tool_calls[i].arguments), json::parse(b.tool_calls[i].arguments))
        << what;
  }
}

TEST(ServerAgentGlue, QwenTurnAtEverySplit) {
  const ParsedOutput whole = parse_chat_output(kQwenTurn, qwen_options().parser);
  EXPECT_NE(whole.reasoning.find("The user wants Paris."), std::string::npos);
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(whole.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(whole.tool_calls[0].arguments), json::parse(R"({"location": "Paris"})"));
  for (const std::size_t step : {1ul, 2ul, 3ul, 5ul, 7ul, 16ul, 1000ul}) {
    AssistantOutput out(qwen_options());
    const auto events = run_glue(out, kQwenTurn, step);
    expect_same(out.message(), whole, "step " + std::to_string(step));
    expect_same(rebuild(events), out.message(), "events, step " + std::to_string(step));
    EXPECT_FALSE(out.stopped());
  }
}

TEST(ServerAgentGlue, StopSequencesApplyToVisibleTextOnly) {
  AssistantOutputOptions o = qwen_options();
  o.stop = {"STOP"};
  AssistantOutput out(std::move(o));
  const auto events =
      run_glue(out, "<think>\nSTOP is a word here\n</think>\n\nvisible STOP hidden", 3);
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(out.stop_sequence(), "STOP");
  EXPECT_NE(out.message().reasoning.find("STOP is a word here"), std::string::npos);
  EXPECT_EQ(out.message().content.find("hidden"), std::string::npos);
  EXPECT_TRUE(out.message().content.ends_with("visible ")) << out.message().content;
  expect_same(rebuild(events), out.message(), "events");
  // After the stop nothing more comes out.
  EXPECT_TRUE(out.feed("more text").empty());
}

// A call that is malformed before its arguments begin is text, whole. One that breaks once its
// arguments streamed stays a call, marked incomplete, and the text after the break is text.
TEST(ServerAgentGlue, MalformedCallsLoseNothing) {
  for (const std::size_t step : {1ul, 4ul, 1000ul}) {
    const std::string bad_name = "Let me call.<tool_call>\nget_weather(Paris)\n</tool_call> done";
    AssistantOutput a(qwen_options());
    auto events = run_glue(a, bad_name, step);
    EXPECT_TRUE(a.message().tool_calls.empty());
    EXPECT_EQ(a.message().content, bad_name);
    expect_same(rebuild(events), a.message(), "events");

    AssistantOutput cut(qwen_options());  // max_tokens ended it before the arguments
    run_glue(cut, "<tool_call>\n{\"name\": \"get_weather\", \"argum", step);
    EXPECT_TRUE(cut.message().tool_calls.empty());
    EXPECT_EQ(cut.message().content, "<tool_call>\n{\"name\": \"get_weather\", \"argum");

    AssistantOutput broken(qwen_options());
    events = run_glue(
        broken,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {not json}\n</tool_call> after",
        step);
    ASSERT_EQ(broken.message().tool_calls.size(), 1u);
    EXPECT_EQ(broken.message().tool_calls[0].name, "get_weather");
    EXPECT_FALSE(broken.message().tool_calls[0].complete);
    EXPECT_NE(broken.message().content.find("not json}"), std::string::npos);
    EXPECT_TRUE(broken.message().content.ends_with(" after"));
    ASSERT_FALSE(events.empty());
    // The Anthropic body still has an object as the input.
    const json body = complete_response(ApiKind::kMessages, {}, broken.message(), summary());
    EXPECT_EQ(body["content"][1]["type"], "tool_use");
    EXPECT_TRUE(body["content"][1]["input"].is_object());
  }
}

TEST(ServerAgentGlue, ForcedPrefixIsParsedAsOutput) {
  AssistantOutputOptions o = qwen_options();
  o.forced_prefix = tool_call_prefix(ChatFamily::kQwen, "get_weather");
  AssistantOutput out(std::move(o));
  const auto events = run_glue(out, "{\"location\": \"Paris\"}}\n</tool_call>", 2);
  ASSERT_EQ(out.message().tool_calls.size(), 1u);
  EXPECT_EQ(out.message().tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(out.message().tool_calls[0].arguments),
            json::parse(R"({"location": "Paris"})"));
  expect_same(rebuild(events), out.message(), "events");
  // The model did not follow: the prefix and what it wrote come back as text, nothing lost.
  AssistantOutputOptions o2 = qwen_options();
  o2.forced_prefix = tool_call_prefix(ChatFamily::kQwen, "get_weather");
  AssistantOutput junk(std::move(o2));
  run_glue(junk, "def f(x):\n    return x", 3);
  EXPECT_TRUE(junk.message().tool_calls.empty());
  EXPECT_EQ(junk.message().content.find("<tool_call>"), 0u) << junk.message().content;
  EXPECT_NE(junk.message().content.find("return x"), std::string::npos);
}

// parallel_tool_calls: false / disable_parallel_tool_use: the turn ends with its first call.
TEST(ServerAgentGlue, OneCallWhenParallelCallsAreOff) {
  const std::string two =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
      "\"b\", \"arguments\": {}}\n</tool_call>";
  AssistantOutput both(qwen_options());
  run_glue(both, two, 3);
  EXPECT_EQ(both.message().tool_calls.size(), 2u);
  EXPECT_FALSE(both.stopped());
  AssistantOutputOptions o = qwen_options();
  o.max_tool_calls = 1;
  AssistantOutput one(std::move(o));
  std::vector<OutputEvent> events;
  bool stopped_at_first_end = false;
  for (std::size_t at = 0; at < two.size() && !one.stopped(); ++at) {
    for (auto& e : one.feed(std::string_view(two).substr(at, 1))) events.push_back(std::move(e));
    if (one.stopped()) stopped_at_first_end = two.substr(0, at + 1).ends_with("</tool_call>");
  }
  EXPECT_TRUE(one.stopped());
  EXPECT_TRUE(stopped_at_first_end);
  ASSERT_EQ(one.message().tool_calls.size(), 1u);
  EXPECT_EQ(one.message().tool_calls[0].name, "a");
  EXPECT_TRUE(one.finish().empty());
  const auto r = ok(parse_openai_chat(
      R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": false,
          "tools": [{"type": "function", "function": {"name": "a"}}]})",
      kLimits));
  EXPECT_EQ(plan_output(ChatFamily::kQwen, r, "").output.max_tool_calls, 1);
}

TEST(ServerAgentGlue, WithoutToolsCallsAreText) {
  AssistantOutput out(qwen_options(/*tools=*/false));
  run_glue(out, kQwenTurn, 4);
  EXPECT_TRUE(out.message().tool_calls.empty());
  EXPECT_NE(out.message().content.find("<tool_call>"), std::string::npos);
}

TEST(ServerAgentGlue, PlainTextForCompletions) {
  AssistantOutputOptions o;
  o.parse = false;
  o.stop = {"</think>"};
  AssistantOutput out(std::move(o));
  const auto events = run_glue(out, "<think>a</think>b", 1);
  EXPECT_EQ(out.message().content, "<think>a");
  EXPECT_TRUE(out.stopped());
  ASSERT_FALSE(events.empty());
  for (const auto& e : events) EXPECT_EQ(e.kind, OutputEventKind::kText);
}

// Streaming equals non-streaming through the whole glue: the Anthropic events a client would
// accumulate give the body the server returns without streaming.
TEST(ServerAgentGlue, StreamedAnthropicTurnEqualsTheBody) {
  AssistantOutput out(qwen_options());
  auto f = make_stream_formatter(ApiKind::kMessages, {"msg_1", 1, "m", 40}, {});
  std::string sse = f->start(summary());
  for (std::size_t at = 0; at < kQwenTurn.size(); at += 3)
    sse += f->events(out.feed(std::string_view(kQwenTurn).substr(at, 3)), {});
  sse += f->events(out.finish(), {});
  sse += f->finish(summary(), out.message());
  json content = json::array();
  std::map<int, std::string> partial;
  for (const auto& e : payloads(sse)) {
    if (e["type"] == "content_block_start") content.push_back(e["content_block"]);
    if (e["type"] != "content_block_delta") continue;
    json& b = content[e["index"].get<std::size_t>()];
    const json& d = e["delta"];
    if (d["type"] == "text_delta")
      b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
    if (d["type"] == "thinking_delta")
      b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
    if (d["type"] == "signature_delta") b["signature"] = d["signature"];
    if (d["type"] == "input_json_delta")
      partial[e["index"].get<int>()] += d["partial_json"].get<std::string>();
  }
  for (const auto& [index, text] : partial)
    content[static_cast<std::size_t>(index)]["input"] = json::parse(text);
  const json body =
      complete_response(ApiKind::kMessages, {"msg_1", 1, "m", 40}, out.message(), summary());
  EXPECT_EQ(content, body["content"]);
}

// --- The agents' real requests (recorded by tests/agents/capture.mjs), parsed and rendered as the
// server does: each is accepted (a 200, never a 400).

json fixture(const std::string& name) {
  std::ifstream in(std::string(FLASHSERVE_AGENT_FIXTURES) + "/" + name);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << name;
  return j;
}

TEST(ServerAgentFixtures, ClaudeCodeRequestsAreAccepted) {
  for (const char* name : {"claude-code-1.json", "claude-code-2.json", "claude-code-3.json"}) {
    const json f = fixture(name);
    ASSERT_TRUE(f.contains("body")) << name;
    EXPECT_EQ(f["path"].get<std::string>().rfind("/v1/messages", 0), 0u) << name;
    const std::string body = f["body"].dump();
    const auto r = ok(parse_anthropic_messages(body, kLimits));
    EXPECT_TRUE(r.stream) << name;
    EXPECT_EQ(r.max_tokens, f["body"]["max_tokens"].get<std::int64_t>());
    EXPECT_EQ(r.chat.tools.size(), f["body"]["tools"].size()) << name;
    EXPECT_EQ(r.chat.enable_thinking, std::optional<bool>(true)) << name;  // adaptive
    // One system prompt, first: `system` and the system-role messages merged.
    ASSERT_FALSE(r.chat.messages.empty());
    EXPECT_EQ(r.chat.messages[0].role, "system");
    for (std::size_t i = 1; i < r.chat.messages.size(); ++i)
      EXPECT_NE(r.chat.messages[i].role, "system") << name;
    // Every system block but the billing header (metadata whose suffix changes per prompt).
    bool billing = false;
    for (const auto& block : f["body"]["system"]) {
      const std::string text = block["text"].get<std::string>();
      const bool is_billing = text.starts_with("x-anthropic-billing-header:");
      billing = billing || is_billing;
      EXPECT_EQ(r.chat.messages[0].text().find(text) == std::string::npos, is_billing) << name;
    }
    EXPECT_TRUE(billing) << name << ": Claude Code 2.1 sends the billing block";
    EXPECT_EQ(r.chat.messages[0].text().find("x-anthropic-billing-header"), std::string::npos);
    const auto prompt = render_chat(ChatFamily::kQwen, r.chat, {});
    ASSERT_TRUE(prompt.ok()) << name << ": " << prompt.status().to_string();
    EXPECT_TRUE(prompt->ends_with("<|im_start|>assistant\n")) << name;
    EXPECT_TRUE(plan_output(ChatFamily::kQwen, r, *prompt).output.parser.parse_tool_calls);
    const auto counted = ok(parse_anthropic_count_tokens(body, kLimits));
    const auto counted_prompt = render_chat(ChatFamily::kQwen, counted.chat, {});
    ASSERT_TRUE(counted_prompt.ok());
    EXPECT_EQ(*counted_prompt, *prompt);
  }
  // The tool turn's second request carries the call and its result back.
  const auto r =
      ok(parse_anthropic_messages(fixture("claude-code-3.json")["body"].dump(), kLimits));
  bool call = false, result = false;
  for (const auto& m : r.chat.messages) {
    call = call || (m.role == "assistant" && !m.tool_calls.empty());
    result = result || m.role == "tool";
  }
  EXPECT_TRUE(call);
  EXPECT_TRUE(result);
}

// Two Claude Code prompts differ in the billing block's suffix; rendered, they are the same, so a
// second turn finds the first one's prefix in the session bank.
TEST(ServerAgentFixtures, ClaudeCodeBillingHeaderDoesNotBreakTheWarmPrefix) {
  json body = fixture("claude-code-1.json")["body"];
  const auto first = ok(parse_anthropic_messages(body.dump(), kLimits));
  for (auto& block : body["system"]) {
    std::string text = block["text"].get<std::string>();
    if (text.starts_with("x-anthropic-billing-header:")) {
      text.replace(text.find("cc_version=") + 11, 9, "9.9.999.abc");
      block["text"] = text;
    }
  }
  const auto second = ok(parse_anthropic_messages(body.dump(), kLimits));
  const auto a = render_chat(ChatFamily::kQwen, first.chat, {});
  const auto b = render_chat(ChatFamily::kQwen, second.chat, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(ServerAgentFixtures, QwenCodeRequestsAreAccepted) {
  for (const char* name : {"qwen-code-1.json", "qwen-code-2.json", "qwen-code-3.json"}) {
    const json f = fixture(name);
    ASSERT_TRUE(f.contains("body")) << name;
    EXPECT_EQ(f["path"], "/v1/chat/completions");
    const auto r = ok(parse_openai_chat(f["body"].dump(), kLimits));
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.include_usage);
    EXPECT_EQ(r.chat.tools.size(), f["body"]["tools"].size()) << name;
    const auto prompt = render_chat(ChatFamily::kQwen, r.chat, {});
    ASSERT_TRUE(prompt.ok()) << name << ": " << prompt.status().to_string();
    EXPECT_NE(prompt->find("# Tools"), std::string::npos);
  }
  const auto r = ok(parse_openai_chat(fixture("qwen-code-3.json")["body"].dump(), kLimits));
  EXPECT_EQ(r.chat.messages.back().role, "tool");
}

// An agent's second request of a tool turn renders to a prompt that extends the first one's (the
// tool call and its result appended): the warm prefix the session bank reuses.
TEST(ServerAgentFixtures, TheToolTurnsSecondPromptExtendsTheFirst) {
  const auto prompt_of = [](const char* name) {
    const json f = fixture(name);
    const std::string body = f["body"].dump();
    const auto r = f["path"].get<std::string>().rfind("/v1/messages", 0) == 0
                       ? ok(parse_anthropic_messages(body, kLimits))
                       : ok(parse_openai_chat(body, kLimits));
    auto p = render_chat(ChatFamily::kQwen, r.chat, {});
    EXPECT_TRUE(p.ok());
    return p.ok() ? *p : std::string();
  };
  for (const auto& [first, second] : {std::pair{"claude-code-2.json", "claude-code-3.json"},
                                      std::pair{"qwen-code-2.json", "qwen-code-3.json"}}) {
    const std::string a = prompt_of(first), b = prompt_of(second);
    ASSERT_FALSE(a.empty());
    EXPECT_GT(b.size(), a.size());
    EXPECT_TRUE(b.starts_with(a)) << first << " -> " << second;
  }
}

}  // namespace
}  // namespace fs::server
