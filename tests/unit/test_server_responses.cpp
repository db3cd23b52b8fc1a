// The Responses API's pure parts: request parsing (the documented input shapes, tools,
// tool_choice, reasoning, and errors naming the field), the conversation as a chat prompt, the
// response object and the exact stream event sequence for synthetic model output, and the
// response store (budget, LRU). The real Codex requests recorded in tests/agents/fixtures parse.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/loader.h"
#include "server/engine.h"
#include "server/response_store.h"
#include "server/responses_format.h"
#include "server/responses_prompt.h"
#include "server/responses_request.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/metadata.h"

namespace fs::server {
namespace {

using ojson = nlohmann::ordered_json;

const RequestLimits kLimits;

ResponsesRequest ok(std::string_view body) {
  auto p = parse_responses_request(body, kLimits);
  if (const auto* e = std::get_if<ApiError>(&p)) {
    ADD_FAILURE() << "unexpected error: " << e->param << ": " << e->message << "\n" << body;
    return {};
  }
  return std::get<ResponsesRequest>(std::move(p));
}

// The model's generation_config.json sampling fills what a Responses request leaves unset, as on
// the other APIs (test_server.cpp).
TEST(ResponsesRequest, UnsetSamplingFieldsTakeTheModelsDefaults) {
  RequestLimits limits;
  limits.sampling_defaults.temperature = 0.7;
  limits.sampling_defaults.top_p = 0.8;
  limits.sampling_defaults.top_k = 20;
  for (const auto& [body, temperature] : {std::pair{R"({"input": "x"})", 0.7},
                                          std::pair{R"({"input": "x", "temperature": 0})", 0.0}}) {
    auto p = parse_responses_request(body, limits);
    ASSERT_TRUE(std::holds_alternative<ResponsesRequest>(p)) << body;
    const auto& s = std::get<ResponsesRequest>(p).sampler;
    EXPECT_DOUBLE_EQ(s.temperature, temperature) << body;
    EXPECT_DOUBLE_EQ(s.top_p, 0.8);
    EXPECT_EQ(s.top_k, 20);
  }
}

ApiError err(std::string_view body) {
  auto p = parse_responses_request(body, kLimits);
  if (const auto* e = std::get_if<ApiError>(&p)) return *e;
  ADD_FAILURE() << "expected an error for " << body;
  return {};
}

std::string render(const ResponsesRequest& r, std::span<const ResponseItem> history = {}) {
  const bool tools = r.tool_choice.mode != ToolChoice::Mode::kNone && !r.function_names.empty();
  auto text = render_chat(ChatFamily::kQwen,
                          conversation_chat(r.instructions, history, r.input,
                                            tools ? r.tools : ojson::array(), r.enable_thinking),
                          {});
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  return text.ok() ? *text : std::string();
}

TEST(ServerResponsesRequest, StringInputAndDefaults) {
  const auto r = ok(R"({"model": "gpt-x", "input": "Tell me a three sentence bedtime story."})");
  EXPECT_EQ(r.model, "gpt-x");
  ASSERT_EQ(r.input.size(), 1u);
  EXPECT_EQ(r.input[0].kind, ItemKind::kMessage);
  EXPECT_EQ(r.input[0].role, "user");
  EXPECT_EQ(r.input[0].text, "Tell me a three sentence bedtime story.");
  EXPECT_TRUE(r.store);  // OpenAI's default
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.parallel_tool_calls);
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_FALSE(r.max_output_tokens.has_value());
  EXPECT_FALSE(r.instructions.has_value());
  EXPECT_FALSE(r.enable_thinking.has_value());
  EXPECT_EQ(render(r),
            "<|im_start|>user\nTell me a three sentence bedtime story.<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ServerResponsesRequest, FieldsAreReadAndUnknownOnesIgnored) {
  const auto r = ok(R"({
    "model": "m", "instructions": "Talk like a pirate.", "input": "Are semicolons optional?",
    "max_output_tokens": 64, "temperature": 0.7, "top_p": 0.9, "stream": true, "store": false,
    "previous_response_id": "resp_1", "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "text"}, "verbosity": "low"}, "include": ["reasoning.encrypted_content"],
    "metadata": {"k": "v"}, "truncation": "auto", "user": "u1", "prompt_cache_key": "pk",
    "service_tier": "auto", "safety_identifier": "s", "parallel_tool_calls": false,
    "client_metadata": {"turn_id": "x"}, "a_future_field": [1, 2, {"x": null}]})");
  EXPECT_EQ(*r.instructions, "Talk like a pirate.");
  EXPECT_EQ(*r.max_output_tokens, 64);
  // Above the server's limit: clamped to it, as max_tokens is on the other APIs.
  EXPECT_EQ(*ok(R"({"input": "x", "max_output_tokens": 1000000000000})").max_output_tokens,
            kLimits.max_tokens);
  EXPECT_DOUBLE_EQ(r.sampler.temperature, 0.7);
  EXPECT_DOUBLE_EQ(r.sampler.top_p, 0.9);
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.store);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.previous_response_id, "resp_1");
  EXPECT_EQ(*r.reasoning_effort, "low");
  EXPECT_EQ(*r.reasoning_summary, "auto");
  EXPECT_FALSE(r.enable_thinking.has_value());
  EXPECT_EQ(r.echo_text["verbosity"], "low");
  EXPECT_EQ(r.echo_metadata["k"], "v");
  EXPECT_EQ(r.truncation, "auto");
  EXPECT_EQ(*r.user, "u1");
  EXPECT_EQ(*r.prompt_cache_key, "pk");
  // Instructions are the first system message.
  EXPECT_EQ(render(r),
            "<|im_start|>system\nTalk like a pirate.<|im_end|>\n<|im_start|>user\nAre semicolons "
            "optional?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ServerResponsesRequest, ReasoningEffortNoneTurnsThinkingOff) {
  for (const char* effort : {"none", "minimal"}) {
    const auto r = ok(std::string(R"({"input": "x", "reasoning": {"effort": ")") + effort + "\"}}");
    ASSERT_TRUE(r.enable_thinking.has_value());
    EXPECT_FALSE(*r.enable_thinking);
    EXPECT_TRUE(render(r).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  }
  EXPECT_FALSE(ok(R"({"input": "x", "reasoning": {"effort": "high"}})").enable_thinking);
}

TEST(ServerResponsesRequest, MessageItemsOfEveryRoleWithTextParts) {
  const auto r = ok(R"({"input": [
    {"role": "developer", "content": "Be terse."},
    {"type": "message", "role": "user", "content": [
      {"type": "input_text", "text": "What is "}, {"type": "input_text", "text": "2+2?"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "4", "annotations": []}]},
    {"role": "system", "content": [{"type": "input_text", "text": "Now in French."}]},
    {"role": "user", "content": "Encore?"}]})");
  ASSERT_EQ(r.input.size(), 5u);
  EXPECT_EQ(r.input[1].text, "What is 2+2?");
  EXPECT_EQ(r.input[2].id, "msg_1");
  EXPECT_EQ(render(r),
            "<|im_start|>system\nBe terse.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>system\nNow in French.<|im_end|>\n"
            "<|im_start|>user\nEncore?<|im_end|>\n<|im_start|>assistant\n");
}

