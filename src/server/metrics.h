// Server metrics in Prometheus text exposition format (version 0.0.4). Counters and histograms
// are updated by the HTTP threads and the engine worker, so every update takes one mutex; the
// rate of updates (a few per token) makes that cheap.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fs::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // The _bucket (cumulative, with +Inf), _sum and _count lines of `name`.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

// Values the metrics read from their owners at scrape time (the session tiers keep their own
// counts).
struct ExternalStats {
  std::map<std::string, std::int64_t> checkpoint_rejections;  // by reason
  std::int64_t ram_entries = 0, ram_bytes = 0, disk_entries = 0, disk_bytes = 0;
  std::int64_t queue_depth = 0;
  // The connection front door (front_door.h).
  std::int64_t http_open_connections = 0, http_refused = 0, http_overflow = 0, http_timed_out = 0;
};

class Metrics {
 public:
  static constexpr int kMaxDepth = 3;
  Metrics();

  void count_request(const std::string& endpoint, int status);
  void add_tokens(std::int64_t prompt, std::int64_t generated);
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_request(double seconds);
  void add_mtp(int depth, std::int64_t drafted, std::int64_t accepted);  // depth 1-based
  // A turn's session lookup, by API (chat, completions, messages, responses) and tier (ram, disk
  // or cold).
  void count_session(const std::string& api, const std::string& tier);
  void count_commit(bool published);
  void count_finish(const std::string& reason);
  // A generation request answered 503 because the engine queue was full; counted before the
  // answer goes out, so a client holding its 503 already sees it in /metrics.
  void count_queue_full();

  std::string render(const ExternalStats& external) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, std::int64_t> requests_;
  std::int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, itl_, request_;
  std::array<std::int64_t, kMaxDepth> drafted_{}, accepted_{};
  std::map<std::pair<std::string, std::string>, std::int64_t> sessions_;  // (api, tier)
  std::int64_t commits_published_ = 0, commits_dropped_ = 0;
  std::map<std::string, std::int64_t> finishes_;
  std::int64_t queue_full_ = 0;
};

// Escapes a label value (backslash, quote, newline) as the exposition format requires.
std::string escape_label(const std::string& v);

}  // namespace fs::server
