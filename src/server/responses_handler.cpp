#include "server/responses_handler.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <ctime>
#include <random>

#include "server/api_error.h"
#include "server/front_door.h"
#include "server/random_id.h"
#include "server/responses_format.h"
#include "server/responses_prompt.h"
#include "server/responses_request.h"
#include "server/sse.h"

namespace fs::server {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr const char* kCancelled = "the generation was cancelled (the server is stopping)";

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(openai_error_body(e), "application/json");
}

ApiError server_error(int status, std::string code, std::string message) {
  ApiError e;
  e.status = status;
  e.type = "server_error";
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

// One response from its first event to its last: the output events feeding the builder, and
// at the end the store entry. Shared by the plain and the streamed paths.
class Turn {
 public:
  Turn(const ResponsesDeps& deps, const ResponsesRequest& request, ResponseMetaInfo meta,
       bool streaming)
      : deps_(deps), request_(request), builder_(std::move(meta), request, streaming) {}

  // What the store keeps besides the output: the conversation so far (the last `input` items
  // are this request's) and the prompt.
  void set_context(std::vector<ResponseItem> conversation, std::size_t input,
                   ResponsesPrompt prompt) {
    conversation_ = std::move(conversation);
    input_ = input;
    prompt_ = std::move(prompt);
  }

  std::string start() { return builder_.start(); }
  std::string output(const std::vector<OutputEvent>& events) { return builder_.add(events); }

  std::string done(const JobSummary& s) {
    // The reasoning's share of the output, counted by tokenizing its text again.
    std::int64_t reasoning_tokens = 0;
    if (const std::string r = builder_.reasoning_text(); !r.empty())
      if (auto ids = deps_.tokenizer->encode(r); ids.ok())
        reasoning_tokens = static_cast<std::int64_t>(ids->size());
    std::string out = builder_.finish(s, reasoning_tokens);
    if (request_.store) save(s);
    return out;
  }
  std::string fail(const std::string& message) { return builder_.fail(message); }
  const ojson& response() const { return builder_.response(); }

 private:
  void save(const JobSummary& s) {
    auto entry = std::make_shared<StoredResponse>();
    entry->id = builder_.response()["id"].get<std::string>();
    entry->response = builder_.response();
    entry->conversation = std::move(conversation_);
    entry->input_end = entry->conversation.size();
    entry->input_begin = entry->input_end - input_;
    for (const auto& item : builder_.output_items()) entry->conversation.push_back(item);
    record_continuation(*deps_.tokenizer, prompt_, s.generated, *entry);
    deps_.store->put(std::move(entry));
  }

  const ResponsesDeps& deps_;
  const ResponsesRequest& request_;
  ResponseBuilder builder_;
  std::vector<ResponseItem> conversation_;
  std::size_t input_ = 0;
  ResponsesPrompt prompt_;
};

}  // namespace

