#include "http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "dlrec/core/config.h"
#include "dlrec/core/error.h"
#include "frontends.h"

namespace dlrec::serve {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Status";
  }
}

// A request the server answers itself: status and message.
struct Refusal {
  int status;
  std::string message;
};

std::string error_body(const std::string& message) {
  return dump_json_safe(json{{"error", message}});
}

}  // namespace

// --- connections ------------------------------------------------------------------------------

namespace {

enum class ConnState {
  Idle,       // waiting for the first byte of a request (keep-alive)
  Head,       // reading the request line and headers
  Body,       // reading a Content-Length body
  ChunkLine,  // reading a chunk-size line
  ChunkData,  // reading chunk data
  ChunkEnd,   // reading the CRLF after chunk data
  Trailers,   // reading the trailer section after the last chunk
  Busy,       // a worker has it (not in the epoll set)
  Lingering,  // answered and shut down for writing; reading and discarding until EOF
};

struct Conn {
  int fd = -1;
  ConnState state = ConnState::Idle;
  int64_t deadline = 0;  // ms (steady clock) at which the current state expires
  std::string head;      // the head (or a chunk line / trailers) as it arrives
  std::string pending;   // bytes received after a complete request (pipelining)
  HttpRequest req;
  int64_t body_left = 0;  // Body: bytes still to come; ChunkData: bytes left in the chunk
  bool keep_alive = true;
  bool close_after = false;  // a refusal: answer, then linger and close
  Refusal refusal{0, ""};
  uint64_t t0 = 0;        // ns (steady) of the request's first byte, for the log
  int64_t discarded = 0;  // Lingering: bytes read and dropped
};

uint64_t now_ns_steady() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

struct HttpServer::Impl {
  std::string name;
  HttpServerLimits lim;
  HttpHandler handler;
  HttpLogger logger;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;  // eventfd: connections returned by workers, stop requested
  int port = -1;
  bool listening_paused = false;  // out of descriptors: accept again at the next tick
  std::thread loop_thread;
  std::vector<std::thread> workers;
  std::atomic<bool> stopping{false};
  int64_t stop_deadline = 0;  // loop thread only
  bool stop_seen = false;     // loop thread only

  // Owned by the loop thread, except while Busy (then a worker uses the Conn, not the map).
  std::unordered_map<int, std::unique_ptr<Conn>> conns;

  std::mutex mu;  // guards the two queues and `workers_exit`
  std::condition_variable work_cv;
  std::deque<Conn*> work;      // complete requests (or refusals) for the workers
  std::deque<Conn*> returned;  // connections the workers are done with
  bool workers_exit = false;

  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() {
    uint64_t one = 1;
    ssize_t r = ::write(wake_fd, &one, sizeof one);
    (void)r;
  }

  // --- loop thread --------------------------------------------------------------------------

  void run_loop();
  void accept_all();
  void on_readable(Conn& c);
  void feed(Conn& c, const char* p, size_t n);
  void parse_head(Conn& c);
  void request_complete(Conn& c);
  void refuse(Conn& c, int status, std::string message);
  void dispatch(Conn& c);
  void close_conn(Conn& c);
  void linger(Conn& c);
  void take_returned();
  void check_deadlines();

  // --- workers --------------------------------------------------------------------------------

  void run_worker();
  void serve(Conn& c);
  bool send_all(int fd, const std::string& head, const std::string& body);
};

void HttpServer::Impl::run_loop() {
  std::vector<epoll_event> events(256);
  int64_t next_tick = now_ms() + 100;
  for (;;) {
    if (stopping.load() && !stop_seen) {
      stop_seen = true;
      stop_deadline = now_ms() + lim.stop_grace_ms;
      if (listen_fd >= 0) {
        ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
        ::close(listen_fd);
        listen_fd = -1;
      }
      // Idle connections go now (gracefully: no request of theirs is lost); half-received
      // requests get until stop_deadline.
      std::vector<Conn*> idle;
      for (auto& [fd, c] : conns)
        if (c->state == ConnState::Idle) idle.push_back(c.get());
      for (Conn* c : idle) linger(*c);
      for (auto& [fd, c] : conns)
        if (c->state != ConnState::Busy && c->state != ConnState::Lingering)
          c->deadline = std::min(c->deadline, stop_deadline);
    }
    if (stop_seen && conns.empty()) return;
    int n = ::epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd) {
        uint64_t v;
        ssize_t r = ::read(wake_fd, &v, sizeof v);
        (void)r;
        take_returned();
      } else if (fd == listen_fd) {
        accept_all();
      } else {
        auto it = conns.find(fd);
        if (it != conns.end() && it->second->state != ConnState::Busy) on_readable(*it->second);
      }
    }
    if (now_ms() >= next_tick) {
      next_tick = now_ms() + 100;
      check_deadlines();
      if (listening_paused && listen_fd >= 0) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = listen_fd;
        if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev) == 0) listening_paused = false;
      }
    }
  }
}

