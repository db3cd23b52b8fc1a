// The HTTP server's pure parts: request parsing and validation, error bodies, SSE framing,
// response shapes, stop sequences on a text stream, and the Prometheus exposition.
#include <gtest/gtest.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "format/json_parse.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/format.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/sse.h"
#include "server/stop_matcher.h"

namespace fs::server {
namespace {

using json = nlohmann::json;

const RequestLimits kLimits;

GenerationRequest ok_request(const ParsedRequest& p) {
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

TEST(ServerRequest, ChatFieldsAreRead) {
  const auto r = ok_request(parse_openai_chat(R"({
    "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7,
    "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 42, "stop": "END", "stream": true,
    "stream_options": {"include_usage": true}, "n": 1, "user": "ignored"})",
                                              kLimits));
  EXPECT_EQ(r.kind, ApiKind::kChat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.chat.messages.size(), 1u);
  EXPECT_TRUE(r.chat.add_generation_prompt);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_DOUBLE_EQ(r.sampler.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.sampler.top_p, 0.9);
  EXPECT_EQ(r.sampler.top_k, 40);
  EXPECT_DOUBLE_EQ(r.sampler.min_p, 0.05);
  EXPECT_DOUBLE_EQ(r.sampler.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(r.sampler.frequency_penalty, -0.5);
  EXPECT_DOUBLE_EQ(r.sampler.repetition_penalty, 1.1);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

// The model's generation_config.json sampling (limits.sampling_defaults, read by `serve`) fills
// what a request leaves unset, on every API (the Responses API: test_server_responses.cpp); what
// it sets wins field by field.
TEST(ServerRequest, UnsetSamplingFieldsTakeTheModelsDefaults) {
  RequestLimits limits;
  limits.sampling_defaults.temperature = 0.7;
  limits.sampling_defaults.top_p = 0.8;
  limits.sampling_defaults.top_k = 20;
  const auto expect_defaults = [](const SamplerConfig& s, double temperature) {
    EXPECT_DOUBLE_EQ(s.temperature, temperature);
    EXPECT_DOUBLE_EQ(s.top_p, 0.8);
    EXPECT_EQ(s.top_k, 20);
    EXPECT_DOUBLE_EQ(s.min_p, 0.0);
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  expect_defaults(ok_request(parse_openai_chat("{" + messages + "}", limits)).sampler, 0.7);
  expect_defaults(
      ok_request(parse_openai_chat("{" + messages + R"(, "temperature": 0.2})", limits)).sampler,
      0.2);
  expect_defaults(ok_request(parse_openai_completion(R"({"prompt": "x"})", limits)).sampler, 0.7);
  expect_defaults(
      ok_request(parse_anthropic_messages("{" + messages + R"(, "max_tokens": 5})", limits))
          .sampler,
      0.7);
  // A request's own value that the defaults would not allow alone still wins.
  const auto r = ok_request(
      parse_openai_chat("{" + messages + R"(, "top_k": 0, "top_p": 1, "min_p": 0.1})", limits));
  EXPECT_EQ(r.sampler.top_k, 0);
  EXPECT_DOUBLE_EQ(r.sampler.top_p, 1.0);
  EXPECT_DOUBLE_EQ(r.sampler.min_p, 0.1);
  EXPECT_DOUBLE_EQ(r.sampler.temperature, 0.7);
}

TEST(ServerRequest, ChatDefaults) {
  const auto r =
      ok_request(parse_openai_chat(R"({"messages": [{"role": "user", "content": "x"}]})", kLimits));
  EXPECT_EQ(r.max_tokens, kLimits.default_max_tokens);
  EXPECT_TRUE(r.sampler.greedy());
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(r.stream);
  // max_completion_tokens wins over max_tokens when both are given (it is read last).
  const auto both = ok_request(parse_openai_chat(
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
          "max_completion_tokens": 9, "temperature": null})",
      kLimits));
  EXPECT_EQ(both.max_tokens, 9);
  // Above the server's limit: clamped to it, not refused.
  const auto huge = ok_request(parse_openai_chat(
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999})", kLimits));
  EXPECT_EQ(huge.max_tokens, kLimits.max_tokens);
}

TEST(ServerRequest, ChatErrorsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 2.5})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "warm"})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0})",
       "repetition_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 2.5})",
       "repetition_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 3})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": 1})", "stream"},
      {R"({"messages": [{"role": "user", "content": "x"}], "seed": "s"})", "seed"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage"},
      {R"({"messages": "x"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "alien", "content": "x"}]})", "messages"},
      {R"({})", "messages"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = error_of(parse_openai_chat(body, kLimits));
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_NE(e.message.find(param.substr(0, param.find('.'))), std::string::npos)
        << body << " -> " << e.message;
  }
}

