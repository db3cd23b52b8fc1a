#include "server/front_door.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace fs::server {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_fd = -1;
thread_local bool t_overflow = false;
thread_local bool t_close = false;  // the response just written said Connection: close

int millis_until(Clock::time_point t, std::chrono::milliseconds cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now());
  return static_cast<int>(std::clamp(left, std::chrono::milliseconds(0), cap).count());
}

// The answer when there is no room: sent by the gatherer without a worker, best effort.
const std::string& overloaded_response() {
  static const std::string text = [] {
    const std::string body =
        R"({"error":{"message":"the server is overloaded; retry later","type":"overloaded_error",)"
        R"("param":null,"code":"overloaded"}})";
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: "
           "1\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  return text;
}

// A request stream over a connection: first the bytes the gatherer already received, then the
// socket (non-blocking; every wait bounded by the read or write timeout and, for reads, by the
// request's deadline).
class ConnStream : public httplib::Stream {
 public:
  ConnStream(GuardedServer::Conn& conn, std::chrono::milliseconds read_timeout,
             std::chrono::milliseconds write_timeout)
      : conn_(conn), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  bool is_readable() const override {
    if (pos_ < conn_.buf.size()) return true;
    pollfd p{conn_.fd, POLLIN, 0};
    return ::poll(&p, 1, millis_until(conn_.deadline, read_timeout_)) > 0;
  }

  // False once the peer has closed or reset: a streaming response stops writing to it.
  bool is_writable() const override {
    pollfd p{conn_.fd, POLLOUT | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) < 0) return false;
    return (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < conn_.buf.size()) {
      const std::size_t n = std::min(size, conn_.buf.size() - pos_);
      std::memcpy(ptr, conn_.buf.data() + pos_, n);
      pos_ += n;
      return static_cast<ssize_t>(n);
    }
    for (;;) {
      const ssize_t r = ::recv(conn_.fd, ptr, size, 0);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      const int wait = millis_until(conn_.deadline, read_timeout_);
      if (wait <= 0) return -1;  // the request did not arrive in time
      pollfd p{conn_.fd, POLLIN, 0};
      const int pr = ::poll(&p, 1, wait);
      if (pr < 0 && errno == EINTR) continue;
      if (pr <= 0) return -1;
    }
  }

  ssize_t write(const char* ptr, size_t size) override {
    std::size_t done = 0;
    while (done < size) {
      const ssize_t r = ::send(conn_.fd, ptr + done, size - done, MSG_NOSIGNAL);
      if (r > 0) {
        done += static_cast<std::size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      pollfd p{conn_.fd, POLLOUT, 0};
      const int pr = ::poll(&p, 1, static_cast<int>(write_timeout_.count()));
      if (pr < 0 && errno == EINTR) continue;
      if (pr <= 0 || (p.revents & (POLLERR | POLLHUP))) return -1;
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(::getsockname, ip, port);
  }
  socket_t socket() const override { return conn_.fd; }

 private:
  using NameFn = int (*)(int, sockaddr*, socklen_t*);
  void address(NameFn fn, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    ip.clear();
    port = 0;
    if (fn(conn_.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
      port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
      ::inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof buf);
      port = ntohs(in->sin6_port);
    }
    ip = buf;
  }

  GuardedServer::Conn& conn_;
  std::chrono::milliseconds read_timeout_, write_timeout_;
  std::size_t pos_ = 0;
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

bool on_overflow_thread() {
  return t_overflow;
}

bool client_disconnected() {
  const int fd = t_fd;
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  if (p.revents & POLLIN) {
    char c;
    return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

// httplib's task queue: it runs each accepted socket's task at once on the accept thread, and
// that task (process_and_close_socket) only hands the socket to the gatherer.
class GuardedServer::Door : public httplib::TaskQueue {
 public:
  explicit Door(GuardedServer& owner) : owner_(owner) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { owner_.stop_all(); }

 private:
  GuardedServer& owner_;
};

GuardedServer::GuardedServer(FrontDoorOptions options) : options_(std::move(options)) {
  options_.workers = std::max(options_.workers, 1);
  options_.overflow_workers = std::max(options_.overflow_workers, 1);
  new_task_queue = [this] { return new Door(*this); };
  start();
}

GuardedServer::~GuardedServer() {
  stop_all();
}

void GuardedServer::set_guarded_logger(httplib::Logger logger) {
  set_logger(
      [logger = std::move(logger)](const httplib::Request& req, const httplib::Response& res) {
        t_close = res.get_header_value("Connection") == "close";
        if (logger) logger(req, res);
      });
}

void GuardedServer::start() {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::lock_guard lock(mu_);
  started_ = true;
  threads_.emplace_back([this] { gatherer_loop(); });
  for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { worker_loop(false); });
  for (int i = 0; i < options_.overflow_workers; ++i)
    threads_.emplace_back([this] { worker_loop(true); });
}

void GuardedServer::stop_all() {
  {
    std::lock_guard lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  overflow_cv_.notify_all();
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  std::lock_guard lock(mu_);
  for (auto* q : {&inbox_, &work_, &overflow_})
    for (auto& c : *q) close_conn(c);
  inbox_.clear();
  work_.clear();
  overflow_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

bool GuardedServer::set_listen_backlog(int backlog) {
  const socket_t sock = svr_sock_;
  return sock != INVALID_SOCKET && ::listen(sock, backlog) == 0;
}

FrontDoorStats GuardedServer::stats() const {
  FrontDoorStats s;
  s.open_connections = open_.load();
  s.refused = refused_.load();
  s.overflow = overflow_served_.load();
  s.timed_out = timed_out_.load();
  return s;
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  const int flags = ::fcntl(sock, F_GETFL, 0);
  ::fcntl(sock, F_SETFL, flags | O_NONBLOCK);
  const int yes = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  Conn c;
  c.fd = sock;
  c.deadline = Clock::now() + options_.request_read_timeout;
  ++open_;
  if (static_cast<std::size_t>(open_.load()) > options_.max_connections) {
    char drain[4096];
    while (::recv(sock, drain, sizeof drain, MSG_DONTWAIT) > 0) {
    }
    refuse(c);
    return true;
  }
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      inbox_.push_back(std::move(c));
      c.fd = -1;
    }
  }
  if (c.fd >= 0) {
    close_conn(c);
    return true;
  }
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  return true;
}

int GuardedServer::request_ready(const Conn& c, std::size_t* size) const {
  if (size) *size = 0;
  if (c.buf.empty()) return 0;
  const auto end = c.buf.find("\r\n\r\n");
  if (end == std::string::npos) return c.buf.size() > options_.max_header_bytes ? 1 : 0;
  // Header fields follow the request line, so each starts after a CRLF.
  const std::string head = lower(std::string_view(c.buf).substr(0, end + 2));
  // The worker finishes these (within the deadline): 100-continue waits for the server's answer,
  // chunked bodies have no length to wait for.
  if (head.find("\r\nexpect:") != std::string::npos) return 1;
  if (head.find("\r\ntransfer-encoding:") != std::string::npos) return 1;
  std::size_t length = 0;
  if (const auto at = head.find("\r\ncontent-length:"); at != std::string::npos) {
    std::size_t i = at + 17;
    while (i < head.size() && (head[i] == ' ' || head[i] == '\t')) ++i;
    if (i >= head.size() || !std::isdigit(static_cast<unsigned char>(head[i])))
      return 1;  // httplib refuses it
    for (; i < head.size() && std::isdigit(static_cast<unsigned char>(head[i])); ++i) {
      length = length * 10 + static_cast<std::size_t>(head[i] - '0');
      if (length > options_.max_body_bytes) return 1;  // httplib answers 413 without reading it
    }
  }
  if (c.buf.size() < end + 4 + length) return 0;
  if (size) *size = end + 4 + length;
  return 1;
}

void GuardedServer::gatherer_loop() {
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  const std::size_t max_request = options_.max_header_bytes + options_.max_body_bytes + 4;
  std::vector<char> chunk(64 << 10);
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
      for (auto& c : inbox_) conns.push_back(std::move(c));
      inbox_.clear();
    }
    // Hand on what is complete; drop what is late.
    const auto now = Clock::now();
    for (std::size_t i = 0; i < conns.size();) {
      Conn& c = conns[i];
      if (request_ready(c) == 1) {
        dispatch(std::move(c));
      } else if (now >= c.deadline) {
        if (!c.idle) ++timed_out_;
        close_conn(c);
      } else {
        ++i;
        continue;
      }
      conns[i] = std::move(conns.back());
      conns.pop_back();
    }

    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    auto next = now + std::chrono::seconds(1);
    for (const auto& c : conns) {
      fds.push_back(pollfd{c.fd, POLLIN, 0});
      next = std::min(next, c.deadline);
    }
    const int pr =
        ::poll(fds.data(), fds.size(), millis_until(next, std::chrono::milliseconds(1000)) + 1);
    if (pr < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      std::uint64_t n;
      (void)!::read(wake_fd_, &n, sizeof n);
    }
    // Receive; conns[i] is fds[i + 1] (nothing was added or removed since the poll).
    std::vector<std::size_t> gone;
    for (std::size_t i = 0; i < conns.size(); ++i) {
      if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Conn& c = conns[i];
      bool closed = false;
      while (c.buf.size() < max_request) {
        const ssize_t r =
            ::recv(c.fd, chunk.data(), std::min(chunk.size(), max_request - c.buf.size()), 0);
        if (r > 0) {
          if (c.idle) {
            c.idle = false;
            c.deadline = Clock::now() + options_.request_read_timeout;
          }
          c.buf.append(chunk.data(), static_cast<std::size_t>(r));
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        closed = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
        break;
      }
      // A client that closed after sending a whole request still gets its answer.
      if (closed && request_ready(c) != 1) gone.push_back(i);
    }
    for (auto it = gone.rbegin(); it != gone.rend(); ++it) {
      close_conn(conns[*it]);
      conns[*it] = std::move(conns.back());
      conns.pop_back();
    }
    std::size_t buffered = 0;
    for (const auto& c : conns) buffered += c.buf.size();
    // Over the memory budget: the largest partial requests are answered 503 and dropped.
    while (buffered > options_.max_buffered_bytes && !conns.empty()) {
      auto largest = std::max_element(conns.begin(), conns.end(), [](const Conn& a, const Conn& b) {
        return a.buf.size() < b.buf.size();
      });
      buffered -= largest->buf.size();
      refuse(*largest);
      *largest = std::move(conns.back());
      conns.pop_back();
    }
  }
  for (auto& c : conns) close_conn(c);
}

void GuardedServer::dispatch(Conn conn) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      if (assigned_ < options_.workers) {
        ++assigned_;
        work_.push_back(std::move(conn));
        work_cv_.notify_one();
        return;
      }
      if (overflow_.size() < options_.overflow_backlog) {
        overflow_.push_back(std::move(conn));
        overflow_cv_.notify_one();
        return;
      }
    }
  }
  refuse(conn);
}

