#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace fs::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

std::string escape_label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  ++counts_[static_cast<std::size_t>(it - bounds_.begin())];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + num(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      request_({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {
  // Tiers appear from the first scrape, so a dashboard sees zeros rather than missing series.
  for (const char* api : {"chat", "completions", "messages", "responses"})
    for (const char* t : {"ram", "disk", "cold"}) sessions_[{api, t}] = 0;
}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_tokens(std::int64_t prompt, std::int64_t generated) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::observe_ttft(double seconds) {
  std::lock_guard lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::observe_inter_token(double seconds) {
  std::lock_guard lock(mu_);
  itl_.observe(seconds);
}

void Metrics::observe_request(double seconds) {
  std::lock_guard lock(mu_);
  request_.observe(seconds);
}

void Metrics::add_mtp(int depth, std::int64_t drafted, std::int64_t accepted) {
  if (depth < 1 || depth > kMaxDepth) return;
  std::lock_guard lock(mu_);
  drafted_[static_cast<std::size_t>(depth - 1)] += drafted;
  accepted_[static_cast<std::size_t>(depth - 1)] += accepted;
}

void Metrics::count_session(const std::string& api, const std::string& tier) {
  std::lock_guard lock(mu_);
  ++sessions_[{api, tier}];
}

void Metrics::count_commit(bool published) {
  std::lock_guard lock(mu_);
  ++(published ? commits_published_ : commits_dropped_);
}

void Metrics::count_finish(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++finishes_[reason];
}

void Metrics::count_queue_full() {
  std::lock_guard lock(mu_);
  ++queue_full_;
}

std::string Metrics::render(const ExternalStats& ext) const {
  std::lock_guard lock(mu_);
  std::string out;
  header(out, "flashserve_requests_total", "counter", "HTTP requests by endpoint and status.");
  for (const auto& [key, n] : requests_)
    out += "flashserve_requests_total{endpoint=\"" + escape_label(key.first) + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  header(out, "flashserve_prompt_tokens_total", "counter", "Prompt tokens of generation requests.");
  out += "flashserve_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  header(out, "flashserve_generated_tokens_total", "counter", "Tokens generated.");
  out += "flashserve_generated_tokens_total " + std::to_string(generated_tokens_) + "\n";
  header(out, "flashserve_time_to_first_token_seconds", "histogram",
         "From a request's arrival to its first generated token.");
  ttft_.render(out, "flashserve_time_to_first_token_seconds");
  header(out, "flashserve_inter_token_latency_seconds", "histogram",
         "Between consecutive generated tokens of a request.");
  itl_.render(out, "flashserve_inter_token_latency_seconds");
  header(out, "flashserve_request_duration_seconds", "histogram",
         "From a generation request's arrival to its last token.");
  request_.render(out, "flashserve_request_duration_seconds");
  header(out, "flashserve_mtp_drafted_total", "counter", "MTP drafts proposed, by depth.");
  for (int d = 0; d < kMaxDepth; ++d)
    out += "flashserve_mtp_drafted_total{depth=\"" + std::to_string(d + 1) + "\"} " +
           std::to_string(drafted_[static_cast<std::size_t>(d)]) + "\n";
  header(out, "flashserve_mtp_accepted_total", "counter", "MTP drafts accepted, by depth.");
  for (int d = 0; d < kMaxDepth; ++d)
    out += "flashserve_mtp_accepted_total{depth=\"" + std::to_string(d + 1) + "\"} " +
           std::to_string(accepted_[static_cast<std::size_t>(d)]) + "\n";
  header(out, "flashserve_session_lookups_total", "counter",
         "Where each turn's starting state came from, by API: ram, disk (a warm hit) or cold.");
  for (const auto& [key, n] : sessions_)
    out += "flashserve_session_lookups_total{api=\"" + escape_label(key.first) + "\",tier=\"" +
           escape_label(key.second) + "\"} " + std::to_string(n) + "\n";
  header(out, "flashserve_session_commits_total", "counter",
         "Turn states published to the bank (complete) or dropped (incomplete).");
  out += "flashserve_session_commits_total{result=\"published\"} " +
         std::to_string(commits_published_) + "\n";
  out += "flashserve_session_commits_total{result=\"dropped\"} " +
         std::to_string(commits_dropped_) + "\n";
  header(out, "flashserve_checkpoint_rejections_total", "counter",
         "Disk checkpoints refused on load, by reason.");
  for (const auto& [reason, n] : ext.checkpoint_rejections)
    out += "flashserve_checkpoint_rejections_total{reason=\"" + escape_label(reason) + "\"} " +
           std::to_string(n) + "\n";
  header(out, "flashserve_finish_total", "counter", "Generations by finish reason.");
  for (const auto& [reason, n] : finishes_)
    out += "flashserve_finish_total{reason=\"" + escape_label(reason) + "\"} " + std::to_string(n) +
           "\n";
  header(out, "flashserve_session_bank_entries", "gauge", "States in the RAM session bank.");
  out += "flashserve_session_bank_entries " + std::to_string(ext.ram_entries) + "\n";
  header(out, "flashserve_session_bank_bytes", "gauge", "Bytes of the RAM session bank.");
  out += "flashserve_session_bank_bytes " + std::to_string(ext.ram_bytes) + "\n";
  header(out, "flashserve_session_disk_entries", "gauge", "Checkpoints in the disk tier.");
  out += "flashserve_session_disk_entries " + std::to_string(ext.disk_entries) + "\n";
  header(out, "flashserve_session_disk_bytes", "gauge", "Bytes of the disk tier.");
  out += "flashserve_session_disk_bytes " + std::to_string(ext.disk_bytes) + "\n";
  header(out, "flashserve_queue_full_total", "counter",
         "Generation requests answered 503 because the engine queue was full.");
  out += "flashserve_queue_full_total " + std::to_string(queue_full_) + "\n";
  header(out, "flashserve_queue_depth", "gauge", "Requests waiting for the engine worker.");
  out += "flashserve_queue_depth " + std::to_string(ext.queue_depth) + "\n";
  header(out, "flashserve_http_open_connections", "gauge", "Open HTTP connections.");
  out += "flashserve_http_open_connections " + std::to_string(ext.http_open_connections) + "\n";
  header(out, "flashserve_http_refused_total", "counter",
         "Connections answered 503 by the front door (no worker and no overflow slot free).");
  out += "flashserve_http_refused_total " + std::to_string(ext.http_refused) + "\n";
  header(out, "flashserve_http_overflow_total", "counter",
         "Requests served by the overflow threads while every worker was busy (503 or cheap).");
  out += "flashserve_http_overflow_total " + std::to_string(ext.http_overflow) + "\n";
  header(out, "flashserve_http_timed_out_total", "counter",
         "Requests dropped because they did not arrive within the read timeout.");
  out += "flashserve_http_timed_out_total " + std::to_string(ext.http_timed_out) + "\n";
  return out;
}

}  // namespace fs::server