TEST(ServerRequest, MalformedBodies) {
  for (const char* body : {"", "{", "[]", "null", "42", "\"x\"", "{\"messages\": [}"}) {
    const ApiError e = error_of(parse_openai_chat(body, kLimits));
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_FALSE(e.message.empty());
  }
}

// The body of issue 13: ~120k nested '[' inside a message field. It used to overflow the stack
// (SIGSEGV) in the recursive copies of the request JSON; it must be a 400 naming the limit.
TEST(ServerRequestHostile, DeepNestingIsA400NotACrash) {
  for (const std::size_t depth : {65ul, 1000ul, 120000ul}) {
    std::string body = R"({"model":"m","messages":[{"role":"user","content":)";
    body.append(depth, '[');
    body += "\"x\"";
    body.append(depth, ']');
    body += "}]}";
    for (const auto& e : {error_of(parse_openai_chat(body, kLimits)),
                          error_of(parse_anthropic_messages(body, kLimits))}) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(e.message.find("nested deeper than 64"), std::string::npos) << e.message;
    }
  }
  // Unclosed nesting too (the parser stops at the limit, not at the end of the text).
  const std::string open_only = R"({"messages":)" + std::string(240000, '[');
  EXPECT_EQ(error_of(parse_openai_chat(open_only, kLimits)).status, 400);
  // Nesting within the limit is accepted where the API allows arbitrary JSON (tool schemas).
  std::string tools =
      R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":)";
  for (int i = 0; i < 50; ++i) tools += R"({"a":)";
  tools += "1";
  for (int i = 0; i < 50; ++i) tools += "}";
  tools += "}}]}";
  EXPECT_EQ(ok_request(parse_openai_chat(tools, kLimits)).chat.tools.size(), 1u);
}