void handle_responses_create(const ResponsesDeps& deps, const httplib::Request& req,
                             httplib::Response& res) {
  const auto arrived = Clock::now();
  ParsedResponsesRequest parsed = parse_responses_request(req.body, deps.limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  // Shared with the stream's content provider, which outlives this call.
  auto r = std::make_shared<const ResponsesRequest>(std::move(std::get<ResponsesRequest>(parsed)));

  std::shared_ptr<const StoredResponse> previous;
  if (!r->previous_response_id.empty()) {
    previous = deps.store->get(r->previous_response_id);
    if (!previous)
      return send_error(res, ApiError::invalid("previous_response_id",
                                               "Previous response with id '" +
                                                   r->previous_response_id + "' not found.",
                                               "previous_response_not_found"));
  }
  auto built =
      build_responses_prompt(*deps.tokenizer, deps.family, deps.special, *r, previous.get());
  if (const auto* e = std::get_if<ApiError>(&built)) return send_error(res, *e);
  ResponsesPrompt& prompt = std::get<ResponsesPrompt>(built);
  const auto n_prompt = static_cast<std::int64_t>(prompt.tokens.size());
  if (n_prompt >= deps.max_context)
    return send_error(res, ApiError::invalid("input",
                                             "the input has " + std::to_string(n_prompt) +
                                                 " tokens; this model's context is " +
                                                 std::to_string(deps.max_context) + " tokens",
                                             "context_length_exceeded"));

  auto job = std::make_shared<Job>();
  job->received = arrived;
  job->prompt = prompt.tokens;
  // No limit given: as much as the context holds (OpenAI's default is the model's maximum).
  const std::int64_t room = std::min(deps.max_context - n_prompt, deps.limits.max_tokens);
  job->max_tokens = std::min(r->max_output_tokens.value_or(room), room);
  job->sampler = r->sampler;
  job->seed = random_seed();
  job->output = prompt.output;
  job->api = "responses";
  if (!deps.engine->submit(job)) {
    deps.metrics->count_queue_full();
    res.set_header("Retry-After", "1");
    return send_error(res, server_error(503, "queue_full",
                                        "the server is busy (the request queue is full); retry "
                                        "later"));
  }

  ResponseMetaInfo meta;
  meta.id = "resp_" + random_hex(32);
  meta.created_at = static_cast<std::int64_t>(std::time(nullptr));
  meta.model = r->model.empty() ? deps.model_id : r->model;
  meta.max_output_tokens = r->max_output_tokens;
  meta.previous_response_id = r->previous_response_id;
  auto turn = std::make_shared<Turn>(deps, *r, meta, r->stream);
  std::vector<ResponseItem> conversation =
      previous ? previous->conversation : std::vector<ResponseItem>();
  conversation.insert(conversation.end(), r->input.begin(), r->input.end());
  turn->set_context(std::move(conversation), r->input.size(), std::move(prompt));

  const auto deadline = arrived + std::chrono::seconds(deps.request_timeout_s);
  const char* timeout_message =
      "the request did not finish within the server's deadline (--request-timeout-s)";

  if (!r->stream) {
    (void)turn->start();
    auto next_check = Clock::now();
    for (;;) {
      auto e = job->next(std::chrono::milliseconds(50));
      if (const auto now = Clock::now(); now >= next_check) {
        next_check = now + std::chrono::milliseconds(50);
        if (client_disconnected()) {
          job->cancelled = true;
          ApiError gone;
          gone.status = 499;
          gone.type = "client_closed_request";
          gone.message = "the client disconnected";
          res.set_header("Connection", "close");
          return send_error(res, gone);
        }
        if (now >= deadline) {
          job->cancelled = true;
          return send_error(res, server_error(504, "request_timeout", timeout_message));
        }
      }
      if (!e) continue;
      if (!e->done()) {
        (void)turn->output(e->output);
        continue;
      }
      if (e->summary.finish_reason == "error")
        return send_error(
            res, server_error(500, "server_error", "generation failed: " + e->summary.error));
      // Cancelled by the server itself (it is stopping): not an answer.
      if (e->summary.finish_reason == "cancelled")
        return send_error(res, server_error(503, "cancelled", kCancelled));
      (void)turn->done(e->summary);
      res.set_content(dump(turn->response()), "application/json");
      return;
    }
  }

  struct StreamState {
    std::shared_ptr<const ResponsesRequest> request;  // the turn refers to it
    std::shared_ptr<Job> job;
    std::shared_ptr<Turn> turn;
    bool started = false;
    bool finished = false;
    Clock::time_point deadline;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<StreamState>();
  st->request = r;
  st->job = job;
  st->turn = turn;
  st->deadline = deadline;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, timeout_message](std::size_t, httplib::DataSink& sink) {
        const auto write = [&](const std::string& s) {
          if (!s.empty()) st->last_write = Clock::now();
          if (s.empty() || sink.write(s.data(), s.size())) return true;
          st->job->cancelled = true;  // the client has gone: stop generating for it
          return false;
        };
        if (st->finished) {
          sink.done();
          return true;
        }
        if (!st->started) {
          st->started = true;
          return write(st->turn->start());
        }
        for (;;) {
          if (Clock::now() >= st->deadline) {
            st->job->cancelled = true;
            st->finished = true;
            if (!write(st->turn->fail(timeout_message))) return false;
            sink.done();
            return true;
          }
          auto e = st->job->next(std::chrono::milliseconds(100));
          if (!e) {
            if (!sink.is_writable()) {
              st->job->cancelled = true;
              return false;
            }
            // A long prefill or a wait in the queue sends nothing for a while: an SSE comment
            // every 5 s keeps the client's idle timer and any proxy from giving up.
            if (Clock::now() - st->last_write >= std::chrono::seconds(5))
              return write(sse_comment("waiting"));
            continue;
          }
          if (!e->done()) {
            const std::string events = st->turn->output(e->output);
            if (events.empty()) continue;  // started, or nothing visible yet: wait for more
            return write(events);
          }
          st->finished = true;
          const std::string& reason = e->summary.finish_reason;
          const std::string tail = reason == "error"
                                       ? st->turn->fail("generation failed: " + e->summary.error)
                                   : reason == "cancelled" ? st->turn->fail(kCancelled)
                                                           : st->turn->done(e->summary);
          if (!write(tail)) return false;
          sink.done();
          return true;
        }
      },
      [job](bool) { job->cancelled = true; });
}

