// The connection front door of `flashserve serve`: what stands between accepted sockets and
// cpp-httplib's request processing, so that slow clients, floods and disconnects are bounded.
//
//  - A gatherer thread receives every request whole (headers and body) on non-blocking sockets,
//    for all connections at once, before any worker sees it: a slow client (slowloris) holds a
//    buffer and a deadline, never a thread. A request that has not arrived within
//    `request_read_timeout` is dropped; an idle keep-alive connection after `keep_alive_timeout`.
//  - A complete request goes to one of `workers` threads when one is free. Otherwise it goes to
//    the overflow threads, which answer the cheap endpoints (/health, /metrics, /v1/models) and
//    503 + Retry-After to everything else at once. Nothing waits in an unbounded queue: with
//    every worker and overflow slot taken, or `max_connections` open, or `max_buffered_bytes`
//    held, a connection is answered 503 + Retry-After by the gatherer itself and closed.
//  - Between requests a keep-alive connection goes back to the gatherer: a worker holds a
//    connection only while it serves one request.
//  - The request running on a worker can ask whether its client has gone
//    (client_disconnected()), so a non-streaming request stops its generation when it has.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fs::server {

struct FrontDoorOptions {
  int workers = 16;                   // requests served at once
  int overflow_workers = 2;           // answer 503 / cheap endpoints while every worker is busy
  std::size_t overflow_backlog = 64;  // complete requests waiting for an overflow thread
  std::size_t max_connections = 512;  // open connections, all states together
  std::size_t max_buffered_bytes = std::size_t{256} << 20;  // requests being received, together
  std::size_t max_header_bytes = 64 << 10;
  std::size_t max_body_bytes = std::size_t{8} << 20;      // larger bodies are left to httplib's 413
  std::chrono::milliseconds request_read_timeout{10000};  // first byte to last byte of a request
  std::chrono::milliseconds keep_alive_timeout{5000};     // idle between two requests
  std::chrono::milliseconds write_timeout{30000};         // one blocked write
  std::size_t max_requests_per_connection = 1000;
};

struct FrontDoorStats {
  std::int64_t open_connections = 0;
  std::int64_t refused = 0;    // answered 503 by the gatherer (no worker, no overflow slot)
  std::int64_t overflow = 0;   // requests served by the overflow threads
  std::int64_t timed_out = 0;  // requests that did not arrive within request_read_timeout
};

// True on an overflow thread: the request it is serving arrived while every worker was busy.
bool on_overflow_thread();
// True when the client of the request this worker thread is serving has closed its connection
// (or reset it). Cheap: one poll of the socket, no wait.
bool client_disconnected();

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(FrontDoorOptions options);
  ~GuardedServer() override;
  GuardedServer(const GuardedServer&) = delete;
  GuardedServer& operator=(const GuardedServer&) = delete;

  // Call after binding: httplib listens with a backlog of 5, so a burst of connections would wait
  // in SYN retransmits (seconds) instead of reaching the front door and its 503.
  bool set_listen_backlog(int backlog);

  FrontDoorStats stats() const;
  // httplib's logger, wrapped: the front door also learns whether the response closed the
  // connection.
  void set_guarded_logger(httplib::Logger logger);
  const FrontDoorOptions& options() const { return options_; }

  struct Conn {
    int fd = -1;
    std::string buf;  // received, not yet consumed
    std::chrono::steady_clock::time_point deadline;
    bool idle = true;  // no byte of the next request yet
    std::size_t served = 0;
  };

 private:
  class Door;
  using Clock = std::chrono::steady_clock;

  // Called by httplib's accept loop (through Door::enqueue) for every accepted socket.
  bool process_and_close_socket(socket_t sock) override;

  void start();
  void stop_all();
  void gatherer_loop();
  void worker_loop(bool overflow);
  void serve(Conn conn, bool overflow);
  void hand_back(Conn conn);
  // Takes a complete request off the gatherer: to a worker, an overflow thread, or a 503.
  void dispatch(Conn conn);
  void refuse(Conn& conn);
  void close_conn(Conn& conn);
  // 1: a request is complete (or must be handed on as it is: the worker reads the rest); 0: wait
  // for more. `size` gets the request's length when it is whole in the buffer, else 0.
  int request_ready(const Conn& conn, std::size_t* size = nullptr) const;

  FrontDoorOptions options_;
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable overflow_cv_;
  std::deque<Conn> inbox_;     // to the gatherer
  std::deque<Conn> work_;      // to the workers
  std::deque<Conn> overflow_;  // to the overflow threads
  int assigned_ = 0;           // connections queued for or held by workers
  bool stopping_ = false;
  bool started_ = false;

  std::atomic<std::int64_t> open_{0};
  std::atomic<std::int64_t> refused_{0};
  std::atomic<std::int64_t> overflow_served_{0};
  std::atomic<std::int64_t> timed_out_{0};

  std::vector<std::thread> threads_;
};

}  // namespace fs::server