// An object of n keys used to cost O(n^2) (ordered_json inserts each key by a linear scan): 80k
// keys took 10 s. Linear now (0.3 s and 0.9 s for 80k and 320k keys on the 2-core machine); the
// time grows about linearly (the 4x larger body may take at most 10x as long, with slack for a busy
// machine).
TEST(ServerRequestHostile, ManyKeysParseInLinearTime) {
  const auto body_with_keys = [](int n) {
    std::string body = R"({"messages":[{"role":"user","content":"hi"}])";
    for (int i = 0; i < n; ++i) body += ",\"k" + std::to_string(i) + "\":0";
    return body + "}";
  };
  // The best of three runs: another process taking the core for a moment must not read as
  // superlinear growth.
  const auto seconds = [&](int n) {
    const std::string body = body_with_keys(n);
    double best = 1e9;
    for (int run = 0; run < 3; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      (void)ok_request(parse_openai_chat(body, kLimits));
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  (void)seconds(1000);  // warm up the allocator
  const double t80 = seconds(80000);
  const double t320 = seconds(320000);
  EXPECT_LT(t80, 2.0);
  EXPECT_LT(t320, 6.0);
  EXPECT_LT(t320, 10 * t80 + 0.05) << "80k keys " << t80 << " s, 320k keys " << t320 << " s";
  std::cout << "80k keys: " << t80 << " s, 320k keys: " << t320 << " s\n";
  // A repeated key keeps its last value, as nlohmann's own parser does.
  const auto r = ok_request(parse_openai_chat(
      R"({"messages":[{"role":"user","content":"a"}],"max_tokens":3,"max_tokens":5})", kLimits));
  EXPECT_EQ(r.max_tokens, 5);
}

// Too many values is refused while parsing, before the document is built.
TEST(ServerRequestHostile, ValueCountIsBounded) {
  RequestLimits small = kLimits;
  small.max_json_values = 1000;
  std::string body = R"({"messages":[{"role":"user","content":"hi"}],"x":[)";
  for (int i = 0; i < 2000; ++i) body += i ? ",0" : "0";
  body += "]}";
  const auto e = error_of(parse_openai_chat(body, small));
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("more than 1000 values"), std::string::npos) << e.message;
}

// Memory per request, measured: the heap held by a parsed body (the peak of a request, which
// keeps the body text and the document while it validates), over the body's size, for the
// bodies that cost the most per byte (many tiny values, many small objects, many keys, long
// strings). The server's body limit times this ratio bounds what one request can take
// (docs/SERVER.md).
TEST(ServerRequestHostile, MemoryPerRequestIsBoundedAndMeasured) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "glibc's malloc statistics do not see AddressSanitizer's allocator";
#endif
  const auto chat_with = [](const std::string& extra) {
    return R"({"messages":[{"role":"user","content":"hi"}],"x":)" + extra + "}";
  };
  std::string zeros = "[0";
  std::string empties = "[[]";
  std::string objects = "[{}";
  std::string keys = "{\"k0\":0";
  for (int i = 1; i < 200000; ++i) {
    zeros += ",0";
    empties += ",[]";
    objects += ",{}";
    keys += ",\"k" + std::to_string(i) + "\":0";
  }
  zeros += "]";
  empties += "]";
  objects += "]";
  keys += "}";
  const std::string text =
      R"({"messages":[{"role":"user","content":")" + std::string(1 << 20, 'a') + R"("}]})";
  double worst = 0;
  for (const std::string& body :
       {chat_with(zeros), chat_with(empties), chat_with(objects), chat_with(keys), text}) {
    malloc_trim(0);
    const auto before = mallinfo2().uordblks;
    {
      ASSERT_TRUE(std::holds_alternative<GenerationRequest>(parse_openai_chat(body, kLimits)));
      JsonLimits limits;
      limits.max_depth = kLimits.max_json_depth;
      limits.max_values = kLimits.max_json_values;
      const auto parsed = parse_ordered_json_bounded(body, limits);
      ASSERT_TRUE(parsed.ok());
      const auto held = mallinfo2().uordblks;
      const double ratio =
          static_cast<double>(held > before ? held - before : 0) / static_cast<double>(body.size());
      worst = std::max(worst, ratio);
    }
  }
  std::cout << "request memory: at most " << worst << " x the body size\n";
  EXPECT_LT(worst, 20.0);  // 16.0 measured (many empty arrays)
}

