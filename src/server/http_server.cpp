#include "server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "decode/sampling_defaults.h"
#include "model/gguf_config.h"
#include "model/loader.h"
#include "server/auth.h"
#include "server/engine.h"
#include "server/format.h"
#include "server/front_door.h"
#include "server/metrics.h"
#include "server/random_id.h"
#include "server/response_store.h"
#include "server/responses_handler.h"
#include "server/sse.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/metadata.h"

namespace fs::server {
namespace {

using json = nlohmann::json;

struct Context {
  explicit Context(TokenizerBundle t) : tokenizer(std::move(t)) {}
  ServerOptions options;
  TokenizerBundle tokenizer;
  ChatFamily family = ChatFamily::kQwen;
  ChatSpecialTokens special;
  std::string model_id;
  std::int64_t created = 0;
  std::int64_t max_context = 0;
  Metrics metrics;
  GuardedServer* door = nullptr;
  std::unique_ptr<ResponseStore> responses;  // stored responses of /v1/responses
  ResponsesDeps responses_deps;
  std::unique_ptr<Engine> engine;  // last: it refers to the tokenizer and metrics above
};

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int) {
  g_stop_signal = 1;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool is_anthropic_path(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0;
}

void send_error(httplib::Response& res, bool anthropic, const ApiError& e) {
  res.status = e.status;
  res.set_content(anthropic ? anthropic_error_body(e) : openai_error_body(e), "application/json");
}

// A bounded label set: unknown paths are counted together, so scanners cannot grow /metrics.
std::string endpoint_label(const std::string& path) {
  for (const char* known :
       {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
        "/v1/models", "/v1/responses", "/v1/responses/input_tokens", "/health", "/metrics"})
    if (path == known) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path.rfind("/v1/responses/", 0) == 0) return "/v1/responses/{id}";
  return "other";
}

// max_position_embeddings from config.json (at the top or under text_config), or from a GGUF
// file's metadata.
std::int64_t model_context(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  const auto gguf = gguf_hf_config(dir);
  const json j = gguf ? *gguf : json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return 0;
  for (const json* c : {&j, j.contains("text_config") ? &j["text_config"] : nullptr}) {
    if (c && c->is_object() && c->contains("max_position_embeddings") &&
        (*c)["max_position_embeddings"].is_number_integer())
      return (*c)["max_position_embeddings"].get<std::int64_t>();
  }
  return 0;
}

// The prompt text of a chat request as the engine will see it: rendered by the family's template,
// plus the opening of a forced tool call. `plan` receives how to read the output.
std::variant<std::string, ApiError> chat_prompt(const Context& ctx, const GenerationRequest& r,
                                                OutputPlan& plan) {
  std::string text = r.prompt;
  if (r.kind != ApiKind::kCompletion) {
    auto rendered = render_chat(ctx.family, r.chat, ctx.special);
    if (!rendered.ok()) return ApiError::invalid("messages", rendered.status().message());
    text = std::move(*rendered);
  }
  plan = plan_output(ctx.family, r, text);
  return text + plan.prompt_suffix;
}

void handle_generation(Context& ctx, const httplib::Request& req, httplib::Response& res,
                       ApiKind kind) {
  const auto arrived = std::chrono::steady_clock::now();  // time to first token counts from here
  const bool anthropic = kind == ApiKind::kMessages;
  ParsedRequest parsed = kind == ApiKind::kChat ? parse_openai_chat(req.body, ctx.options.limits)
                         : kind == ApiKind::kCompletion
                             ? parse_openai_completion(req.body, ctx.options.limits)
                             : parse_anthropic_messages(req.body, ctx.options.limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, anthropic, *e);
  GenerationRequest& r = std::get<GenerationRequest>(parsed);

  const char* prompt_param = kind == ApiKind::kCompletion ? "prompt" : "messages";
  OutputPlan plan;
  auto prompt = chat_prompt(ctx, r, plan);
  if (const auto* e = std::get_if<ApiError>(&prompt)) return send_error(res, anthropic, *e);
  auto ids = ctx.tokenizer.tokenizer.encode(std::get<std::string>(prompt));
  if (!ids.ok())
    return send_error(res, anthropic, ApiError::invalid(prompt_param, ids.status().message()));
  const auto prompt_tokens = static_cast<std::int64_t>(ids->size());
  if (prompt_tokens == 0)
    return send_error(res, anthropic, ApiError::invalid(prompt_param, "the prompt is empty"));
  if (prompt_tokens >= ctx.max_context)
    return send_error(res, anthropic,
                      ApiError::invalid(prompt_param,
                                        "the prompt has " + std::to_string(prompt_tokens) +
                                            " tokens; this model's context is " +
                                            std::to_string(ctx.max_context) + " tokens",
                                        "context_length_exceeded"));

  auto job = std::make_shared<Job>();
  job->received = arrived;
  job->prompt = std::move(*ids);
  // A completion cannot run past the context: shorten it rather than refuse the request (it then
  // ends as "length" / "max_tokens" at the shortened limit).
  job->max_tokens = std::min(r.max_tokens, ctx.max_context - prompt_tokens);
  job->sampler = r.sampler;
  job->seed = r.seed ? *r.seed : random_seed();
  job->output = std::move(plan.output);
  if (r.thinking_budget && !plan.reasoning_close.empty()) {
    job->reasoning_budget = r.thinking_budget;
    job->reasoning_close = plan.reasoning_close;
  }
  job->api = api_label(kind);
  job->logprobs = r.logprobs;
  job->top_logprobs = r.top_logprobs;
  if (!ctx.engine->submit(job)) {
    ctx.metrics.count_queue_full();
    res.set_header("Retry-After", "1");
    ApiError e;
    e.status = 503;
    e.type = anthropic ? "overloaded_error" : "server_error";
    e.code = "queue_full";
    e.message = "the server is busy (the request queue is full); retry later";
    return send_error(res, anthropic, e);
  }

  ResponseMeta meta;
  meta.id = (kind == ApiKind::kChat         ? "chatcmpl-"
             : kind == ApiKind::kCompletion ? "cmpl-"
                                            : "msg_") +
            random_hex(24);
  meta.created = static_cast<std::int64_t>(std::time(nullptr));
  meta.model = r.model.empty() ? ctx.model_id : r.model;
  meta.prompt_tokens = prompt_tokens;

  // The request's deadline: a generation still running then is cancelled (queued or not).
  const auto deadline = arrived + std::chrono::seconds(ctx.options.request_timeout_s);
  const auto timed_out_error = [anthropic] {
    ApiError err;
    err.status = 504;
    err.type = anthropic ? "api_error" : "server_error";
    err.code = "request_timeout";
    err.message = "the request did not finish within the server's deadline (--request-timeout-s)";
    return err;
  };

  if (!r.stream) {
    std::vector<TokenLogprob> logprobs;
    auto next_check = std::chrono::steady_clock::now();
    for (;;) {
      auto e = job->next(std::chrono::milliseconds(50));
      // Every 50 ms, events or not: nobody reads a closed connection's answer, so its
      // generation stops; past the deadline it stops too.
      if (const auto now = std::chrono::steady_clock::now(); now >= next_check) {
        next_check = now + std::chrono::milliseconds(50);
        if (client_disconnected()) {
          job->cancelled = true;
          // Nobody reads this; 499 (client closed the request) is what the logs and metrics see.
          ApiError gone;
          gone.status = 499;
          gone.type = "client_closed_request";
          gone.message = "the client disconnected";
          res.set_header("Connection", "close");
          return send_error(res, anthropic, gone);
        }
        if (now >= deadline) {
          job->cancelled = true;
          return send_error(res, anthropic, timed_out_error());
        }
      }
      if (!e) continue;
      if (!e->done()) {
        for (auto& lp : e->logprobs) logprobs.push_back(std::move(lp));
        continue;
      }
      if (e->summary.finish_reason == "error") {
        ApiError err;
        err.status = 500;
        err.type = anthropic ? "api_error" : "server_error";
        err.message = "generation failed: " + e->summary.error;
        return send_error(res, anthropic, err);
      }
      res.set_content(dump(complete_response(kind, meta, e->message, e->summary,
                                             r.logprobs ? &logprobs : nullptr)),
                      "application/json");
      return;
    }
  }

  struct StreamState {
    std::shared_ptr<Job> job;
    std::unique_ptr<StreamFormatter> format;
    bool finished = false;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto st = std::make_shared<StreamState>();
  st->job = job;
  st->deadline = deadline;
  st->format = make_stream_formatter(kind, meta, StreamOptions{r.include_usage, r.logprobs});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](std::size_t, httplib::DataSink& sink) {
        const auto write = [&](const std::string& s) {
          if (!s.empty()) st->last_write = std::chrono::steady_clock::now();
          if (s.empty() || sink.write(s.data(), s.size())) return true;
          st->job->cancelled = true;  // the client has gone: stop generating for it
          return false;
        };
        if (st->finished) {
          sink.done();
          return true;
        }
        for (;;) {
          if (std::chrono::steady_clock::now() >= st->deadline) {
            // Past the deadline: the generation stops and the stream ends with an error event.
            st->job->cancelled = true;
            st->finished = true;
            if (!write(st->format->error("the request did not finish within the server's deadline "
                                         "(--request-timeout-s)")))
              return false;
            sink.done();
            return true;
          }
          auto e = st->job->next(std::chrono::milliseconds(100));
          if (!e) {
            if (!sink.is_writable()) {
              st->job->cancelled = true;  // the client has gone: stop generating for it
              return false;
            }
            // A long prefill (or a wait in the queue) sends nothing for a while: a comment every
            // 5 s tells the client and any proxy that the stream is alive.
            if (std::chrono::steady_clock::now() - st->last_write >= std::chrono::seconds(5))
              return write(sse_comment("waiting"));
            continue;
          }
          if (e->kind == JobEvent::Kind::kStarted) return write(st->format->start(e->summary));
          if (!e->done()) {
            const std::string s = st->format->events(e->output, e->logprobs);
            if (s.empty()) continue;  // held back (a possible tag start): wait for more
            return write(s);
          }
          st->finished = true;
          const std::string tail = e->summary.finish_reason == "error"
                                       ? st->format->error("generation failed: " + e->summary.error)
                                       : st->format->finish(e->summary, e->message);
          if (!write(tail)) return false;
          sink.done();
          return true;
        }
      },
      // Runs when the response ends for any reason; after a finished job it changes nothing.
      [job](bool) { job->cancelled = true; });
}