// The function-calling guide's round trip: the model's call and its output sent back.
TEST(ServerResponsesRequest, FunctionCallRoundTripRendersCallAndResult) {
  const auto r = ok(R"({
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather of a city.",
               "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                              "required": ["location"]}, "strict": true}],
    "input": [
      {"role": "user", "content": "What's the weather in Paris?"},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "The user wants Paris."}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
       "arguments": "{\"location\":\"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "15C, sunny"}]})");
  ASSERT_EQ(r.input.size(), 4u);
  EXPECT_EQ(r.input[1].kind, ItemKind::kReasoning);
  EXPECT_EQ(r.input[1].text, "The user wants Paris.");
  EXPECT_EQ(r.input[2].call_id, "call_1");
  EXPECT_EQ(r.input[3].text, "15C, sunny");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["type"], "function");
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["required"][0], "location");
  const std::string prompt = render(r);
  // The reasoning stays with its turn (after the last user query the template keeps it), the
  // call follows in the family's syntax, the output comes back as a tool response.
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<think>\nThe user wants Paris.\n</think>\n\n"
                        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                        "{\"location\":\"Paris\"}}\n</tool_call><|im_end|>\n"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>user\n<tool_response>\n15C, sunny\n</tool_response><|im_end|>"
                        "\n<|im_start|>assistant\n"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("\"name\": \"get_weather\""), std::string::npos);  // the tool list
}

TEST(ServerResponsesRequest, OutputPartsAndSummariesAreText) {
  const auto r = ok(R"({"input": [
    {"role": "user", "content": "q"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "first"},
                                      {"type": "summary_text", "text": "second"}],
     "encrypted_content": null},
    {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
    {"type": "function_call", "call_id": "c", "name": "f"},
    {"type": "function_call_output", "call_id": "c",
     "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]})");
  EXPECT_EQ(r.input[1].text, "first\n\nsecond");
  EXPECT_EQ(r.input[2].text, "");         // only encrypted: nothing to show the model
  EXPECT_EQ(r.input[3].arguments, "{}");  // absent arguments: an empty object
  EXPECT_EQ(r.input[4].text, "ab");
  EXPECT_EQ(r.input[5].text, "no");
  const ChatRequest chat = conversation_chat(std::nullopt, {}, r.input, ojson::array(), {});
  // One assistant turn of the two reasoning items and the call; then the tool; then the refusal.
  ASSERT_EQ(chat.messages.size(), 4u);
  EXPECT_EQ(chat.messages[1].role, "assistant");
  EXPECT_EQ(*chat.messages[1].reasoning_content, "first\n\nsecond\n\n");
  ASSERT_EQ(chat.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(chat.messages[2].role, "tool");
  EXPECT_EQ(chat.messages[2].tool_call_id, "c");
  EXPECT_EQ(chat.messages[3].role, "assistant");
  EXPECT_EQ(*chat.messages[3].content, "no");
}

TEST(ServerResponsesRequest, AssistantItemsFoldIntoTurns) {
  // reasoning, message, two calls: one turn; a later reasoning starts the next turn.
  const auto r = ok(R"({"input": [
    {"role": "user", "content": "q"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r1"}]},
    {"role": "assistant", "content": "Looking."},
    {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
    {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{\"x\":1}"},
    {"type": "function_call_output", "call_id": "a", "output": "A"},
    {"type": "function_call_output", "call_id": "b", "output": "B"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r2"}]},
    {"role": "assistant", "content": "Done."}]})");
  const ChatRequest chat = conversation_chat(std::nullopt, {}, r.input, ojson::array(), {});
  ASSERT_EQ(chat.messages.size(), 5u);
  EXPECT_EQ(*chat.messages[1].reasoning_content, "r1");
  EXPECT_EQ(*chat.messages[1].content, "Looking.");
  EXPECT_EQ(chat.messages[1].tool_calls.size(), 2u);
  EXPECT_EQ(chat.messages[2].role, "tool");
  EXPECT_EQ(chat.messages[3].role, "tool");
  EXPECT_EQ(*chat.messages[4].reasoning_content, "r2");
  EXPECT_EQ(*chat.messages[4].content, "Done.");
  EXPECT_TRUE(chat.add_generation_prompt);
}

TEST(ServerResponsesRequest, HistoryComesBeforeInputAndInstructionsFirst) {
  const auto first = ok(R"({"instructions": "old", "input": "one"})");
  std::vector<ResponseItem> history = first.input;
  ResponseItem answer;
  answer.role = "assistant";
  answer.text = "1";
  history.push_back(answer);
  const auto next =
      ok(R"({"instructions": "new", "previous_response_id": "resp_x", "input": "two"})");
  // The previous response's instructions are not carried over (OpenAI's rule); the new ones lead.
  EXPECT_EQ(render(next, history),
            "<|im_start|>system\nnew<|im_end|>\n<|im_start|>user\none<|im_end|>\n"
            "<|im_start|>assistant\n1<|im_end|>\n<|im_start|>user\ntwo<|im_end|>\n"
            "<|im_start|>assistant\n");
  // A follow-up may send no input at all.
  EXPECT_TRUE(ok(R"({"previous_response_id": "resp_x"})").input.empty());
}

TEST(ServerResponsesRequest, ToolsOfOtherTypesAreEchoedNotRendered) {
  const auto r = ok(R"({"input": "x", "tools": [
    {"type": "web_search", "external_web_access": false},
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": false},
    {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
      {"type": "function", "name": "spawn_agent", "description": "Spawn.", "parameters": null},
      {"type": "function", "name": "exec_command", "description": "a duplicate name"}]},
    {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}]})");
  ASSERT_EQ(r.function_names, (std::vector<std::string>{"exec_command", "spawn_agent"}));
  EXPECT_EQ(r.function_namespaces, (std::vector<std::string>{"", "agents"}));
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_FALSE(r.tools[1]["function"].contains("parameters"));  // null parameters: none
  EXPECT_EQ(r.tools[1]["function"]["description"], "Spawn.");
  EXPECT_EQ(r.echo_tools.size(), 4u);
  const std::string prompt = render(r);
  EXPECT_NE(prompt.find("spawn_agent"), std::string::npos);
  EXPECT_EQ(prompt.find("web_search"), std::string::npos);
  EXPECT_EQ(prompt.find("apply_patch"), std::string::npos);
}