// Unicode the parser must pass through unchanged or refuse cleanly: escaped surrogate pairs,
// raw multi-byte text, a lone surrogate escape, invalid UTF-8 bytes.
TEST(ServerRequestHostile, UnicodeBodies) {
  const auto r = ok_request(parse_openai_chat(
      "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud83d\\ude00 \\u00e9 \xe6\x97\xa5\"}]}",
      kLimits));
  EXPECT_EQ(r.chat.messages[0].text(), "\xF0\x9F\x98\x80 \xC3\xA9 \xE6\x97\xA5");
  EXPECT_EQ(
      error_of(parse_openai_chat(R"({"messages":[{"role":"user","content":"\ud800"}]})", kLimits))
          .status,
      400);
  EXPECT_EQ(error_of(parse_openai_chat(
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", kLimits))
                .status,
            400);
}

TEST(ServerAuth, KeysMatchOnlyExactly) {
  EXPECT_TRUE(api_key_matches("sekret", "", "sekret"));
  EXPECT_TRUE(api_key_matches("", "Bearer sekret", "sekret"));
  EXPECT_TRUE(api_key_matches("wrong", "Bearer sekret", "sekret"));
  for (const char* bad : {"", "sekre", "sekret2", "Sekret", "sekret\n", "s"}) {
    EXPECT_FALSE(api_key_matches(bad, "", "sekret")) << bad;
    EXPECT_FALSE(api_key_matches("", std::string("Bearer ") + bad, "sekret")) << bad;
  }
  EXPECT_FALSE(api_key_matches("", "sekret", "sekret"));  // no "Bearer "
  EXPECT_FALSE(api_key_matches("", "Basic sekret", "sekret"));
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_FALSE(constant_time_equal("a", ""));
  EXPECT_FALSE(constant_time_equal("", "a"));
}

// The comparison takes the same time wherever the first difference is: a candidate wrong in its
// first byte and one wrong in its last byte cost the same (a plain == returns at the first
// difference, ~1000x faster for the first than for the last on a 1 MiB key).
TEST(ServerAuth, ComparisonTimeDoesNotDependOnWhereKeysDiffer) {
  const std::string key(1 << 20, 'k');
  std::string first = key, last = key;
  first.front() = 'x';
  last.back() = 'x';
  const auto best_of = [&](const std::string& candidate) {
    double best = 1e9;
    for (int trial = 0; trial < 15; ++trial) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 4; ++i) EXPECT_FALSE(constant_time_equal(candidate, key));
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double t_first = best_of(first), t_last = best_of(last), t_short = best_of("k");
  std::cout << "1 MiB key: differing first " << t_first * 1e6 / 4 << " us, last "
            << t_last * 1e6 / 4 << " us, 1-byte candidate " << t_short * 1e6 / 4 << " us\n";
  EXPECT_GT(t_first / t_last, 0.5);
  EXPECT_LT(t_first / t_last, 2.0);
  EXPECT_GT(t_short / t_last, 0.5);  // a short candidate does not return early either
}

TEST(ServerRequest, Completion) {
  const auto r = ok_request(
      parse_openai_completion(R"({"prompt": "def f():", "stop": ["\n\n", "#"]})", kLimits));
  EXPECT_EQ(r.kind, ApiKind::kCompletion);
  EXPECT_EQ(r.prompt, "def f():");
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_EQ(error_of(parse_openai_completion(R"({"prompt": [1, 2]})", kLimits)).param, "prompt");
  EXPECT_EQ(error_of(parse_openai_completion(R"({})", kLimits)).param, "prompt");
}

TEST(ServerRequest, AnthropicMessages) {
  const auto r = ok_request(parse_anthropic_messages(R"({
    "model": "claude", "max_tokens": 10, "system": [{"type": "text", "text": "Be brief."}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                 {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}],
    "stop_sequences": ["X"], "temperature": 1.0, "top_k": 5, "metadata": {"user_id": "u"}})",
                                                     kLimits));
  ASSERT_EQ(r.chat.messages.size(), 4u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  EXPECT_EQ(r.chat.messages[0].text(), "Be brief.");
  EXPECT_EQ(r.chat.messages[1].text(), "ab");
  EXPECT_EQ(r.max_tokens, 10);
  EXPECT_EQ(r.stop, std::vector<std::string>{"X"});
  EXPECT_EQ(r.sampler.top_k, 5);

  EXPECT_EQ(error_of(parse_anthropic_messages(R"({"messages": [{"role": "user", "content": "x"}]})",
                                              kLimits))
                .param,
            "max_tokens");
  EXPECT_EQ(error_of(parse_anthropic_messages(
                         R"({"max_tokens": 5, "temperature": 1.5,
                             "messages": [{"role": "user", "content": "x"}]})",
                         kLimits))
                .param,
            "temperature");
  EXPECT_EQ(
      error_of(parse_anthropic_messages(
                   R"({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]})", kLimits))
          .param,
      "messages[0].role");
  EXPECT_EQ(error_of(parse_anthropic_messages(
                         R"({"max_tokens": 5, "messages": [{"role": "user",
                             "content": [{"type": "image"}]}]})",
                         kLimits))
                .param,
            "messages[0].content[0].type");
}