bool authorized(const Context& ctx, const httplib::Request& req) {
  if (ctx.options.api_key.empty()) return true;
  return api_key_matches(req.get_header_value("x-api-key"), req.get_header_value("Authorization"),
                         ctx.options.api_key);
}

// What an overflow thread answers itself: cheap reads that must work under any load.
bool served_under_overload(const httplib::Request& req) {
  return req.method == "GET" &&
         (req.path == "/health" || req.path == "/metrics" || req.path.rfind("/v1/models", 0) == 0);
}

void install_routes(GuardedServer& svr, Context& ctx) {
  svr.set_payload_max_length(ctx.options.max_body_bytes);
  // Advertised in the Keep-Alive header; the front door closes idle connections after it.
  svr.set_keep_alive_timeout(
      std::chrono::duration_cast<std::chrono::seconds>(svr.options().keep_alive_timeout).count());

  svr.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (ctx.options.cors) {
      res.set_header("Access-Control-Allow-Origin", "*");
      if (req.method == "OPTIONS") {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        res.set_header("Access-Control-Allow-Headers",
                       "Authorization, Content-Type, x-api-key, anthropic-version");
        res.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // Every worker is busy: this overflow thread answers at once instead of queueing.
    if (on_overflow_thread() && !served_under_overload(req)) {
      ApiError e;
      e.status = 503;
      e.type = is_anthropic_path(req.path) ? "overloaded_error" : "server_error";
      e.code = "overloaded";
      e.message = "the server is busy (every HTTP worker is serving a request); retry later";
      res.set_header("Retry-After", "1");
      send_error(res, is_anthropic_path(req.path), e);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path.rfind("/v1/", 0) == 0 && !authorized(ctx, req)) {
      ApiError e;
      e.status = 401;
      e.type = is_anthropic_path(req.path) ? "authentication_error" : "invalid_request_error";
      e.code = "invalid_api_key";
      e.message = "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)";
      send_error(res, is_anthropic_path(req.path), e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  svr.Post("/v1/chat/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_generation(ctx, req, res, ApiKind::kChat);
  });
  svr.Post("/v1/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_generation(ctx, req, res, ApiKind::kCompletion);
  });
  svr.Post("/v1/messages", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_generation(ctx, req, res, ApiKind::kMessages);
  });
  svr.Post("/v1/messages/count_tokens",
           [&ctx](const httplib::Request& req, httplib::Response& res) {
             ParsedRequest parsed = parse_anthropic_count_tokens(req.body, ctx.options.limits);
             if (const auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, true, *e);
             // The prompt exactly as /v1/messages would send it (tools, thinking, a forced call).
             OutputPlan plan;
             auto prompt = chat_prompt(ctx, std::get<GenerationRequest>(parsed), plan);
             if (const auto* e = std::get_if<ApiError>(&prompt)) return send_error(res, true, *e);
             auto ids = ctx.tokenizer.tokenizer.encode(std::get<std::string>(prompt));
             if (!ids.ok())
               return send_error(res, true, ApiError::invalid("messages", ids.status().message()));
             res.set_content(dump({{"input_tokens", ids->size()}}), "application/json");
           });
  svr.Post("/v1/responses", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_responses_create(ctx.responses_deps, req, res);
  });
  svr.Post("/v1/responses/input_tokens",
           [&ctx](const httplib::Request& req, httplib::Response& res) {
             handle_responses_input_tokens(ctx.responses_deps, req, res);
           });
  svr.Get(R"(/v1/responses/([^/]+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_responses_get(ctx.responses_deps, req.matches[1], res);
  });
  svr.Get(R"(/v1/responses/([^/]+)/input_items)",
          [&ctx](const httplib::Request& req, httplib::Response& res) {
            handle_responses_input_items(ctx.responses_deps, req.matches[1], req, res);
          });
  svr.Delete(R"(/v1/responses/([^/]+))",
             [&ctx](const httplib::Request& req, httplib::Response& res) {
               handle_responses_delete(ctx.responses_deps, req.matches[1], res);
             });
  svr.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(model_list(ctx.model_id, ctx.created)), "application/json");
  });
  svr.Get(R"(/v1/models/(.+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != ctx.model_id) {
      ApiError e;
      e.status = 404;
      e.param = "model";
      e.code = "model_not_found";
      e.message =
          "the model '" + id + "' does not exist; this server serves '" + ctx.model_id + "'";
      return send_error(res, false, e);
    }
    res.set_content(dump(model_object(ctx.model_id, ctx.created)), "application/json");
  });
  svr.Get("/health", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"status", "ok"},
                          {"model", ctx.model_id},
                          {"queue_depth", ctx.engine->queue_depth()}}),
                    "application/json");
  });
  svr.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    ExternalStats ext = ctx.engine->stats();
    if (ctx.door) {
      const FrontDoorStats d = ctx.door->stats();
      ext.http_open_connections = d.open_connections;
      ext.http_refused = d.refused;
      ext.http_overflow = d.overflow;
      ext.http_timed_out = d.timed_out;
    }
    res.set_content(ctx.metrics.render(ext), "text/plain; version=0.0.4");
  });

  // 404s, 413s (body over the limit) and the like get a body of the API's shape.
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        // httplib's own refusals (unparsable request, body over the limit) may leave unread bytes
        // on the connection: it must not be reused.
        if (res.status == 400 || res.status == 413 || res.status == 414 || res.status >= 500)
          res.set_header("Connection", "close");
        ApiError e;
        e.status = res.status;
        e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
        if (res.status == 404) {
          e.code = "not_found";
          e.message = "no route for " + req.method + " " + req.path;
        } else if (res.status == 413) {
          e.code = "request_too_large";
          e.message = "the request body is larger than the server's limit";
        } else {
          e.message = "the request was refused (HTTP " + std::to_string(res.status) + ")";
        }
        send_error(res, is_anthropic_path(req.path), e);
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        ApiError e;
        e.status = 500;
        e.type = "server_error";
        e.message = "internal error: " + what;
        send_error(res, is_anthropic_path(req.path), e);
      });
  svr.set_guarded_logger([&ctx](const httplib::Request& req, const httplib::Response& res) {
    ctx.metrics.count_request(endpoint_label(req.path), res.status);
  });
}

}  // namespace