TEST(ServerResponsesRequest, ToolChoice) {
  const std::string tools =
      R"("tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}])";
  const auto at = [&](const std::string& choice) {
    return ok("{\"input\": \"x\", " + tools + ", \"tool_choice\": " + choice + "}");
  };
  EXPECT_EQ(at("\"auto\"").tool_choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_EQ(at("\"required\"").tool_choice.mode, ToolChoice::Mode::kRequired);
  const auto none = at("\"none\"");
  EXPECT_EQ(none.tool_choice.mode, ToolChoice::Mode::kNone);
  EXPECT_EQ(render(none).find("<tools>"), std::string::npos);  // no tools shown
  const auto fn = at(R"({"type": "function", "name": "b"})");
  EXPECT_EQ(fn.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(fn.tool_choice.name, "b");
  EXPECT_EQ(fn.echo_tool_choice["name"], "b");
  const auto allowed = at(
      R"({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "b"}]})");
  EXPECT_EQ(allowed.tool_choice.mode, ToolChoice::Mode::kRequired);
  EXPECT_EQ(allowed.function_names, std::vector<std::string>{"b"});
  ASSERT_EQ(allowed.tools.size(), 1u);
  EXPECT_EQ(allowed.tools[0]["function"]["name"], "b");
}

TEST(ServerResponsesRequest, ErrorsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"input": 5})", "input"},
      {R"({"model": "m"})", "input"},
      {R"({"input": []})", "input"},
      {R"({"input": [5]})", "input[0]"},
      {R"({"input": [{"content": "x"}]})", "input[0].type"},
      {R"({"input": [{"role": "wizard", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"role": "user"}]})", "input[0].content"},
      {R"({"input": [{"role": "user", "content": 7}]})", "input[0].content"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
          {"type": "input_image", "image_url": "https://x/y.png"}]}]})",
       "input[0].content[1].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]})",
       "input[0].content[0].text"},
      {R"({"input": [{"role": "user", "content": "x"}, {"type": "computer_call", "call_id": "c"}]})",
       "input[1].type"},
      {R"({"input": [{"type": "web_search_call", "id": "w"}]})", "input[0].type"},
      {R"({"input": [{"type": "item_reference", "id": "msg_1"}]})", "input[0].type"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})",
       "input[0].call_id"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]})",
       "input[0].name"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]})",
       "input[0].arguments"},
      {R"({"input": [{"type": "function_call_output", "output": "x"}]})", "input[0].call_id"},
      {R"({"input": [{"type": "function_call_output", "call_id": "c"}]})", "input[0].output"},
      {R"({"input": [{"type": "function_call_output", "call_id": "c",
          "output": [{"type": "input_image", "image_url": "u"}]}]})",
       "input[0].output[0].type"},
      {R"({"input": [{"type": "reasoning", "summary": "x"}]})", "input[0].summary"},
      {R"({"input": [{"type": "reasoning", "summary": [{"type": "summary_text"}]}]})",
       "input[0].summary[0].text"},
      {R"({"input": "x", "model": 5})", "model"},
      {R"({"input": "x", "instructions": ["a"]})", "instructions"},
      {R"({"input": "x", "temperature": "hot"})", "temperature"},
      {R"({"input": "x", "temperature": 2.5})", "temperature"},
      {R"({"input": "x", "top_p": 0})", "top_p"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens"},
      {R"({"input": "x", "max_output_tokens": 1.5})", "max_output_tokens"},
      {R"({"input": "x", "stream": "yes"})", "stream"},
      {R"({"input": "x", "store": "no"})", "store"},
      {R"({"input": "x", "parallel_tool_calls": 1})", "parallel_tool_calls"},
      {R"({"input": "x", "previous_response_id": 5})", "previous_response_id"},
      {R"({"input": "x", "tools": {}})", "tools"},
      {R"({"input": "x", "tools": [5]})", "tools[0]"},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": "x"}]})",
       "tools[0].parameters"},
      {R"({"input": "x", "tools": [{"type": "namespace", "name": "n"}]})", "tools[0].tools"},
      {R"({"input": "x", "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"input": "x", "tool_choice": "required"})", "tool_choice"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f"}],
          "tool_choice": {"type": "function", "name": "g"}})",
       "tool_choice.name"},
      {R"({"input": "x", "tool_choice": {"type": "web_search"}})", "tool_choice.type"},
      {R"({"input": "x", "reasoning": "high"})", "reasoning"},
      {R"({"input": "x", "reasoning": {"effort": "extreme"}})", "reasoning.effort"},
      {R"({"input": "x", "reasoning": {"summary": 1}})", "reasoning.summary"},
      {R"({"input": "x", "text": {"format": {"type": "xml"}}})", "text.format.type"},
      {R"({"input": "x", "text": {"verbosity": "loud"}})", "text.verbosity"},
      {R"({"input": "x", "include": "all"})", "include"},
      {R"({"input": "x", "metadata": {"k": 1}})", "metadata.k"},
      {R"({"input": "x", "truncation": "middle"})", "truncation"},
      {R"({"input": "x", "user": 1})", "user"},
      {R"({"input": "x", "background": true})", "background"},
      {R"({"input": "x", "conversation": "conv_1"})", "conversation"},
      {R"({"input": "x", "top_logprobs": 3})", "top_logprobs"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = err(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
    EXPECT_NE(e.message.find(param), std::string::npos) << e.message;
  }
  for (const char* body : {"", "[]", "{\"input\": ", "\"x\""}) EXPECT_EQ(err(body).status, 400);
}