void HttpServer::Impl::accept_all() {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Level-triggered: the pending connection would wake the loop at once again. Listen
        // again at the next tick, when descriptors may have been freed.
        ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
        listening_paused = true;
      }
      return;
    }
    if (static_cast<int>(conns.size()) >= lim.max_connections) {
      static const std::string msg = [] {
        std::string body = error_body("too many open connections; try again later");
        return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
               "Content-Length: " +
               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      }();
      ssize_t w = ::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)w;
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->state = ConnState::Idle;
    c->deadline = now_ms() + (stop_seen ? 0 : lim.idle_timeout_ms);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    conns.emplace(fd, std::move(c));
  }
}

void HttpServer::Impl::on_readable(Conn& c) {
  char buf[65536];
  // At most 16 reads per wake-up, so that one fast sender does not hold the loop.
  for (int round = 0; round < 16; ++round) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      if (c.state == ConnState::Lingering) {
        c.discarded += n;
        continue;
      }
      feed(c, buf, static_cast<size_t>(n));
      if (c.state == ConnState::Busy || c.state == ConnState::Lingering) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    // EOF or error: the client is gone (or done, when lingering).
    close_conn(c);
    return;
  }
}

// Runs the connection's state machine over received bytes. Stops at a complete request (the
// rest is kept in `pending`) or a refusal.
void HttpServer::Impl::feed(Conn& c, const char* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    switch (c.state) {
      case ConnState::Idle:
        // Blank lines before a request are ignored (RFC 9112, 2.2).
        if (p[i] == '\r' || p[i] == '\n') {
          ++i;
          continue;
        }
        c.state = ConnState::Head;
        c.head.clear();
        c.req = HttpRequest{};
        c.t0 = now_ns_steady();
        c.deadline = now_ms() + lim.header_timeout_ms;
        if (stop_seen) c.deadline = std::min(c.deadline, stop_deadline);
        break;
      case ConnState::Head:
      case ConnState::Trailers: {
        const size_t old = c.head.size();
        const size_t take = std::min(n - i, static_cast<size_t>(lim.max_header_bytes) + 4 - old);
        c.head.append(p + i, take);
        size_t from = old >= 3 ? old - 3 : 0;
        size_t end = c.head.find("\r\n\r\n", from);
        // An empty trailer section is just CRLF after the last chunk's line.
        if (c.state == ConnState::Trailers && c.head.compare(0, 2, "\r\n") == 0) end = 0;
        if (end == std::string::npos) {
          if (c.head.size() > static_cast<size_t>(lim.max_header_bytes))
            return refuse(
                c, 431,
                c.state == ConnState::Head
                    ? "the request head exceeds " + std::to_string(lim.max_header_bytes) + " bytes"
                    : "the chunked trailers are too long");
          i += take;
          continue;
        }
        const size_t head_len = c.state == ConnState::Trailers && end == 0 ? 2 : end + 4;
        i += head_len - old;
        c.head.resize(head_len);
        if (c.state == ConnState::Trailers) {
          if (!valid_utf8(c.head.data(), c.head.size()))
            return refuse(c, 400, "the chunked trailers are not valid UTF-8");
          request_complete(c);
        } else {
          parse_head(c);
        }
        if (c.state == ConnState::Busy || c.state == ConnState::Lingering) {
          c.pending.assign(p + i, n - i);
          return;
        }
        break;
      }
      case ConnState::Body: {
        const size_t take = static_cast<size_t>(std::min<int64_t>(n - i, c.body_left));
        c.req.body.append(p + i, take);
        i += take;
        c.body_left -= static_cast<int64_t>(take);
        if (c.body_left == 0) {
          request_complete(c);
          c.pending.assign(p + i, n - i);
          return;
        }
        break;
      }
      case ConnState::ChunkLine: {
        const char* nl = static_cast<const char*>(std::memchr(p + i, '\n', n - i));
        const size_t take = nl ? static_cast<size_t>(nl - (p + i)) + 1 : n - i;
        c.head.append(p + i, take);
        i += take;
        if (c.head.size() > 1024) return refuse(c, 400, "a chunk-size line exceeds 1024 bytes");
        if (!nl) break;
        if (c.head.size() < 2 || c.head[c.head.size() - 2] != '\r')
          return refuse(c, 400, "a chunk-size line does not end with CRLF");
        int64_t size = 0;
        size_t k = 0, digits = 0;
        for (; k < c.head.size(); ++k) {
          char ch = c.head[k];
          int v = (ch >= '0' && ch <= '9')   ? ch - '0'
                  : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
                  : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10
                                             : -1;
          if (v < 0) break;
          if (++digits > 15) return refuse(c, 413, "a chunk is larger than the request limit");
          size = size * 16 + v;
        }
        if (digits == 0 ||
            (c.head[k] != ';' && c.head[k] != '\r' && c.head[k] != ' ' && c.head[k] != '\t'))
          return refuse(c, 400, "malformed chunk size");
        c.head.clear();
        if (size == 0) {
          c.state = ConnState::Trailers;
          break;
        }
        if (size > lim.max_body_bytes - static_cast<int64_t>(c.req.body.size()))
          return refuse(c, 413,
                        "the request body exceeds the server's maximum request size (" +
                            std::to_string(lim.max_body_bytes) + " bytes)");
        c.body_left = size;
        c.state = ConnState::ChunkData;
        break;
      }
      case ConnState::ChunkData: {
        const size_t take = static_cast<size_t>(std::min<int64_t>(n - i, c.body_left));
        c.req.body.append(p + i, take);
        i += take;
        c.body_left -= static_cast<int64_t>(take);
        if (c.body_left == 0) {
          c.state = ConnState::ChunkEnd;
          c.head.clear();
        }
        break;
      }
      case ConnState::ChunkEnd: {
        c.head.push_back(p[i++]);
        if (c.head.size() == 2) {
          if (c.head != "\r\n") return refuse(c, 400, "chunk data is not followed by CRLF");
          c.head.clear();
          c.state = ConnState::ChunkLine;
        }
        break;
      }
      case ConnState::Busy:
      case ConnState::Lingering:
        return;
    }
  }
}

