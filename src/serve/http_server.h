// A small HTTP/1.1 server for the serving front ends (private to the module).
//
// One event-loop thread owns every connection: it accepts, reads request heads and bodies
// without blocking, enforces the limits and deadlines below, and hands each complete request to
// a pool of worker threads, which run the handler and write the response. An idle, slow or
// half-sent connection therefore costs a file descriptor and its buffered bytes, never a worker
// (cpp-httplib gave each connection a worker for its whole life: 16 idle keep-alive connections
// delayed every request by seconds, and a few hundred trickling ones starved the health checks).
//
// What a request may be, and what each violation is answered with (the connection is then
// closed after the answer, reading and discarding what the client still sends for up to two
// seconds so that the answer is not destroyed by a TCP reset):
//   request line or headers malformed, not UTF-8, or with control bytes      400
//   path with a bad %-escape, or decoding to invalid UTF-8 or NUL            400
//   both Content-Length and Transfer-Encoding, or conflicting lengths        400
//   head (request line + headers) over max_header_bytes                      431
//   body (Content-Length or the sum of the chunks) over max_body_bytes       413
//   head not complete within header_timeout_ms of its first byte             408
//   body not complete within body_timeout_ms of the end of the head          408
//   a transfer coding other than chunked                                     501
//   an HTTP version other than 1.0 / 1.1                                     505
//   a connection beyond max_connections                                      503 (then closed)
// A keep-alive connection that sends nothing for idle_timeout_ms is closed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dlrec::serve {

struct HttpServerLimits {
  int threads = 16;            // workers running handlers
  int max_connections = 1024;  // open connections (each costs a descriptor)
  int64_t max_body_bytes = int64_t{64} << 20;
  int64_t max_header_bytes = 16384;  // request line + headers (+ chunked trailers)
  int header_timeout_ms = 10000;
  int body_timeout_ms = 60000;
  int idle_timeout_ms = 30000;   // keep-alive wait for the next request
  int write_timeout_ms = 30000;  // sending one response
  int stop_grace_ms = 5000;      // at stop: how long a half-received request may finish
};

struct HttpRequest {
  std::string method;  // as sent (methods are case-sensitive)
  std::string path;    // %-decoded, valid UTF-8
  std::string query;   // after '?', as sent
  int minor_version = 1;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::vector<std::string> matches;  // set by the router (regex groups)

  // The value of the first header named `lower_name` (lower case), or null.
  const std::string* header(const std::string& lower_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// Runs a request; exceptions it lets through become a 500 (the server survives them).
using HttpHandler = std::function<void(HttpRequest&, HttpResponse&)>;
// Called after every response that was sent or attempted, the server's own errors included
// (then `req` may be partly filled: its method and path may be empty).
using HttpLogger = std::function<void(const HttpRequest&, const HttpResponse&, uint64_t ns)>;

class HttpServer {
 public:
  // `name` names the threads and the errors ("HTTP", "metrics").
  HttpServer(std::string name, HttpServerLimits limits, HttpHandler handler,
             HttpLogger logger = {});
  ~HttpServer();  // stops
  // Binds host:port (0: any free port) and starts the threads. Throws dlrec::Error naming the
  // address when it cannot bind.
  void start(const std::string& host, int port);
  int port() const;
  // From now on every response closes its connection, idle connections are closed and the
  // listening socket too; half-received requests get stop_grace_ms to arrive.
  void begin_stop();
  bool stopping() const;
  // begin_stop, then waits for the requests in flight to be answered and every connection to
  // be closed. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A request head, read (http_request_head.cc). refusal_status != 0: refused with that status
// and message; the fields below are then unspecified.
struct RequestHead {
  int refusal_status = 0;
  std::string refusal;
  bool chunked = false;
  int64_t content_length = -1;  // -1: none
  bool keep_alive = true;
  bool expect_continue = false;
};
// Parses `head` (request line, header fields, the empty line) into req's method, path, query,
// version and headers.
RequestHead parse_request_head(const std::string& head, HttpRequest& req);

// Percent-decodes a request path; false (and `out` unspecified) for a bad escape, a NUL byte
// or bytes that are not valid UTF-8.
bool decode_request_path(const std::string& raw, std::string& out);
// True when `s` is valid UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool valid_utf8(const char* s, size_t n);

}  // namespace dlrec::serve