// --- the response builder ---

ResponseMetaInfo meta_info() {
  ResponseMetaInfo m;
  m.id = "resp_abc";
  m.created_at = 1700000000;
  m.model = "tiny";
  return m;
}

OutputEvent ev(OutputEventKind kind, std::string text = {}) {
  OutputEvent e;
  e.kind = kind;
  e.text = std::move(text);
  e.index = 0;
  return e;
}

// The model reasons, says something, calls a tool: the parser's events, split as a stream
// would split them (the parser drops the template's separators; the rest is the model's).
std::vector<std::vector<OutputEvent>> synthetic_output() {
  OutputEvent begin = ev(OutputEventKind::kToolCallBegin);
  begin.id = "call_7";
  begin.name = "get_weather";
  return {
      {ev(OutputEventKind::kReasoning, "\nThe user asks"),
       ev(OutputEventKind::kReasoning, " about Paris.\n")},
      {ev(OutputEventKind::kText, "Checking"), ev(OutputEventKind::kText, " now.\n")},
      {begin, ev(OutputEventKind::kToolCallArguments, "{\"location\": ")},
      {ev(OutputEventKind::kToolCallArguments, "\"Paris\"}"), ev(OutputEventKind::kToolCallEnd)},
  };
}

JobSummary summary(std::string reason = "stop") {
  JobSummary s;
  s.finish_reason = std::move(reason);
  s.prompt_tokens = 40;
  s.completion_tokens = 25;
  s.reused_tokens = 31;
  return s;
}

// The SSE text as (event name, data) pairs; the event line and the data's type must agree.
std::vector<std::pair<std::string, ojson>> events_of(const std::string& sse) {
  std::vector<std::pair<std::string, ojson>> out;
  std::istringstream in(sse);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) {
      ojson data = ojson::parse(line.substr(6));
      EXPECT_EQ(data["type"], name);
      out.emplace_back(name, std::move(data));
    }
  }
  return out;
}

TEST(ServerResponsesBuilder, PlainResponseHoldsReasoningMessageAndCall) {
  const auto req = ok(R"({"input": "weather?", "instructions": "Be brief.", "max_output_tokens": 99,
      "tools": [{"type": "function", "name": "get_weather"}], "metadata": {"a": "b"}})");
  ResponseMetaInfo m = meta_info();
  m.max_output_tokens = 99;
  ResponseBuilder b(m, req, /*streaming=*/false);
  EXPECT_EQ(b.start(), "");  // no events when not streaming
  for (const auto& piece : synthetic_output()) EXPECT_EQ(b.add(piece), "");
  EXPECT_EQ(b.reasoning_text(), "The user asks about Paris.");
  EXPECT_EQ(b.finish(summary(), 6), "");
  const ojson& r = b.response();
  EXPECT_EQ(r["id"], "resp_abc");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["created_at"], 1700000000);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_TRUE(r["completed_at"].is_number_integer());
  EXPECT_TRUE(r["error"].is_null());
  EXPECT_TRUE(r["incomplete_details"].is_null());
  EXPECT_EQ(r["instructions"], "Be brief.");
  EXPECT_EQ(r["max_output_tokens"], 99);
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["tools"][0]["name"], "get_weather");
  EXPECT_EQ(r["tool_choice"], "auto");
  EXPECT_EQ(r["store"], true);
  EXPECT_EQ(r["metadata"]["a"], "b");
  EXPECT_EQ(r["text"]["format"]["type"], "text");
  const ojson& out = r["output"];
  ASSERT_EQ(out.size(), 3u) << out.dump(1);
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["id"], "rs_abc_0");
  EXPECT_EQ(out[0]["summary"], ojson::array());
  EXPECT_EQ(out[0]["content"][0]["type"], "reasoning_text");
  EXPECT_EQ(out[0]["content"][0]["text"], "The user asks about Paris.");
  EXPECT_EQ(out[1]["type"], "message");
  EXPECT_EQ(out[1]["id"], "msg_abc_1");
  EXPECT_EQ(out[1]["role"], "assistant");
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(out[1]["content"][0]["type"], "output_text");
  EXPECT_EQ(out[1]["content"][0]["text"], "Checking now.\n");
  EXPECT_EQ(out[1]["content"][0]["annotations"], ojson::array());
  EXPECT_EQ(out[2]["type"], "function_call");
  EXPECT_EQ(out[2]["id"], "fc_abc_2");
  EXPECT_EQ(out[2]["call_id"], "call_7");
  EXPECT_EQ(out[2]["name"], "get_weather");
  EXPECT_EQ(out[2]["arguments"], "{\"location\": \"Paris\"}");
  EXPECT_EQ(out[2]["status"], "completed");
  const ojson& u = r["usage"];
  EXPECT_EQ(u["input_tokens"], 40);
  EXPECT_EQ(u["input_tokens_details"]["cached_tokens"], 31);
  EXPECT_EQ(u["output_tokens"], 25);
  EXPECT_EQ(u["output_tokens_details"]["reasoning_tokens"], 6);
  EXPECT_EQ(u["total_tokens"], 65);
  // The output as conversation items, for a follow-up.
  const auto& items = b.output_items();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].kind, ItemKind::kReasoning);
  EXPECT_EQ(items[1].text, "Checking now.\n");
  EXPECT_EQ(items[2].arguments, "{\"location\": \"Paris\"}");
}

