// Shared by the store tests: a redis-server of their own on a free loopback port.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

namespace dlrec::testing {

inline std::string find_redis_server() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

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

inline bool port_open(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

// A redis-server on 127.0.0.1:port without persistence, stopped (SIGTERM, waited for) by stop()
// or at destruction.
class RedisServer {
 public:
  RedisServer(const std::string& binary, int port, const std::string& dir) : port_(port) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);  // its log lines stay out of the test's
      ::dup2(null, 1);
      const std::string p = std::to_string(port);
      ::execl(binary.c_str(), binary.c_str(), "--port", p.c_str(), "--bind", "127.0.0.1", "--save",
              "", "--appendonly", "no", "--dir", dir.c_str(), "--loglevel", "warning",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 500 && !port_open(port); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~RedisServer() { stop(); }
  bool up() const { return port_open(port_); }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace dlrec::testing