// Parses c.head into c.req (http_request_head.cc) and decides how the body comes.
void HttpServer::Impl::parse_head(Conn& c) {
  RequestHead h = parse_request_head(c.head, c.req);
  if (h.refusal_status != 0) return refuse(c, h.refusal_status, std::move(h.refusal));
  const bool chunked = h.chunked;
  const int64_t content_length = h.content_length;
  c.keep_alive = h.keep_alive;
  if (content_length > lim.max_body_bytes)
    return refuse(c, 413,
                  "the request body (" + std::to_string(content_length) +
                      " bytes) exceeds the server's maximum request size (" +
                      std::to_string(lim.max_body_bytes) + " bytes)");
  if (!chunked && content_length <= 0) return request_complete(c);  // no body
  if (h.expect_continue) {
    static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    // Into an empty send buffer this never blocks; if it fails the body does not come and the
    // body deadline answers.
    ssize_t w = ::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
  }
  c.deadline = now_ms() + lim.body_timeout_ms;
  if (stop_seen) c.deadline = std::min(c.deadline, stop_deadline);
  c.head.clear();
  if (chunked) {
    c.state = ConnState::ChunkLine;
  } else {
    // Reserved, not touched: pages are used as the bytes arrive.
    c.req.body.reserve(static_cast<size_t>(content_length));
    c.body_left = content_length;
    c.state = ConnState::Body;
  }
}