TEST(ServerErrors, Shapes) {
  ApiError e = ApiError::invalid("top_p", "'top_p' must be between 0 and 1", "bad");
  const json o = json::parse(openai_error_body(e));
  EXPECT_EQ(o["error"]["param"], "top_p");
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  EXPECT_EQ(o["error"]["code"], "bad");
  EXPECT_EQ(o["error"]["message"], "'top_p' must be between 0 and 1");
  const json none = json::parse(openai_error_body(ApiError::invalid("", "x")));
  EXPECT_TRUE(none["error"]["param"].is_null());
  EXPECT_TRUE(none["error"]["code"].is_null());
  const json a = json::parse(anthropic_error_body(e));
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "invalid_request_error");
  e.status = 503;
  EXPECT_EQ(json::parse(anthropic_error_body(e))["error"]["type"], "overloaded_error");
  EXPECT_EQ(anthropic_error_type(401), "authentication_error");
  EXPECT_EQ(anthropic_error_type(413), "request_too_large");
}

TEST(ServerSse, Framing) {
  EXPECT_EQ(sse_data(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_event("ping", json{{"type", "ping"}}),
            "event: ping\ndata: {\"type\":\"ping\"}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_comment("waiting"), ": waiting\n\n");
  // Newlines in text stay escaped inside the one data line; invalid UTF-8 does not throw.
  EXPECT_EQ(sse_data(json{{"t", "a\nb"}}), "data: {\"t\":\"a\\nb\"}\n\n");
  EXPECT_NO_THROW(sse_data(json{{"t", std::string("\xff\xfe")}}));
}

// The data payloads of an SSE text, in order.
std::vector<json> payloads(const std::string& sse) {
  std::vector<json> out;
  std::size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const std::size_t end = sse.find("\n\n", at);
    const std::string data = sse.substr(at + 6, end - at - 6);
    if (data != "[DONE]") out.push_back(json::parse(data));
    at = end;
  }
  return out;
}

OutputEvent text_event(std::string text) {
  OutputEvent e;
  e.kind = OutputEventKind::kText;
  e.text = std::move(text);
  return e;
}

TEST(ServerFormat, OpenAiChatStream) {
  ResponseMeta meta{"chatcmpl-1", 100, "m", 5};
  auto f = make_stream_formatter(ApiKind::kChat, meta, StreamOptions{/*include_usage=*/true});
  JobSummary s;
  s.finish_reason = "length";
  s.prompt_tokens = 5;
  s.completion_tokens = 2;
  // One call per statement: the order of the operands of + is unspecified.
  std::string all = f->start(s);
  all += f->events({text_event("he")}, {});
  all += f->events({text_event("y")}, {});
  all += f->finish(s, {});
  const auto p = payloads(all);
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(p[1]["choices"][0]["delta"]["content"], "he");
  EXPECT_TRUE(p[1]["usage"].is_null());
  EXPECT_EQ(p[3]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(p[4]["choices"].empty());
  EXPECT_EQ(p[4]["usage"]["total_tokens"], 7);
  EXPECT_NE(all.find("data: [DONE]\n\n"), std::string::npos);
}

TEST(ServerFormat, AnthropicStreamEventOrder) {
  ResponseMeta meta{"msg_1", 100, "m", 5};
  auto f = make_stream_formatter(ApiKind::kMessages, meta, {});
  JobSummary s;
  s.finish_reason = "stop";
  s.stop_sequence = "END";
  s.prompt_tokens = 5;
  s.completion_tokens = 3;
  std::string all = f->start(s);
  all += f->events({text_event("x")}, {});
  all += f->finish(s, {});
  std::vector<std::string> events;
  for (std::size_t at = 0; (at = all.find("event: ", at)) != std::string::npos; ++at)
    events.push_back(all.substr(at + 7, all.find('\n', at) - at - 7));
  EXPECT_EQ(events,
            (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"}));
  const auto p = payloads(all);
  EXPECT_EQ(p[0]["message"]["usage"]["input_tokens"], 5);
  EXPECT_EQ(p[4]["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(p[4]["delta"]["stop_sequence"], "END");
  EXPECT_EQ(p[4]["usage"]["output_tokens"], 3);
}

TEST(ServerFormat, CompleteResponses) {
  ResponseMeta meta{"id", 1, "m", 4};
  JobSummary s;
  s.finish_reason = "stop";
  s.prompt_tokens = 4;
  s.completion_tokens = 2;
  ParsedOutput hi;
  hi.content = "hi";
  const json chat = complete_response(ApiKind::kChat, meta, hi, s);
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(chat["usage"]["total_tokens"], 6);
  const json msg = complete_response(ApiKind::kMessages, meta, hi, s);
  EXPECT_EQ(msg["content"][0]["text"], "hi");
  EXPECT_EQ(msg["stop_reason"], "end_turn");
  s.finish_reason = "length";
  EXPECT_EQ(complete_response(ApiKind::kMessages, meta, hi, s)["stop_reason"], "max_tokens");
  EXPECT_EQ(complete_response(ApiKind::kCompletion, meta, hi, s)["choices"][0]["finish_reason"],
            "length");
}

TEST(ServerStop, HoldsBackPrefixesAndCutsAtTheMatch) {
  StopMatcher m({"</end>", "STOP"});
  std::string out;
  for (const char* piece : {"hello <", "/e", "n", "x ok ST", "OP and more"}) out += m.push(piece);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(out, "hello </enx ok ");
  EXPECT_EQ(m.push("later"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(ServerStop, NoStopPassesEverything) {
  StopMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
  StopMatcher m({"xyz"});
  EXPECT_EQ(m.push("abx"), "ab");  // "x" might start "xyz"
  EXPECT_EQ(m.push("y"), "");
  EXPECT_EQ(m.flush(), "xy");  // generation ended: the held text was plain text
  EXPECT_FALSE(m.stopped());
  StopMatcher first({"bc", "abcd"});
  EXPECT_EQ(first.push("zabcd"), "z");  // the earliest match wins
  EXPECT_EQ(first.matched(), "abcd");
}

TEST(ServerMetrics, PrometheusText) {
  Metrics m;
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/messages", 400);
  m.add_tokens(10, 3);
  m.observe_ttft(0.02);
  m.observe_inter_token(0.003);
  m.observe_inter_token(2.0);
  m.add_mtp(1, 5, 4);
  m.add_mtp(4, 1, 1);  // out of range: ignored
  m.count_session("chat", "ram");
  m.count_session("messages", "ram");
  m.count_session("messages", "ram");
  ExternalStats ext;
  ext.checkpoint_rejections["bad_checksum"] = 2;
  const std::string t = m.render(ext);
  const auto has = [&](const std::string& line) {
    EXPECT_NE(t.find(line + "\n"), std::string::npos) << line;
  };
  has("flashserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2");
  has("flashserve_requests_total{endpoint=\"/v1/messages\",status=\"400\"} 1");
  has("flashserve_prompt_tokens_total 10");
  has("flashserve_generated_tokens_total 3");
  has("# TYPE flashserve_time_to_first_token_seconds histogram");
  has("flashserve_time_to_first_token_seconds_bucket{le=\"0.01\"} 0");
  has("flashserve_time_to_first_token_seconds_bucket{le=\"0.025\"} 1");
  has("flashserve_time_to_first_token_seconds_count 1");
  has("flashserve_inter_token_latency_seconds_bucket{le=\"1\"} 1");
  has("flashserve_inter_token_latency_seconds_bucket{le=\"+Inf\"} 2");
  has("flashserve_mtp_drafted_total{depth=\"1\"} 5");
  has("flashserve_mtp_accepted_total{depth=\"1\"} 4");
  // Per API, every API and tier present from the start.
  has("flashserve_session_lookups_total{api=\"chat\",tier=\"ram\"} 1");
  has("flashserve_session_lookups_total{api=\"messages\",tier=\"ram\"} 2");
  has("flashserve_session_lookups_total{api=\"chat\",tier=\"cold\"} 0");
  has("flashserve_session_lookups_total{api=\"responses\",tier=\"disk\"} 0");
  has("flashserve_session_lookups_total{api=\"completions\",tier=\"ram\"} 0");
  has("flashserve_checkpoint_rejections_total{reason=\"bad_checksum\"} 2");
  EXPECT_EQ(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

}  // namespace
}  // namespace fs::server