TEST(ServerResponsesBuilder, StreamEventSequence) {
  const auto req =
      ok(R"({"input": "weather?", "tools": [{"type": "function", "name": "get_weather"}]})");
  ResponseBuilder b(meta_info(), req, /*streaming=*/true);
  std::string sse = b.start();
  for (const auto& piece : synthetic_output()) sse += b.add(piece);
  sse += b.finish(summary(), 6);
  const auto events = events_of(sse);
  std::vector<std::string> types;
  for (const auto& [name, data] : events) types.push_back(name);
  const std::vector<std::string> expected = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",  // reasoning
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",  // message
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.delta",  // the trailing newline, held back until the item ended
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",  // function call
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
  };
  EXPECT_EQ(types, expected);
  for (std::size_t i = 0; i < events.size(); ++i)
    EXPECT_EQ(events[i].second["sequence_number"], static_cast<std::int64_t>(i));
  // created/in_progress carry the response in progress, with no output yet.
  EXPECT_EQ(events[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(events[0].second["response"]["output"], ojson::array());
  EXPECT_TRUE(events[0].second["response"]["usage"].is_null());
  // Each item's events name it by id and index; deltas add up to the done text.
  EXPECT_EQ(events[2].second["item"]["type"], "reasoning");
  EXPECT_EQ(events[2].second["item"]["status"], "in_progress");
  EXPECT_EQ(events[3].second["part"]["type"], "reasoning_text");
  EXPECT_EQ(events[4].second["delta"], "The user asks");
  EXPECT_EQ(events[5].second["delta"], " about Paris.");  // its trailing newline held back
  EXPECT_EQ(events[6].second["text"], "The user asks about Paris.");
  for (int i = 9; i <= 16; ++i) {
    EXPECT_EQ(events[i].second["output_index"], 1) << i;
    if (i > 9 && i < 16) {
      EXPECT_EQ(events[i].second["item_id"], "msg_abc_1") << i;
    }
  }
  EXPECT_EQ(events[16].second["item"]["id"], "msg_abc_1");
  EXPECT_EQ(events[10].second["part"], ojson::parse(R"({"type": "output_text",
      "annotations": [], "logprobs": [], "text": ""})"));
  EXPECT_EQ(events[11].second["delta"], "Checking");
  EXPECT_EQ(events[11].second["content_index"], 0);
  EXPECT_EQ(events[12].second["delta"], " now.");
  EXPECT_EQ(events[13].second["delta"], "\n");
  EXPECT_EQ(events[14].second["text"], "Checking now.\n");
  EXPECT_EQ(events[15].second["part"]["text"], "Checking now.\n");
  EXPECT_EQ(events[16].second["item"]["content"][0]["text"], "Checking now.\n");
  EXPECT_EQ(events[17].second["item"]["call_id"], "call_7");
  EXPECT_EQ(events[17].second["item"]["arguments"], "");
  EXPECT_EQ(events[18].second["delta"], "{\"location\": ");
  EXPECT_EQ(events[20].second["arguments"], "{\"location\": \"Paris\"}");
  EXPECT_EQ(events[20].second["name"], "get_weather");
  EXPECT_EQ(events[21].second["item"]["status"], "completed");
  // The last event carries the whole response: the same as the plain path builds.
  ResponseBuilder plain(meta_info(), req, false);
  for (const auto& piece : synthetic_output()) plain.add(piece);
  plain.finish(summary(), 6);
  ojson last = events.back().second["response"];
  ojson want = plain.response();
  last.erase("completed_at");
  want.erase("completed_at");
  EXPECT_EQ(last, want);
}

TEST(ServerResponsesBuilder, TokenLimitMakesItIncomplete) {
  const auto req = ok(R"({"input": "x", "max_output_tokens": 3})");
  ResponseBuilder b(meta_info(), req, true);
  std::string sse = b.start() + b.add({ev(OutputEventKind::kText, "Once upon")});
  sse += b.finish(summary("length"), 0);
  const auto events = events_of(sse);
  EXPECT_EQ(events.back().first, "response.incomplete");
  const ojson& r = b.response();
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_FALSE(r.contains("completed_at"));
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(events[events.size() - 2].second["item"]["status"], "incomplete");
}

TEST(ServerResponsesBuilder, ACallCutOffIsIncomplete) {
  const auto req = ok(R"({"input": "x", "tools": [{"type": "function", "name": "f"}]})");
  ResponseBuilder b(meta_info(), req, false);
  OutputEvent begin = ev(OutputEventKind::kToolCallBegin);
  begin.id = "call_1";
  begin.name = "f";
  OutputEvent end = ev(OutputEventKind::kToolCallEnd);
  end.complete = false;
  b.add({begin, ev(OutputEventKind::kToolCallArguments, "{\"a\": "), end,
         ev(OutputEventKind::kText, "rest")});
  b.finish(summary(), 0);
  const ojson& out = b.response()["output"];
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["status"], "incomplete");
  EXPECT_EQ(out[0]["arguments"], "{\"a\": ");
  EXPECT_EQ(out[1]["content"][0]["text"], "rest");
  EXPECT_EQ(b.response()["status"], "completed");
}