void HttpServer::Impl::request_complete(Conn& c) {
  c.head.clear();
  c.head.shrink_to_fit();
  dispatch(c);
}

void HttpServer::Impl::refuse(Conn& c, int status, std::string message) {
  c.refusal = {status, std::move(message)};
  c.close_after = true;
  c.keep_alive = false;
  dispatch(c);
}

void HttpServer::Impl::dispatch(Conn& c) {
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  c.state = ConnState::Busy;
  {
    std::lock_guard<std::mutex> lk(mu);
    work.push_back(&c);
  }
  work_cv.notify_one();
}

void HttpServer::Impl::close_conn(Conn& c) {
  const int fd = c.fd;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  conns.erase(fd);  // destroys c
}

// Half-closes the connection and reads what the client still sends until it closes too (or two
// seconds pass): closing with unread bytes would make the kernel send a reset, which can destroy
// the answer before the client reads it.
void HttpServer::Impl::linger(Conn& c) {
  ::shutdown(c.fd, SHUT_WR);
  c.state = ConnState::Lingering;
  c.deadline = now_ms() + 2000;
  c.req = HttpRequest{};
  c.pending.clear();
  c.pending.shrink_to_fit();
  c.head.clear();
  c.head.shrink_to_fit();
}

void HttpServer::Impl::take_returned() {
  std::deque<Conn*> back;
  {
    std::lock_guard<std::mutex> lk(mu);
    back.swap(returned);
  }
  for (Conn* c : back) {
    c->req = HttpRequest{};  // releases the body
    c->refusal = {0, ""};
    if (c->close_after || stop_seen) {
      linger(*c);
    } else {
      c->state = ConnState::Idle;
      c->deadline = now_ms() + lim.idle_timeout_ms;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c->fd;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
      close_conn(*c);
      continue;
    }
    if (c->state == ConnState::Idle && !c->pending.empty()) {
      std::string bytes;
      bytes.swap(c->pending);
      feed(*c, bytes.data(), bytes.size());
    }
  }
}

void HttpServer::Impl::check_deadlines() {
  const int64_t now = now_ms();
  std::vector<Conn*> expired;
  for (auto& [fd, c] : conns)
    if (c->state != ConnState::Busy && now >= c->deadline) expired.push_back(c.get());
  for (Conn* c : expired) {
    switch (c->state) {
      case ConnState::Idle:
      case ConnState::Lingering:
        close_conn(*c);
        break;
      case ConnState::Head:
        refuse(
            *c, stop_seen ? 503 : 408,
            stop_seen ? "the server is shutting down" : "the request head did not arrive in time");
        break;
      default:
        refuse(
            *c, stop_seen ? 503 : 408,
            stop_seen ? "the server is shutting down" : "the request body did not arrive in time");
        break;
    }
  }
}

// --- workers ------------------------------------------------------------------------------------

void HttpServer::Impl::run_worker() {
  for (;;) {
    Conn* c = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu);
      work_cv.wait(lk, [&] { return workers_exit || !work.empty(); });
      if (work.empty()) return;
      c = work.front();
      work.pop_front();
    }
    try {
      serve(*c);
    } catch (...) {
      c->close_after = true;  // no memory even for the answer: drop the connection
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      returned.push_back(c);
    }
    wake();
  }
}