Status run_server(const ServerOptions& options) {
  if (options.mtp_depth < -1 || options.mtp_depth > kMaxMtpDepth)
    return invalid_argument("--mtp-depth must be between 0 and " + std::to_string(kMaxMtpDepth));
  // Threads started before us (OpenBLAS's pool) may receive the signal, so a handler that only
  // sets a flag, polled by the waiter thread below, is the one way to catch it on any thread.
  g_stop_signal = 0;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  // A client that disconnects mid-stream must fail a write, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);

  auto tokenizer = load_tokenizer_dir(options.model_dir);
  if (!tokenizer.ok()) return tokenizer.status();
  auto ctx = std::make_unique<Context>(std::move(*tokenizer));
  ctx->options = options;
  const auto gguf = gguf_hf_config(options.model_dir);
  auto family = detect_chat_family(options.model_dir, ctx->tokenizer.metadata.chat_template,
                                   gguf ? gguf->value("model_type", "") : "");
  if (!family.ok()) return family.status();
  ctx->family = *family;
  ctx->special.bos = ctx->tokenizer.metadata.bos_token.value_or("");
  ctx->model_id = std::filesystem::path(options.model_dir).lexically_normal().filename().string();
  if (ctx->model_id.empty())
    ctx->model_id =
        std::filesystem::path(options.model_dir).lexically_normal().parent_path().filename();
  ctx->created = static_cast<std::int64_t>(std::time(nullptr));
  ctx->max_context =
      options.max_context > 0 ? options.max_context : model_context(options.model_dir);
  if (ctx->max_context <= 0) ctx->max_context = 4096;

  std::string sampling_line = "greedy unless a request sets temperature (--generation-config none)";
  if (options.generation_config) {
    auto defaults = read_sampling_defaults(options.model_dir);
    if (!defaults.ok()) return defaults.status();
    ctx->options.limits.sampling_defaults = defaults->over(options.limits.sampling_defaults);
    sampling_line =
        defaults->empty()
            ? "greedy unless a request sets temperature (no sampling "
              "fields in generation_config.json)"
            : defaults->describe() + " from generation_config.json unless a request sets them";
  }

  auto model = load_model(options.model_dir, options.load);
  if (!model.ok()) return model.status();
  const std::string compute = (*model)->info().backend + ", " +
                              std::string(dtype_name((*model)->info().dtype)) + " weights";
  // The same default as `flashserve run`: speculative decoding whenever the checkpoint can draft.
  const int mtp_depth = options.mtp_depth >= 0     ? options.mtp_depth
                        : (*model)->info().has_mtp ? kDefaultMtpDepth
                                                   : 0;
  EngineOptions eo;
  eo.mtp_depth = mtp_depth;
  eo.max_queue = options.max_queue;
  eo.ram_bank_bytes = options.session_ram_mb << 20;
  eo.session_dir = options.session_dir;
  eo.session_disk_bytes = options.session_disk_mb << 20;
  eo.model_dir = options.model_dir;
  eo.prompt_log = options.prompt_log;
  auto engine = Engine::create(eo, std::move(*model), ctx->tokenizer, ctx->metrics);
  if (!engine.ok()) return engine.status();
  ctx->engine = std::move(*engine);
  ctx->responses = std::make_unique<ResponseStore>(options.responses_store_mb << 20);
  ResponsesDeps& rd = ctx->responses_deps;
  rd.tokenizer = &ctx->tokenizer.tokenizer;
  rd.family = ctx->family;
  rd.special = ctx->special;
  rd.model_id = ctx->model_id;
  rd.max_context = ctx->max_context;
  rd.limits = ctx->options.limits;
  rd.request_timeout_s = options.request_timeout_s;
  rd.engine = ctx->engine.get();
  rd.metrics = &ctx->metrics;
  rd.store = ctx->responses.get();

  FrontDoorOptions fo;
  fo.workers = std::max(options.http_threads, 1);
  fo.overflow_workers = 2;
  fo.max_connections = options.max_connections;
  fo.max_body_bytes = options.max_body_bytes;
  fo.request_read_timeout = std::chrono::milliseconds(options.read_timeout_ms);
  GuardedServer svr(fo);
  ctx->door = &svr;
  install_routes(svr, *ctx);

  int port = options.port;
  if (port == 0) {
    port = svr.bind_to_any_port(options.host);
    if (port < 0) return io_error("cannot bind " + options.host + " to any port");
  } else if (!svr.bind_to_port(options.host, port)) {
    return io_error("cannot bind " + options.host + ":" + std::to_string(port) +
                    " (in use, or not an address of this machine)");
  }
  svr.set_listen_backlog(1024);
  std::cerr << "flashserve: serving " << ctx->model_id << " on " << compute << " (context "
            << ctx->max_context << ", mtp depth " << mtp_depth << ")\n"
            << "flashserve: sampling: " << sampling_line << "\n"
            << "flashserve: listening on http://" << options.host << ":" << port << std::endl;

  std::atomic<bool> done{false};
  std::atomic<bool> signalled{false};
  std::thread waiter([&] {
    while (!done) {
      if (g_stop_signal != 0) {
        signalled = true;
        svr.stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const bool listened = svr.listen_after_bind();
  done = true;
  waiter.join();
  ctx->door = nullptr;
  ctx->engine.reset();  // finishes queued work and persists the bank before the rest goes
  std::cerr << "flashserve: stopped" << std::endl;
  return listened || signalled ? Status() : io_error("the server stopped listening unexpectedly");
}

}  // namespace fs::server