TEST(ServerResponsesBuilder, FailureEndsTheStreamWithResponseFailed) {
  const auto req = ok(R"({"input": "x"})");
  ResponseBuilder b(meta_info(), req, true);
  std::string sse = b.start() + b.add({ev(OutputEventKind::kText, "partial")});
  sse += b.fail("generation failed: out of memory");
  const auto events = events_of(sse);
  EXPECT_EQ(events.back().first, "response.failed");
  EXPECT_EQ(events.back().second["response"]["status"], "failed");
  EXPECT_EQ(events.back().second["response"]["error"]["code"], "server_error");
  EXPECT_EQ(events.back().second["response"]["error"]["message"],
            "generation failed: out of memory");
}

TEST(ServerResponsesBuilder, SingleCallWithoutParallelToolCallsAndNamespaces) {
  const auto req = ok(R"({"input": "x", "parallel_tool_calls": false, "tools": [
      {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]},
      {"type": "function", "name": "f"}]})");
  ResponseBuilder b(meta_info(), req, false);
  for (const char* name : {"spawn", "f"}) {
    OutputEvent begin = ev(OutputEventKind::kToolCallBegin);
    begin.id = std::string("call_") + name;
    begin.name = name;
    b.add(
        {begin, ev(OutputEventKind::kToolCallArguments, "{}"), ev(OutputEventKind::kToolCallEnd)});
  }
  b.finish(summary(), 0);
  const ojson& out = b.response()["output"];
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["name"], "spawn");
  EXPECT_EQ(out[0]["namespace"], "agents");
}

TEST(ServerResponsesBuilder, WhitespaceAloneIsNoMessageWhitespaceInOneIsKept) {
  const auto req = ok(R"({"input": "x"})");
  ResponseBuilder b(meta_info(), req, true);
  std::string sse =
      b.start() + b.add({ev(OutputEventKind::kText, "\n\n"), ev(OutputEventKind::kText, " ")});
  sse += b.finish(summary(), 0);
  EXPECT_EQ(b.response()["output"], ojson::array());
  EXPECT_EQ(events_of(sse).size(), 3u);  // created, in_progress, completed
  // Whitespace before visible text is the message's: it opens at the first visible character.
  ResponseBuilder c(meta_info(), req, false);
  c.add({ev(OutputEventKind::kText, "\n"), ev(OutputEventKind::kText, "  x = 1 \n")});
  c.finish(summary(), 0);
  EXPECT_EQ(c.response()["output"][0]["content"][0]["text"], "\n  x = 1 \n");
}

// --- the store ---

std::shared_ptr<StoredResponse> stored(const std::string& id, std::size_t text_bytes) {
  auto r = std::make_shared<StoredResponse>();
  r->id = id;
  r->response = {{"id", id}};
  ResponseItem item;
  item.text = std::string(text_bytes, 'x');
  r->conversation.push_back(item);
  return r;
}

TEST(ServerResponseStore, BudgetLruAndErase) {
  const std::size_t one = stored("resp_a", 1000)->bytes() + 16;  // about one entry
  ResponseStore store(3 * one);
  EXPECT_TRUE(store.put(stored("resp_a", 1000)));
  EXPECT_TRUE(store.put(stored("resp_b", 1000)));
  EXPECT_TRUE(store.put(stored("resp_c", 1000)));
  EXPECT_EQ(store.entries(), 3u);
  EXPECT_LE(store.bytes(), 3 * one);
  ASSERT_NE(store.get("resp_a"), nullptr);  // a is now the most recently used
  EXPECT_TRUE(store.put(stored("resp_d", 1000)));
  EXPECT_EQ(store.get("resp_b"), nullptr);  // b was the least recently used
  EXPECT_NE(store.get("resp_a"), nullptr);
  EXPECT_NE(store.get("resp_c"), nullptr);
  EXPECT_NE(store.get("resp_d"), nullptr);
  EXPECT_EQ(store.stats().evicted, 1);
  // Larger than the whole budget: refused, nothing else lost.
  EXPECT_FALSE(store.put(stored("resp_big", 10 * one)));
  EXPECT_EQ(store.stats().oversize, 1);
  EXPECT_EQ(store.entries(), 3u);
  // Replacing an id keeps one entry; erase frees its bytes.
  EXPECT_TRUE(store.put(stored("resp_a", 10)));
  EXPECT_EQ(store.entries(), 3u);
  const std::size_t before = store.bytes();
  EXPECT_TRUE(store.erase("resp_a"));
  EXPECT_FALSE(store.erase("resp_a"));
  EXPECT_LT(store.bytes(), before);
  EXPECT_EQ(store.get("resp_a"), nullptr);
}

TEST(ServerResponseStore, BytesCountTheConversationTokensAndResponse) {
  auto small = stored("resp_s", 10);
  auto big = stored("resp_l", 10);
  big->tokens.assign(1000, 7);
  big->text = std::string(500, 'y');
  ResponseStore store(1 << 20);
  store.put(small);
  const std::size_t a = store.bytes();
  store.put(big);
  EXPECT_GE(store.bytes() - a, a + 1000 * sizeof(TokenId) + 500);
}

// --- the real Codex requests ---

