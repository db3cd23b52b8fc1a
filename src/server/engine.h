// The engine worker: one thread that owns the model, the RAM session bank and the disk store,
// and runs queued generation jobs one at a time. HTTP threads submit jobs and read their events
// (text deltas, then one final summary) from the job's channel; nothing here knows about HTTP.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "decode/generator.h"
#include "model/model.h"
#include "server/assistant_output.h"
#include "server/metrics.h"
#include "session/disk_store.h"
#include "session/session_bank.h"
#include "tokenizer/metadata.h"

namespace fs::server {

struct EngineOptions {
  int mtp_depth = 0;
  std::size_t max_queue = 64;  // waiting jobs; a submit beyond it is refused
  std::size_t ram_bank_bytes = std::size_t{1} << 30;
  std::string session_dir;  // empty: no disk tier
  std::uint64_t session_disk_bytes = std::uint64_t{4} << 30;
  std::string model_dir;  // for the checkpoint fingerprint
  // When set, every job's prompt (as the engine sees it, decoded from its token ids) is appended
  // to this file as one JSON line: {"prompt_tokens": N, "prompt": TEXT}. A debugging aid for
  // seeing exactly what a client's request became (`serve --log-prompts`).
  std::string prompt_log;
};

struct JobSummary {
  std::string finish_reason;  // "stop", "length", "cancelled" or "error"
  std::string stop_sequence;  // the stop sequence that ended it, if any
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::string session_tier;  // ram, disk or cold
  std::size_t reused_tokens = 0;
  std::string error;  // when finish_reason is "error"
  // The tokens after the prompt that the committed state covers (the generated ones, a final
  // stop token included); empty when no complete state was committed. A stateful API
  // (previous_response_id) continues a conversation from exactly these.
  std::vector<TokenId> generated;
};

// One generated token's log-probability and its most likely alternatives (decode/generator.h
// says which distribution), as token text: the token's bytes, which may be part of a character.
struct TokenLogprob {
  std::string token;
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;
};

struct JobEvent {
  enum class Kind {
    kStarted,  // the prompt is prefilled: summary has prompt_tokens, session_tier, reused_tokens
    kOutput,   // output events and/or the logprobs of the tokens generated since the last event
    kDone,     // summary and message are final
  };
  Kind kind = Kind::kOutput;
  std::vector<OutputEvent> output;
  // The tokens behind this event's output (a token whose text is held back, e.g. a possible tag
  // start, reports its logprob with the event where it was generated).
  std::vector<TokenLogprob> logprobs;
  JobSummary summary;
  ParsedOutput message;  // kDone: the whole output (content, reasoning, tool calls)

  bool done() const { return kind == Kind::kDone; }
};

// A queued generation and its channel back to the submitter.
class Job {
 public:
  std::vector<TokenId> prompt;
  std::int64_t max_tokens = 16;
  SamplerConfig sampler;
  std::uint64_t seed = 0;
  // How the text is parsed into reasoning, text and tool calls, and the stop sequences.
  AssistantOutputOptions output;
  std::string api = "chat";  // the label of the API in /metrics (session lookups)
  bool logprobs = false;
  int top_logprobs = 0;
  // Anthropic thinking.budget_tokens: after this many reasoning tokens the think block is closed
  // with `reasoning_close` (the family's closing text) and the turn goes on. Empty close: no
  // budget.
  std::optional<std::int64_t> reasoning_budget;
  std::string reasoning_close;
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();

  // Set by the submitter when its client has gone; polled by the worker every round.
  std::atomic<bool> cancelled{false};

  void push(JobEvent e);
  // The next event, waiting up to `timeout`; nullopt on timeout.
  std::optional<JobEvent> next(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
};

class Engine {
  // Only create() can make the key, so create() is the one way in (make_unique needs a public
  // constructor).
  struct Key {
    explicit Key() = default;
  };

 public:
  // Takes the model; opens the disk tier when options.session_dir is set.
  static Expected<std::unique_ptr<Engine>> create(EngineOptions options,
                                                  std::unique_ptr<Model> model,
                                                  const TokenizerBundle& tokenizer,
                                                  Metrics& metrics);
  Engine(Key, EngineOptions options, std::unique_ptr<Model> model, const TokenizerBundle& tokenizer,
         Metrics& metrics);
  ~Engine();  // stops the worker; queued jobs finish as cancelled; banks persist to disk
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a job; false when the queue is full (the caller answers 503).
  bool submit(std::shared_ptr<Job> job);
  std::size_t queue_depth();
  ExternalStats stats();
  const ModelInfo& model_info() const { return model_->info(); }

 private:
  void worker_loop();
  void run(Job& job);

  EngineOptions options_;
  std::unique_ptr<Model> model_;
  const TokenizerBundle& tokenizer_;
  Metrics& metrics_;
  std::vector<TokenId> stop_ids_;
  SessionBank bank_;
  std::unique_ptr<DiskStore> disk_;
  std::ofstream prompt_log_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace fs::server
