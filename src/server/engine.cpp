#include "server/engine.h"

#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "decode/stop_tokens.h"
#include "session/checkpoint.h"
#include "session/live_session.h"
#include "tokenizer/stream_decoder.h"

namespace fs::server {

void Job::push(JobEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

std::optional<JobEvent> Job::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  JobEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

Engine::Engine(Key, EngineOptions options, std::unique_ptr<Model> model,
               const TokenizerBundle& tokenizer, Metrics& metrics)
    : options_(std::move(options)),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      bank_(SessionBankOptions{options_.ram_bank_bytes, 64}) {
  stop_ids_ = turn_stop_tokens(tokenizer, model_->info());
  if (!options_.prompt_log.empty()) prompt_log_.open(options_.prompt_log, std::ios::app);
}

Expected<std::unique_ptr<Engine>> Engine::create(EngineOptions options,
                                                 std::unique_ptr<Model> model,
                                                 const TokenizerBundle& tokenizer,
                                                 Metrics& metrics) {
  if (options.mtp_depth > 0 && !model->info().has_mtp)
    return invalid_argument("--mtp-depth " + std::to_string(options.mtp_depth) +
                            ": the model has no MTP head");
  std::unique_ptr<DiskStore> disk;
  if (!options.session_dir.empty()) {
    auto fingerprint = state_fingerprint(options.model_dir, model->info());
    if (!fingerprint.ok()) return fingerprint.status();
    DiskStoreOptions d;
    d.dir = options.session_dir;
    d.byte_budget = options.session_disk_bytes;
    d.identity.family = model->info().family;
    d.identity.model_fingerprint = *fingerprint;
    auto opened = DiskStore::open(std::move(d));
    if (!opened.ok()) return opened.status();
    disk = std::move(*opened);
  }
  auto e =
      std::make_unique<Engine>(Key{}, std::move(options), std::move(model), tokenizer, metrics);
  e->disk_ = std::move(disk);
  persist_evictions_to_disk({&e->bank_, e->disk_.get()});
  e->worker_ = std::thread([raw = e.get()] { raw->worker_loop(); });
  return e;
}

Engine::~Engine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  persist_all_to_disk({&bank_, disk_.get()});
}

bool Engine::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queue_.size() >= options_.max_queue) return false;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

std::size_t Engine::queue_depth() {
  std::lock_guard lock(mu_);
  return queue_.size();
}

ExternalStats Engine::stats() {
  ExternalStats s;
  s.queue_depth = static_cast<std::int64_t>(queue_depth());
  s.ram_entries = static_cast<std::int64_t>(bank_.entries());
  s.ram_bytes = static_cast<std::int64_t>(bank_.bytes());
  if (disk_) {
    const auto d = disk_->stats();
    s.checkpoint_rejections = d.rejections;
    s.disk_entries = static_cast<std::int64_t>(disk_->entries());
    s.disk_bytes = static_cast<std::int64_t>(disk_->bytes());
  }
  return s;
}

void Engine::worker_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (!queue_.empty()) {
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!job) return;  // stopping with nothing queued
      if (stopping_) job->cancelled = true;
    }
    try {
      run(*job);
    } catch (const std::exception& e) {
      // A bug or an allocation failure must answer the client, not end the process.
      JobSummary s;
      s.finish_reason = "error";
      s.error = std::string("internal error: ") + e.what();
      metrics_.count_finish(s.finish_reason);
      JobEvent done;
      done.kind = JobEvent::Kind::kDone;
      done.summary = s;
      job->push(std::move(done));
    }
  }
}