void HttpServer::Impl::serve(Conn& c) {
  // A big body (the handler may have released it already) is followed by a trim below.
  const bool big = c.req.body.capacity() > (size_t{1} << 20);
  HttpResponse res;
  if (c.refusal.status != 0) {
    res.status = c.refusal.status;
    res.body = error_body(c.refusal.message);
  } else {
    try {
      handler(c.req, res);
    } catch (...) {
      // The handler's own guard converts failures; this is the last line (e.g. bad_alloc
      // while forming an error), and must not throw itself.
      res.status = 500;
      res.content_type = "application/json";
      res.headers.clear();
      try {
        try {
          throw;
        } catch (const std::exception& e) {
          res.body = error_body(std::string("internal error: ") + e.what());
        }
      } catch (...) {
        res.body = "{\"error\":\"internal error\"}";
      }
    }
  }
  if (stopping.load()) c.keep_alive = false;
  if (!c.keep_alive) c.close_after = true;
  std::string head = "HTTP/1.1 " + std::to_string(res.status) + " " + reason_phrase(res.status) +
                     "\r\nContent-Type: " + res.content_type +
                     "\r\nContent-Length: " + std::to_string(res.body.size()) + "\r\n";
  for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
  head += c.keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  if (!send_all(c.fd, head, res.body)) c.close_after = true;
  if (logger) {
    try {
      logger(c.req, res, now_ns_steady() - c.t0);
    } catch (...) {
    }
  }
  if (big) {
    std::string().swap(c.req.body);
    return_freed_memory();
  }
}

bool HttpServer::Impl::send_all(int fd, const std::string& head, const std::string& body) {
  const int64_t deadline = now_ms() + lim.write_timeout_ms;
  size_t off = 0;
  const size_t total = head.size() + body.size();
  while (off < total) {
    iovec iov[2];
    int cnt = 0;
    if (off < head.size()) {
      iov[cnt++] = {const_cast<char*>(head.data() + off), head.size() - off};
      iov[cnt++] = {const_cast<char*>(body.data()), body.size()};
    } else {
      iov[cnt++] = {const_cast<char*>(body.data() + (off - head.size())),
                    body.size() - (off - head.size())};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(cnt);
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int64_t left = deadline - now_ms();
      if (left <= 0) return false;
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      continue;
    }
    return false;
  }
  return true;
}

// --- the public class ---------------------------------------------------------------------------

HttpServer::HttpServer(std::string name, HttpServerLimits limits, HttpHandler handler,
                       HttpLogger logger)
    : impl_(new Impl) {
  impl_->name = std::move(name);
  impl_->lim = limits;
  impl_->handler = std::move(handler);
  impl_->logger = std::move(logger);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start(const std::string& host, int port) {
  Impl& m = *impl_;
  DLREC_CHECK(m.lim.threads >= 1 && m.lim.max_connections >= 1 && m.lim.max_body_bytes > 0, m.name,
              ": bad limits");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  DLREC_CHECK(rc == 0 && res, m.name, ": cannot resolve '", host, "': ", ::gai_strerror(rc));
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) break;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  DLREC_CHECK(fd >= 0, m.name, ": cannot bind ", host, ":", port,
              " (in use, or not a local address)");
  m.listen_fd = fd;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  m.port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  m.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DLREC_CHECK(m.epoll_fd >= 0 && m.wake_fd >= 0, m.name, ": cannot create the event loop");
  for (int f : {m.listen_fd, m.wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = f;
    DLREC_CHECK(::epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, f, &ev) == 0, m.name, ": epoll_ctl failed");
  }
  const std::string base = m.name == "HTTP" ? "http" : m.name.substr(0, 4);
  for (int i = 0; i < m.lim.threads; ++i)
    m.workers.emplace_back([&m, i, base] {
#ifdef __linux__
      pthread_setname_np(pthread_self(), (base + "-w" + std::to_string(i)).substr(0, 15).c_str());
#endif
      m.run_worker();
    });
  m.loop_thread = std::thread([&m, base] {
#ifdef __linux__
    pthread_setname_np(pthread_self(), (base + "-loop").substr(0, 15).c_str());
#endif
    m.run_loop();
  });
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::begin_stop() {
  if (impl_->stopping.exchange(true)) return;
  if (impl_->wake_fd >= 0) impl_->wake();
}

bool HttpServer::stopping() const { return impl_->stopping.load(); }

void HttpServer::stop() {
  Impl& m = *impl_;
  if (!m.loop_thread.joinable()) return;
  begin_stop();
  m.loop_thread.join();  // returns once every connection is closed
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.workers_exit = true;
  }
  m.work_cv.notify_all();
  for (auto& t : m.workers) t.join();
  m.workers.clear();
}

}  // namespace dlrec::serve