void GuardedServer::worker_loop(bool overflow) {
  auto& queue = overflow ? overflow_ : work_;
  auto& cv = overflow ? overflow_cv_ : work_cv_;
  for (;;) {
    Conn c;
    {
      std::unique_lock lock(mu_);
      cv.wait(lock, [&] { return stopping_ || !queue.empty(); });
      if (queue.empty()) return;
      c = std::move(queue.front());
      queue.pop_front();
    }
    serve(std::move(c), overflow);
    if (!overflow) {
      std::lock_guard lock(mu_);
      --assigned_;
    }
  }
}

void GuardedServer::serve(Conn conn, bool overflow) {
  bool stopping;
  {
    std::lock_guard lock(mu_);
    stopping = stopping_;
  }
  ++conn.served;
  const bool last = overflow || stopping || conn.served >= options_.max_requests_per_connection;
  t_fd = conn.fd;
  t_overflow = overflow;
  t_close = false;
  // The request's length when it is whole in the buffer: whatever the handler read of it, the
  // next request starts after it (a refusal before routing leaves the body unread). A request
  // not whole here (chunked, 100-continue, too large) ends the connection.
  std::size_t size = 0;
  (void)request_ready(conn, &size);
  // Counted before the answer goes out, so a client that has its 503 already sees it counted in
  // /metrics (the overload test compares the two).
  if (overflow) ++overflow_served_;
  bool closed = false;
  bool ok;
  std::string rest;
  {
    ConnStream stream(conn, options_.request_read_timeout, options_.write_timeout);
    ok = process_request(stream, last || size == 0, closed, nullptr);
    rest = size > 0 && size <= conn.buf.size() ? conn.buf.substr(size) : std::string();
  }
  t_fd = -1;
  t_overflow = false;
  if (!ok || closed || last || size == 0 || t_close) return close_conn(conn);
  conn.buf = std::move(rest);
  hand_back(std::move(conn));
}

void GuardedServer::hand_back(Conn conn) {
  conn.idle = conn.buf.empty();
  conn.deadline =
      Clock::now() + (conn.idle ? options_.keep_alive_timeout : options_.request_read_timeout);
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      inbox_.push_back(std::move(conn));
      conn.fd = -1;
    }
  }
  if (conn.fd >= 0) return close_conn(conn);
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void GuardedServer::refuse(Conn& conn) {
  ++refused_;
  const std::string& text = overloaded_response();
  (void)!::send(conn.fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close_conn(conn);
}

void GuardedServer::close_conn(Conn& conn) {
  if (conn.fd < 0) return;
  ::shutdown(conn.fd, SHUT_WR);
  ::close(conn.fd);
  conn.fd = -1;
  --open_;
}

}  // namespace fs::server