TEST(ServerResponsesRequest, CodexRequestsParseAndRender) {
  const std::filesystem::path dir =
      std::filesystem::path(FLASHSERVE_SOURCE_DIR) / "tests/agents/fixtures";
  int seen = 0;
  for (int i = 1; i <= 3; ++i) {
    const auto path = dir / ("codex-" + std::to_string(i) + ".json");
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const ojson fixture = ojson::parse(in);
    const std::string body = fixture["body"].dump();
    const ResponsesRequest r = ok(body);
    ++seen;
    EXPECT_TRUE(r.stream);
    EXPECT_FALSE(r.store);  // Codex is stateless: it resends the conversation
    EXPECT_FALSE(r.input.empty());
    // Every function, the ones in namespaces too; web_search is not one.
    EXPECT_GE(r.function_names.size(), 12u);
    EXPECT_NE(std::find(r.function_names.begin(), r.function_names.end(), "exec_command"),
              r.function_names.end());
    const std::string prompt = render(r);
    EXPECT_TRUE(prompt.ends_with("<|im_start|>assistant\n"));
    EXPECT_NE(prompt.find("\"name\": \"exec_command\""), std::string::npos);
    if (r.input.back().kind == ItemKind::kFunctionCallOutput) {
      // The tool turn's second request: the call and its result are in the prompt.
      EXPECT_NE(prompt.find("<tool_call>\n{\"name\": \"exec_command\", \"arguments\": "
                            "{\"cmd\":\"echo flashserve-tool-ok\"}}\n</tool_call>"),
                std::string::npos);
      EXPECT_NE(prompt.find("<tool_response>\nChunk ID:"), std::string::npos);
    }
  }
  EXPECT_EQ(seen, 3);
}

// --- warm continuation with the embedded model's tokenizer and template ---

const Tokenizer& tiny_tokenizer() {
  static const auto bundle =
      load_tokenizer_dir(std::string(FLASHSERVE_SOURCE_DIR) + "/models/qwen4-tiny-code");
  EXPECT_TRUE(bundle.ok()) << bundle.status().to_string();
  return bundle->tokenizer;
}

ResponsesPrompt prompt_of(const ResponsesRequest& r, const StoredResponse* previous) {
  auto p = build_responses_prompt(tiny_tokenizer(), ChatFamily::kQwen, {}, r, previous);
  if (const auto* e = std::get_if<ApiError>(&p)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<ResponsesPrompt>(std::move(p));
}

std::vector<TokenId> encode(std::string_view text) {
  auto ids = tiny_tokenizer().encode(text);
  EXPECT_TRUE(ids.ok());
  return ids.ok() ? *ids : std::vector<TokenId>();
}

TokenId im_end() {
  const auto id = tiny_tokenizer().token_to_id("<|im_end|>");
  EXPECT_TRUE(id.has_value());
  return id.value_or(0);
}

// A finished turn as the store keeps it: the request's prompt, the tokens the model generated
// (ending with the stop token) and the output items the parser made of them.
StoredResponse finished_turn(const ResponsesRequest& r, const ResponsesPrompt& p,
                             std::vector<TokenId> generated, std::vector<ResponseItem> output) {
  generated.push_back(im_end());
  StoredResponse s;
  s.id = "resp_1";
  s.conversation = r.input;
  for (auto& item : output) s.conversation.push_back(std::move(item));
  record_continuation(tiny_tokenizer(), p, generated, s);
  return s;
}

ResponseItem message_item(std::string text) {
  ResponseItem m;
  m.role = "assistant";
  m.text = std::move(text);
  return m;
}

ResponseItem reasoning_item(std::string text) {
  ResponseItem m;
  m.kind = ItemKind::kReasoning;
  m.text = std::move(text);
  return m;
}

ResponseItem call_item(std::string name, std::string args) {
  ResponseItem m;
  m.kind = ItemKind::kFunctionCall;
  m.call_id = "call_1";
  m.name = std::move(name);
  m.arguments = std::move(args);
  return m;
}

bool starts_with(const std::vector<TokenId>& a, const std::vector<TokenId>& prefix) {
  return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}

const char* kTool =
    R"("tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}])";

TEST(ServerResponsesContinuation, FollowUpExtendsTheTurnsExactTokens) {
  const auto r1 = ok(R"({"instructions": "Be brief.", "input": "Write hello world in Python."})");
  const auto p1 = prompt_of(r1, nullptr);
  EXPECT_FALSE(p1.continued);
  const std::string answer = "print('hello world')";
  const StoredResponse s = finished_turn(r1, p1, encode(answer), {message_item(answer)});
  EXPECT_EQ(s.text, p1.text + answer + "<|im_end|>");
  const auto r2 = ok(R"({"instructions": "Be brief.", "previous_response_id": "resp_1",
                        "input": "Now in C."})");
  const auto p2 = prompt_of(r2, &s);
  EXPECT_TRUE(p2.continued);
  EXPECT_TRUE(starts_with(p2.tokens, s.tokens));
  EXPECT_EQ(p2.text.substr(s.text.size()),
            "\n<|im_start|>user\nNow in C.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(p2.tokens, encode(p2.text));  // canonical output: the same as tokenizing it all
}

TEST(ServerResponsesContinuation, TheGeneratedTokensAreKeptWhereRetokenizingDiffers) {
  const auto r1 = ok(R"({"input": "Say hello."})");
  const auto p1 = prompt_of(r1, nullptr);
  // The model spelled "hello" one character at a time: valid, but not how the text tokenizes.
  std::vector<TokenId> spelled;
  for (const char c : std::string("hello")) spelled.push_back(encode(std::string(1, c)).at(0));
  ASSERT_NE(spelled, encode("hello"));
  const StoredResponse s = finished_turn(r1, p1, spelled, {message_item("hello")});
  const auto p2 = prompt_of(ok(R"({"previous_response_id": "resp_1", "input": "Again."})"), &s);
  EXPECT_TRUE(p2.continued);
  EXPECT_TRUE(starts_with(p2.tokens, s.tokens));         // the banked state's key
  EXPECT_FALSE(starts_with(encode(p2.text), s.tokens));  // re-tokenizing would miss it
}

