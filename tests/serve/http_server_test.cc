// The HTTP front end under hostile clients (issue 25): each case sends raw bytes over a
// loopback socket to a serve::Server started in-process (an empty model repository: the
// health, repository and error paths) or to the HttpServer beneath it, then checks the answer
// and that the server still answers health checks. Inference under the same attacks, against a
// real model: tests/python/test_serve_hostile.py.
#include "../src/serve/http_server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/serve/server.h"

using namespace dlrec;
using namespace dlrec::serve;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Sends what it can; false when the peer closed or reset.
bool send_bytes(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

struct Answer {
  int status = 0;  // 0: no (complete) answer
  std::string head, body;
  bool reset = false;  // the connection was reset
};

// Reads one response (status line, headers, Content-Length body) within `timeout_s`.
Answer read_answer(int fd, double timeout_s = 5.0, std::string* rest = nullptr) {
  Answer a;
  std::string buf = rest ? *rest : std::string();
  const auto t0 = Clock::now();
  size_t head_end = std::string::npos;
  size_t need = std::string::npos;
  for (;;) {
    if (head_end == std::string::npos) {
      head_end = buf.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        a.head = buf.substr(0, head_end);
        if (a.head.compare(0, 12, "HTTP/1.1 100") == 0) {  // interim; the real one follows
          buf.erase(0, head_end + 4);
          head_end = std::string::npos;
          continue;
        }
        std::string lower = a.head;
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        size_t cl = lower.find("content-length: ");
        need = head_end + 4 + (cl == std::string::npos ? 0 : std::stoul(lower.substr(cl + 16)));
      }
    }
    if (need != std::string::npos && buf.size() >= need) {
      a.status = std::stoi(a.head.substr(9, 3));
      a.body = buf.substr(head_end + 4, need - head_end - 4);
      if (rest) *rest = buf.substr(need);
      return a;
    }
    const double left = timeout_s - seconds_since(t0);
    if (left <= 0) return a;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    char tmp[65536];
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n < 0 && errno == ECONNRESET) a.reset = true;
    if (n <= 0) return a;
    buf.append(tmp, static_cast<size_t>(n));
  }
}

// True when the peer closes the connection (EOF or reset) within `timeout_s`.
bool closed_within(int fd, double timeout_s) {
  const auto t0 = Clock::now();
  while (seconds_since(t0) < timeout_s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char tmp[4096];
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return true;
  }
  return false;
}

// One request on a fresh connection.
Answer request(int port, const std::string& bytes, double timeout_s = 5.0) {
  int fd = connect_to(port);
  if (fd < 0) return {};
  send_bytes(fd, bytes);
  Answer a = read_answer(fd, timeout_s);
  ::close(fd);
  return a;
}

std::string post_index(const std::string& body) {
  return "POST /v2/repository/index HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

std::string get(const std::string& path) { return "GET " + path + " HTTP/1.1\r\nHost: t\r\n\r\n"; }

class ServerHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = fs::temp_directory_path() / ("dlrec_http_hostile_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(std::random_device{}()));
    fs::create_directories(repo_);
  }
  void TearDown() override {
    server_.reset();
    std::error_code ec;
    fs::remove_all(repo_, ec);
  }
  // A server with only HTTP, small limits and short timeouts.
  void start(int threads = 2, int max_connections = 1024) {
    ServerOptions o;
    o.model_repository = repo_.string();
    o.http_port = 0;
    o.grpc_port = -1;
    o.metrics_port = -1;
    o.http_threads = threads;
    o.http_max_connections = max_connections;
    o.max_request_bytes = int64_t{1} << 20;
    o.http_header_timeout_ms = 700;
    o.http_body_timeout_ms = 700;
    o.http_idle_timeout_ms = 1500;
    server_ = std::make_unique<Server>(o);
    server_->start();
    port_ = server_->http_port();
  }
  void expect_healthy(double within_s = 1.0) {
    const auto t0 = Clock::now();
    Answer a = request(port_, get("/v2/health/live"), 5.0);
    EXPECT_EQ(a.status, 200) << a.head;
    EXPECT_LT(seconds_since(t0), within_s);
  }

  fs::path repo_;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

}  // namespace