void Engine::run(Job& job) {
  using Clock = std::chrono::steady_clock;
  JobSummary summary;
  summary.prompt_tokens = static_cast<std::int64_t>(job.prompt.size());
  if (prompt_log_.is_open()) {
    // Only the worker thread writes, so no lock; flushed so a killed server keeps its lines.
    auto text = tokenizer_.tokenizer.decode(job.prompt);
    nlohmann::json line = {{"prompt_tokens", summary.prompt_tokens},
                           {"prompt", text.ok() ? *text : std::string()}};
    prompt_log_ << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n'
                << std::flush;
  }
  AssistantOutput output(job.output);
  const auto finish = [&](std::string reason) {
    summary.finish_reason = std::move(reason);
    metrics_.count_finish(summary.finish_reason);
    metrics_.add_tokens(summary.prompt_tokens, summary.completion_tokens);
    metrics_.observe_request(std::chrono::duration<double>(Clock::now() - job.received).count());
    JobEvent done;
    done.kind = JobEvent::Kind::kDone;
    done.summary = summary;
    done.message = output.message();
    job.push(std::move(done));
  };
  if (job.cancelled) return finish("cancelled");

  const SessionTiers tiers{&bank_, disk_.get()};
  auto prepared = prepare_session(*model_, tiers, job.prompt);
  if (!prepared.ok()) {
    summary.error = prepared.status().to_string();
    return finish("error");
  }
  summary.session_tier = prepared->tier;
  summary.reused_tokens = prepared->reused_tokens;
  metrics_.count_session(job.api, prepared->tier);
  {
    JobEvent started;
    started.kind = JobEvent::Kind::kStarted;
    started.summary = summary;
    job.push(std::move(started));
  }
  // Bank the prompt's state now: a stateless client's next turn re-renders this turn's reply
  // differently from the tokens generated, so this is the state its prompt surely extends.
  if (prepared->tier != "ram" || prepared->reused_tokens < job.prompt.size())
    (void)bank_.put(prepared->state);

  StreamDecoder decoder(tokenizer_.tokenizer, /*skip_special=*/true);
  std::vector<TokenLogprob> logprobs;  // of tokens not yet reported
  const auto token_text = [&](TokenId id) {
    const auto bytes = tokenizer_.tokenizer.token_bytes(id);
    return bytes ? std::string(*bytes) : std::string();
  };
  auto last_token = job.received;
  bool first = true;
  GenerateOptions g;
  g.max_tokens = job.max_tokens;
  g.mtp_depth = options_.mtp_depth;
  g.sampler = job.sampler;
  g.seed = job.seed;
  g.stop_tokens = stop_ids_;
  // Long generations reach the disk tier at aligned frontiers, not only at the end of the turn.
  g.on_commit = persist_at_frontiers(tiers, PrepareOptions{}.restore_point_interval,
                                     static_cast<std::int64_t>(prepared->state.tokens.size()));
  g.cancelled = [&] { return job.cancelled.load(); };
  // A reasoning budget: once that many tokens of reasoning are generated, generation stops there
  // (like a stop sequence), the think block is closed with the family's closing text, and the
  // turn continues after it with what is left of max_tokens.
  std::int64_t reasoning_tokens = 0;
  bool budget_closed = false;
  const auto over_budget = [&] {
    return job.reasoning_budget && !budget_closed && output.in_reasoning() &&
           reasoning_tokens >= *job.reasoning_budget;
  };
  // A stop sequence ends the turn at the token that completed it: that token is committed and the
  // state (key = prompt + every counted token) is banked like any finished turn.
  g.stop_requested = [&] { return output.stopped() || over_budget(); };
  if (job.logprobs) {
    g.top_logprobs = job.top_logprobs;
    g.on_logprobs = [&](const TokenLogprobs& lp) {
      if (output.stopped()) return;
      TokenLogprob t;
      t.token = token_text(lp.token);
      t.logprob = lp.logprob;
      for (const auto& [id, v] : lp.top) t.top.emplace_back(token_text(id), v);
      logprobs.push_back(std::move(t));
    };
  }
  g.on_token = [&](TokenId id) {
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last_token).count();
    first ? metrics_.observe_ttft(dt) : metrics_.observe_inter_token(dt);
    first = false;
    last_token = now;
    if (output.stopped()) return;  // drafts accepted past a stop sequence are not shown
    ++summary.completion_tokens;
    JobEvent e;
    if (auto piece = decoder.push(id); piece.ok()) e.output = output.feed(*piece);
    if (output.in_reasoning()) ++reasoning_tokens;
    e.logprobs = std::move(logprobs);
    logprobs.clear();
    if (!e.output.empty() || !e.logprobs.empty()) job.push(std::move(e));
  };
  const auto count_mtp = [&](const GenerateResult& res) {
    for (int d = 0; d < std::min(options_.mtp_depth, kMaxMtpDepth); ++d)
      metrics_.add_mtp(d + 1, res.stats.drafted[static_cast<std::size_t>(d)],
                       res.stats.accepted[static_cast<std::size_t>(d)]);
  };
  GenerateResult r = generate(*model_, prepared->state, g);
  count_mtp(r);
  if (over_budget() && r.finish_reason == FinishReason::kStop && r.state_complete) {
    budget_closed = true;
    auto close = tokenizer_.tokenizer.encode(job.reasoning_close);
    const std::int64_t left = job.max_tokens - static_cast<std::int64_t>(r.tokens.size()) -
                              static_cast<std::int64_t>(close.ok() ? close->size() : 0);
    if (close.ok() && !close->empty() && left > 0) {
      JobEvent e;
      e.output = output.feed(decoder.finish() + job.reasoning_close);
      if (!e.output.empty()) job.push(std::move(e));
      if (const Status st = extend(*model_, prepared->state, *close); !st.ok()) {
        summary.error = st.to_string();
        return finish("error");
      }
      g.max_tokens = left;
      r = generate(*model_, prepared->state, g);
      count_mtp(r);
    } else {
      // No room to close it and answer: the turn ends at max_tokens.
      r.finish_reason = FinishReason::kLength;
    }
  }
  metrics_.count_commit(commit_session(tiers, prepared->state, r.state_complete));
  if (r.state_complete && prepared->state.tokens.size() >= job.prompt.size())
    summary.generated.assign(
        prepared->state.tokens.begin() + static_cast<std::ptrdiff_t>(job.prompt.size()),
        prepared->state.tokens.end());

  if (!output.stopped()) {
    JobEvent e;
    e.output = output.feed(decoder.finish());
    for (auto& ev : output.finish()) e.output.push_back(std::move(ev));
    if (!e.output.empty()) job.push(std::move(e));
  }
  if (output.stopped()) {
    summary.stop_sequence = output.stop_sequence();
    return finish("stop");
  }
  if (!r.error.ok()) {
    summary.error = r.error.to_string();
    return finish("error");
  }
  switch (r.finish_reason) {
    case FinishReason::kStop:
      return finish("stop");
    case FinishReason::kLength:
      return finish("length");
    case FinishReason::kCancelled:
      return finish("cancelled");
    case FinishReason::kError:
      return finish("error");
  }
  finish("error");
}

}  // namespace fs::server
