// Shared by the store tests: a redis-server of their own on a free loopback port.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace dlrec::testing {

inline std::string find_redis_server() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

// A loopback port that was free a moment ago (the kernel's pick for port 0). Another process may
// take it before it is used: RedisServer::start checks the server it starts came up on it.
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

inline int connect_loopback(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

inline bool port_open(int port) {
  const int s = connect_loopback(port);
  if (s >= 0) ::close(s);
  return s >= 0;
}

// Sends one command (binary-safe arguments) to the Redis server on 127.0.0.1:port and returns
// its reply: a simple string, an integer's digits or a bulk string's bytes; an error reply as
// "-ERR ..."; "(nil)" for a nil bulk string; "" when there is no server or no complete reply
// within 2 s. Array replies are not read (the tests need none).
inline std::string redis_command(int port, const std::vector<std::string>& args) {
  const int s = connect_loopback(port);
  if (s < 0) return "";
  timeval tv{2, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string req = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args) req += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  std::string in;
  bool sent = ::send(s, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  for (char buf[4096]; sent;) {
    const size_t eol = in.find("\r\n");
    if (eol != std::string::npos) {
      if (in[0] != '$') {
        ::close(s);
        return in[0] == '-' ? in.substr(0, eol) : in.substr(1, eol - 1);
      }
      const long len = std::stol(in.substr(1, eol - 1));
      if (len < 0) {
        ::close(s);
        return "(nil)";
      }
      if (in.size() >= eol + 2 + static_cast<size_t>(len) + 2) {
        ::close(s);
        return in.substr(eol + 2, static_cast<size_t>(len));
      }
    }
    const ssize_t n = ::recv(s, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  ::close(s);
  return "";
}

// A redis-server on 127.0.0.1:port without persistence, stopped (SIGTERM, waited for) by stop()
// or at destruction.
class RedisServer {
 public:
  // Starts one on a free port: a port is picked, and when the server did not come up on it
  // (another process took the port between the pick and redis-server's bind), again on a fresh
  // port, up to 20 times. Null when none came up (the caller's ASSERT says so).
  static std::unique_ptr<RedisServer> start(const std::string& binary, const std::string& dir) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      auto server = std::make_unique<RedisServer>(binary, free_port(), dir);
      if (server->up()) return server;
    }
    return nullptr;
  }
  // Starts one on `port` (a restart on the port of one stopped before); up() says whether it
  // came up there.
  RedisServer(const std::string& binary, int port, const std::string& dir) : port_(port) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);  // its log lines stay out of the test's
      ::dup2(null, 1);
      ::dup2(null, 2);  // "Address already in use" on a lost port: start() retries
      const std::string p = std::to_string(port);
      ::execl(binary.c_str(), binary.c_str(), "--port", p.c_str(), "--bind", "127.0.0.1", "--save",
              "", "--appendonly", "no", "--dir", dir.c_str(), "--loglevel", "warning",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Until this server answers on the port, or it has exited (its bind failed).
    for (int i = 0; i < 500 && !up(); ++i) {
      if (exited()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  int port() const { return port_; }
  // Whether this process's redis-server answers on the port (not another process that holds it).
  bool up() const {
    if (pid_ <= 0) return false;
    const std::string info = redis_command(port_, {"INFO", "server"});
    return info.find("process_id:" + std::to_string(pid_) + "\r") != std::string::npos;
  }
  void stop() {
    if (pid_ <= 0) return;
    if (!exited()) {
      ::kill(pid_, SIGTERM);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    pid_ = -1;
  }

 private:
  bool exited() {  // reaps the child when it has exited
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) != pid_) return false;
    pid_ = -1;
    return true;
  }

  int port_;
  pid_t pid_ = -1;
};

}  // namespace dlrec::testing