TEST_F(ServerHostile, InvalidUtf8InThePathIsA400NotACrash) {
  start();
  // The 29-byte request that killed the server (the 404 body held the invalid path).
  Answer a = request(port_, "GET /%ff HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.status, 400) << a.head;
  EXPECT_NE(a.body.find("UTF-8"), std::string::npos) << a.body;
  EXPECT_EQ(request(port_, "GET /\xff\xfe HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(request(port_, "GET /v2/models/%c3%28/ready HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(request(port_, "GET /ok HTTP/1.1\r\nX-Bad: \xc0\xaf\r\n\r\n").status, 400);
  EXPECT_EQ(request(port_, "GET /a%00b HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(request(port_, "GET /a%zz HTTP/1.1\r\n\r\n").status, 400);
  // Valid UTF-8 in an unknown path: a 404 whose body is valid JSON naming it.
  Answer nf = request(port_, get("/caf%C3%A9"));
  EXPECT_EQ(nf.status, 404);
  EXPECT_EQ(parse_json(nf.body, "body")["error"], "no endpoint GET /caf\xc3\xa9");
  // A model name that is not UTF-8 in a repository call.
  EXPECT_EQ(request(port_, "POST /v2/repository/models/%ff/load HTTP/1.1\r\n\r\n").status, 400);
  expect_healthy();
}

TEST_F(ServerHostile, MalformedRequestsAreAnsweredAndClosed) {
  start();
  const std::string big_header = "GET / HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n";
  const std::pair<std::string, int> cases[] = {
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET /\r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"G(T / HTTP/1.1\r\n\r\n", 400},
      {"GET http://x/ HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Name: v\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\x01"
       "b\r\n\r\n",
       400},
      {"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked"
       "\r\n\r\n{}",
       400},
      {"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
       400},
      {"POST /v2/repository/index HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400},
      {"POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {"POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX", 400},
      {"POST /v2/repository/index HTTP/1.1\r\nExpect: magic\r\nContent-Length: 2\r\n\r\n{}", 417},
      {big_header, 431},
      // Bodies: not JSON, not UTF-8, not an object, a non-boolean 'ready'.
      {post_index("{x}"), 400},
      {post_index("{\"a\":\"\xff\xfe\xfd\"}"), 400},
      {post_index("[]"), 400},
      {post_index("{\"ready\": 1}"), 400},
  };
  for (const auto& [bytes, status] : cases) {
    int fd = connect_to(port_);
    ASSERT_GE(fd, 0);
    send_bytes(fd, bytes);
    Answer a = read_answer(fd);
    EXPECT_EQ(a.status, status) << bytes.substr(0, 80) << "\n" << a.head << a.body;
    EXPECT_NO_THROW(parse_json(a.body, "error body")) << a.body;
    // Refused at the protocol level: the connection closes after the answer.
    if (a.head.find("Connection: close") != std::string::npos) {
      EXPECT_TRUE(closed_within(fd, 3.0)) << bytes.substr(0, 60);
    }
    ::close(fd);
  }
  // A path as long as the head limit allows: routed by plain segment comparison (std::regex
  // recursed per character on the worker's stack).
  for (const char* prefix : {"/v2/models/", "/v2/models/m/versions/", "/x/"}) {
    Answer lp = request(port_, get(prefix + std::string(16000, 'm')));
    EXPECT_TRUE(lp.status == 400 || lp.status == 404) << lp.head;
  }
  // A body nested 10,000 deep (the stack overflow of the issue, here in a repository call).
  std::string deep(10000, '[');
  deep += std::string(10000, ']');
  Answer d = request(port_, post_index(deep));
  EXPECT_EQ(d.status, 400);
  EXPECT_NE(d.body.find("nesting"), std::string::npos) << d.body;
  expect_healthy();
}

TEST_F(ServerHostile, BodiesOverTheLimitAre413ChunkedIncluded) {
  start();
  // Declared too big: refused before any body byte is read.
  Answer a =
      request(port_, "POST /v2/repository/index HTTP/1.1\r\nContent-Length: 209715200\r\n\r\n");
  EXPECT_EQ(a.status, 413);
  // Chunked: the sum of the chunks counts (1 MB limit; up to 200 chunks of 64 KB offered). The
  // 413 comes once the limit is passed, while the client is still sending (the server reads on
  // and drops the rest for a moment, so that the client sees the answer and not a reset).
  int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  send_bytes(fd, "POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string chunk = "10000\r\n" + std::string(65536, ' ') + "\r\n";
  int sent = 0;
  for (; sent < 200; ++sent) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, sent < 16 ? 0 : 20) == 1) break;  // the answer is there
    if (!send_bytes(fd, chunk)) break;
  }
  Answer c = read_answer(fd);
  EXPECT_EQ(c.status, 413) << c.head;
  EXPECT_LT(sent, 200) << "no answer before the whole 13 MB chunked body was sent";
  EXPECT_LT(seconds_since(t0), 5.0);
  ::close(fd);
  // Under the limit, chunked bodies are read (with extensions and trailers).
  Answer ok = request(port_,
                      "POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "1;ext=1\r\n{\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n");
  EXPECT_EQ(ok.status, 200) << ok.head << ok.body;
  expect_healthy();
}

TEST_F(ServerHostile, PostWithoutBodyIsAnsweredAtOnce) {
  start();
  const auto t0 = Clock::now();
  Answer a = request(port_, "POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.status, 200) << a.head << a.body;
  Answer b = request(port_, "POST /v2/repository/models/none/load HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(b.status, 404) << b.body;  // not in the repository
  EXPECT_LT(seconds_since(t0), 1.0);
}

TEST_F(ServerHostile, IdleAndHalfSentConnectionsDoNotDelayOthers) {
  start(/*threads=*/2);
  // 16 keep-alive connections that sent one request and stay open, 20 with unfinished heads,
  // 16 that never send: 26 more than workers.
  std::vector<int> fds;
  for (int i = 0; i < 16; ++i) {
    int fd = connect_to(port_);
    send_bytes(fd, get("/v2/health/live"));
    EXPECT_EQ(read_answer(fd).status, 200);
    fds.push_back(fd);
  }
  std::vector<int> partial;
  for (int i = 0; i < 20; ++i) {
    int fd = connect_to(port_);
    send_bytes(fd, "GET /v2/health/live HTTP/1.1\r\nHo");
    partial.push_back(fd);
  }
  for (int i = 0; i < 16; ++i) fds.push_back(connect_to(port_));
  for (int i = 0; i < 10; ++i) expect_healthy(1.0);
  // The unfinished heads time out (700 ms) with a 408 and are closed.
  for (int fd : partial) {
    Answer a = read_answer(fd, 3.0);
    EXPECT_EQ(a.status, 408) << a.head;
    EXPECT_TRUE(closed_within(fd, 3.0));
    ::close(fd);
  }
  // Idle keep-alive connections are closed after the idle timeout (1.5 s).
  for (int fd : fds) {
    EXPECT_TRUE(closed_within(fd, 4.0));
    ::close(fd);
  }
}

TEST_F(ServerHostile, TricklingClientsTimeOutAndHealthStaysFast) {
  start(/*threads=*/2);
  // 150 connections each sending its head one byte every 20 ms: none ever completes within
  // the header deadline (700 ms), and none holds a worker meanwhile.
  const std::string head = get("/v2/health/live") + std::string(200, '\n');
  std::vector<int> fds;
  for (int i = 0; i < 150; ++i) fds.push_back(connect_to(port_));
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (size_t pos = 0; pos < 40 && !done; ++pos) {
      for (int fd : fds) {
        char ch = head[pos];
        ::send(fd, &ch, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  double worst = 0;
  for (int i = 0; i < 20; ++i) {
    const auto t0 = Clock::now();
    Answer a = request(port_, get("/v2/health/live"));
    EXPECT_EQ(a.status, 200);
    worst = std::max(worst, seconds_since(t0));
  }
  EXPECT_LT(worst, 1.0);  // seconds before (4.5 s with 16 idle connections)
  done = true;
  trickle.join();
  int timed_out = 0;
  for (int fd : fds) {
    if (read_answer(fd, 3.0).status == 408) ++timed_out;
    ::close(fd);
  }
  EXPECT_EQ(timed_out, 150);
  expect_healthy();
}

TEST_F(ServerHostile, ConnectionsBeyondTheLimitAreRefused) {
  start(/*threads=*/2, /*max_connections=*/8);
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) fds.push_back(connect_to(port_));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted by the loop
  int extra = connect_to(port_);
  Answer a = read_answer(extra, 3.0);
  EXPECT_EQ(a.status, 503) << a.head;
  ::close(extra);
  for (int fd : fds) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  expect_healthy();
}

TEST_F(ServerHostile, PipelinedAndContinuedRequests) {
  start();
  int fd = connect_to(port_);
  send_bytes(fd, get("/v2/health/live") + get("/v2/health/ready") + get("/v2"));
  std::string rest;
  EXPECT_EQ(read_answer(fd, 5, &rest).body, R"({"live":true})");
  EXPECT_EQ(read_answer(fd, 5, &rest).body, R"({"ready":true})");
  EXPECT_EQ(read_answer(fd, 5, &rest).status, 200);
  // Expect: 100-continue: the interim answer, then the body is read.
  send_bytes(fd,
             "POST /v2/repository/index HTTP/1.1\r\nExpect: 100-continue\r\n"
             "Content-Length: 2\r\n\r\n");
  char buf[64] = {};
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "HTTP/1.1 100 Continue\r\n\r\n");
  send_bytes(fd, "{}");
  EXPECT_EQ(read_answer(fd).status, 200);
  // HTTP/1.0 closes unless asked to keep alive.
  send_bytes(fd, "GET /v2/health/live HTTP/1.0\r\n\r\n");
  EXPECT_EQ(read_answer(fd).status, 200);
  EXPECT_TRUE(closed_within(fd, 2.0));
  ::close(fd);
}

// Stopping answers the request in flight in full, also when the client has sent more that is
// never read (closing with unread bytes would reset the connection and could destroy the
// answer before the client reads it), and refuses half-sent requests with a 503.
TEST(HttpServerStop, RequestsInFlightAreAnsweredBeforeTheConnectionCloses) {
  std::atomic<int> calls{0};
  HttpServerLimits lim;
  lim.threads = 2;
  lim.stop_grace_ms = 300;
  HttpServer s("HTTP", lim, [&](HttpRequest& req, HttpResponse& res) {
    ++calls;
    if (req.path == "/slow") std::this_thread::sleep_for(std::chrono::milliseconds(400));
    res.body = std::string(200000, 'x');  // more than the socket buffers hold at once
  });
  s.start("127.0.0.1", 0);
  int busy = connect_to(s.port());
  // The slow request, and behind it a pipelined one plus junk the server will not read.
  send_bytes(busy, get("/slow") + get("/next") + std::string(100000, 'j'));
  int half = connect_to(s.port());
  send_bytes(half, "GET /half HTTP/1.1\r\nHo");
  int idle = connect_to(s.port());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread stopper([&] { s.stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the client reads late
  Answer a = read_answer(busy, 5.0);
  EXPECT_EQ(a.status, 200) << (a.reset ? "connection reset" : a.head);
  EXPECT_EQ(a.body.size(), 200000u);
  EXPECT_NE(a.head.find("Connection: close"), std::string::npos);
  Answer h = read_answer(half, 5.0);
  EXPECT_EQ(h.status, 503) << h.head;
  EXPECT_TRUE(closed_within(idle, 3.0));
  stopper.join();
  EXPECT_EQ(calls.load(), 1);  // the pipelined request came after the stop: not run
  for (int fd : {busy, half, idle}) ::close(fd);
}

TEST(HttpServerUtf8, ValidatesLikeTheStandard) {
  EXPECT_TRUE(valid_utf8("abc", 3));
  EXPECT_TRUE(valid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9));
  EXPECT_FALSE(valid_utf8("\xff", 1));
  EXPECT_FALSE(valid_utf8("\xc0\xaf", 2));          // overlong
  EXPECT_FALSE(valid_utf8("\xe0\x80\xaf", 3));      // overlong
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80", 3));      // surrogate
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80", 4));  // above U+10FFFF
  EXPECT_FALSE(valid_utf8("\xe2\x82", 2));          // truncated
  std::string out;
  EXPECT_TRUE(decode_request_path("/a%20b/%C3%A9", out));
  EXPECT_EQ(out, "/a b/\xc3\xa9");
  EXPECT_FALSE(decode_request_path("/%ff", out));
  EXPECT_FALSE(decode_request_path("/%f", out));
  EXPECT_FALSE(decode_request_path("/%", out));
  EXPECT_FALSE(decode_request_path("/%00", out));
}