void handle_responses_input_tokens(const ResponsesDeps& deps, const httplib::Request& req,
                                   httplib::Response& res) {
  ParsedResponsesRequest parsed = parse_responses_request(req.body, deps.limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  const ResponsesRequest& r = std::get<ResponsesRequest>(parsed);
  std::shared_ptr<const StoredResponse> previous;
  if (!r.previous_response_id.empty() && !(previous = deps.store->get(r.previous_response_id)))
    return send_error(res, ApiError::invalid("previous_response_id",
                                             "Previous response with id '" +
                                                 r.previous_response_id + "' not found.",
                                             "previous_response_not_found"));
  auto built =
      build_responses_prompt(*deps.tokenizer, deps.family, deps.special, r, previous.get());
  if (const auto* e = std::get_if<ApiError>(&built)) return send_error(res, *e);
  const ojson body = {{"object", "response.input_tokens"},
                      {"input_tokens", std::get<ResponsesPrompt>(built).tokens.size()}};
  res.set_content(dump(body), "application/json");
}

void handle_responses_get(const ResponsesDeps& deps, const std::string& id,
                          httplib::Response& res) {
  const auto stored = deps.store->get(id);
  if (!stored) {
    ApiError e;
    e.status = 404;
    e.param = "response_id";
    e.code = "response_not_found";
    e.message = "No response with id '" + id +
                "' is stored (unknown, stored with store: false, "
                "deleted, or evicted from the store).";
    return send_error(res, e);
  }
  res.set_content(dump(stored->response), "application/json");
}

void handle_responses_input_items(const ResponsesDeps& deps, const std::string& id,
                                  const httplib::Request& req, httplib::Response& res) {
  const auto stored = deps.store->get(id);
  if (!stored) {
    ApiError e;
    e.status = 404;
    e.param = "response_id";
    e.code = "response_not_found";
    e.message = "No response with id '" + id + "' is stored.";
    return send_error(res, e);
  }
  // ?order=asc|desc (default desc, newest first), ?limit=1..100 (default 20), ?after=ITEM_ID.
  const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
  if (order != "asc" && order != "desc")
    return send_error(res, ApiError::invalid("order", "'order' must be 'asc' or 'desc'"));
  std::size_t limit = 20;
  if (req.has_param("limit")) {
    const std::string v = req.get_param_value("limit");
    std::size_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > 100)
      return send_error(res,
                        ApiError::invalid("limit", "'limit' must be an integer from 1 to 100"));
    limit = n;
  }
  ojson all = ojson::array();
  const std::string hex = id.substr(id.find('_') + 1);
  for (std::size_t i = stored->input_begin; i < stored->input_end; ++i)
    all.push_back(item_object(stored->conversation[i],
                              "in_" + hex + "_" + std::to_string(i - stored->input_begin)));
  if (order == "desc") std::reverse(all.begin(), all.end());
  std::size_t start = 0;
  if (req.has_param("after")) {
    const std::string after = req.get_param_value("after");
    while (start < all.size() && all[start]["id"] != after) ++start;
    if (start == all.size())
      return send_error(res, ApiError::invalid("after", "'after' names no item of this response"));
    ++start;
  }
  ojson data = ojson::array();
  for (std::size_t i = start; i < all.size() && data.size() < limit; ++i) data.push_back(all[i]);
  const ojson body = {{"object", "list"},
                      {"data", data},
                      {"first_id", data.empty() ? ojson(nullptr) : data.front()["id"]},
                      {"last_id", data.empty() ? ojson(nullptr) : data.back()["id"]},
                      {"has_more", start + data.size() < all.size()}};
  res.set_content(dump(body), "application/json");
}

void handle_responses_delete(const ResponsesDeps& deps, const std::string& id,
                             httplib::Response& res) {
  if (!deps.store->erase(id)) {
    ApiError e;
    e.status = 404;
    e.param = "response_id";
    e.code = "response_not_found";
    e.message = "No response with id '" + id + "' is stored.";
    return send_error(res, e);
  }
  res.set_content(dump(response_deleted(id)), "application/json");
}

}  // namespace fs::server