TEST(ServerResponsesContinuation, ToolLoopKeepsReasoningAndTheCall) {
  const auto r1 = ok(std::string("{\"input\": \"Run f.\", ") + kTool + "}");
  const auto p1 = prompt_of(r1, nullptr);
  const std::string generated =
      "<think>\nI should call f.\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
      "{\"a\": 1}}\n</tool_call>";
  const StoredResponse s =
      finished_turn(r1, p1, encode(generated),
                    {reasoning_item("I should call f."), call_item("f", "{\"a\": 1}")});
  const auto r2 = ok(std::string(R"({"previous_response_id": "resp_1", "input": [
      {"type": "function_call_output", "call_id": "call_1", "output": "42"}], )") +
                     kTool + "}");
  const auto p2 = prompt_of(r2, &s);
  EXPECT_TRUE(p2.continued) << p2.text;
  EXPECT_TRUE(starts_with(p2.tokens, s.tokens));
  EXPECT_NE(p2.text.find("<tool_response>\n42\n</tool_response>"), std::string::npos);
}

TEST(ServerResponsesContinuation, ForcedCallTurnIsContinuedToo) {
  const auto r1 =
      ok(std::string(R"({"input": "Run f.", "tool_choice": {"type": "function", "name": "f"}, )") +
         kTool + "}");
  const auto p1 = prompt_of(r1, nullptr);
  EXPECT_TRUE(
      p1.text.ends_with("<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": "));
  EXPECT_EQ(p1.output.forced_prefix, "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
  const StoredResponse s =
      finished_turn(r1, p1, encode("{\"a\": 1}}\n</tool_call>"), {call_item("f", "{\"a\": 1}")});
  const auto r2 = ok(std::string(R"({"previous_response_id": "resp_1", "input": [
      {"type": "function_call_output", "call_id": "call_1", "output": "42"}], )") +
                     kTool + "}");
  const auto p2 = prompt_of(r2, &s);
  EXPECT_TRUE(p2.continued) << p2.text;
  EXPECT_TRUE(starts_with(p2.tokens, s.tokens));
  // required with a single function names it.
  const auto r3 =
      ok(std::string(R"({"input": "Run f.", "tool_choice": "required", )") + kTool + "}");
  EXPECT_EQ(prompt_of(r3, nullptr).output.forced_prefix, p1.output.forced_prefix);
}

TEST(ServerResponsesContinuation, NewQueryDropsOldReasoningButKeepsThePrompt) {
  const auto r1 = ok(R"({"input": "Why?"})");
  const auto p1 = prompt_of(r1, nullptr);
  const StoredResponse s = finished_turn(r1, p1, encode("<think>\nHmm.\n</think>\n\nBecause."),
                                         {reasoning_item("Hmm."), message_item("Because.")});
  const auto p2 = prompt_of(ok(R"({"previous_response_id": "resp_1", "input": "And?"})"), &s);
  // The template shows reasoning only after the latest user query: turn 1 re-renders without
  // it, so the generated tokens are not a prefix; turn 1's prompt still is.
  EXPECT_FALSE(p2.continued);
  EXPECT_FALSE(starts_with(p2.tokens, s.tokens));
  EXPECT_TRUE(starts_with(p2.tokens, p1.tokens));
}

// Thinking off: the generation prompt ends in an empty think block that the history does not
// show, so a new user message's prompt does not extend the previous prompt (docs/SERVER.md says
// so; a template that kept the block would make this a continuation).
TEST(ServerResponsesContinuation, ThinkingOffFollowUpDivergesInsideThePreviousPrompt) {
  const auto r1 = ok(R"({"input": "Why?", "reasoning": {"effort": "none"}})");
  const auto p1 = prompt_of(r1, nullptr);
  EXPECT_TRUE(p1.text.ends_with("<think>\n\n</think>\n\n"));
  const StoredResponse s = finished_turn(r1, p1, encode("Because."), {message_item("Because.")});
  const auto p2 = prompt_of(
      ok(R"({"previous_response_id": "resp_1", "input": "And?", "reasoning": {"effort": "none"}})"),
      &s);
  EXPECT_FALSE(p2.continued);
  EXPECT_FALSE(starts_with(p2.tokens, p1.tokens));
}

// The engine reports the tokens its committed state covers after the prompt, and a prompt that
// extends prompt + those tokens continues from that state: what previous_response_id relies on.
TEST(ServerResponsesEngine, GeneratedTokensAreTheBankedKey) {
  auto model = load_model(std::string(FLASHSERVE_SOURCE_DIR) + "/models/qwen4-tiny-code");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto bundle = load_tokenizer_dir(std::string(FLASHSERVE_SOURCE_DIR) + "/models/qwen4-tiny-code");
  ASSERT_TRUE(bundle.ok());
  Metrics metrics;
  auto engine = Engine::create(EngineOptions{}, std::move(*model), *bundle, metrics);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const auto run = [&](std::vector<TokenId> prompt) {
    auto job = std::make_shared<Job>();
    job->prompt = std::move(prompt);
    job->max_tokens = 6;
    job->api = "responses";
    EXPECT_TRUE((*engine)->submit(job));
    for (;;) {
      auto e = job->next(std::chrono::milliseconds(60000));
      if (!e) {
        ADD_FAILURE() << "no event within 60 s";
        return JobSummary{};
      }
      if (e->done()) return e->summary;
    }
  };
  auto prompt =
      bundle->tokenizer.encode("<|im_start|>user\ndef f(x):<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_TRUE(prompt.ok());
  const JobSummary first = run(*prompt);
  ASSERT_NE(first.finish_reason, "error") << first.error;
  EXPECT_EQ(first.generated.size(), static_cast<std::size_t>(first.completion_tokens));
  std::vector<TokenId> next = *prompt;
  next.insert(next.end(), first.generated.begin(), first.generated.end());
  auto more =
      bundle->tokenizer.encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_TRUE(more.ok());
  next.insert(next.end(), more->begin(), more->end());
  const JobSummary second = run(next);
  EXPECT_EQ(second.session_tier, "ram");
  EXPECT_EQ(second.reused_tokens, prompt->size() + first.generated.size());
}

}  // namespace
}  // namespace fs::server
