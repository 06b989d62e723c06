// serve::Server: the model repository behind KServe v2 front ends (HTTP/REST and gRPC) and a
// Prometheus metrics endpoint, each on its own port. docs/SERVING.md describes the endpoints,
// the tensor contract, limits and error codes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "dlrec/serve/http_codec.h"
#include "dlrec/serve/model_repository.h"
#include "dlrec/serve/stats.h"

namespace dlrec::serve {

struct ServerOptions {
  std::string model_repository;
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int http_port = 8000;            // < 0 disables the endpoint
  int grpc_port = 8001;
  int metrics_port = 8002;
  // HTTP workers run complete requests only: connections are read by one event-loop thread,
  // so idle and slow clients hold no worker (docs/SERVING.md, "Connections and timeouts").
  int http_threads = 16;
  int http_max_connections = 1024;     // open HTTP connections; beyond: 503 and closed
  int http_header_timeout_ms = 10000;  // first byte of a request to the end of its headers
  int http_body_timeout_ms = 60000;    // end of the headers to the end of the body
  int http_idle_timeout_ms = 30000;    // a keep-alive connection with no request is closed
  int http_write_timeout_ms = 30000;   // sending one response
  // gRPC completion queues, each with one polling thread that receives the calls, reads small
  // inferences itself and hands big ones to the parse threads (below), never waiting for them
  // (docs/SERVING.md). One is the fastest for single calls: with several, gRPC hands events
  // between the polling threads (batch-1 p99 +70 us on the H100 host).
  int grpc_threads = 1;
  // A gRPC inference of fewer rows may be scored on the polling thread when it finds an
  // instance idle and no queue delay (no hand-off); bigger ones always go to a batcher worker.
  int64_t grpc_inline_max_rows = 1024;
  // Microseconds a gRPC polling thread keeps polling without sleeping after each event (0: it
  // sleeps at once). Saves the wake-up of a sleeping thread when calls come close together, at
  // the price of that much CPU per event.
  int grpc_spin_us = 0;
  // Threads that read, encode and submit big gRPC inferences (of at least grpc_parse_min_bytes
  // bytes) instead of the polling threads, which then only receive bytes; 0: the polling
  // threads do it all. Smaller requests stay on the polling thread (no hand-off).
  int grpc_parse_threads = 2;
  int64_t grpc_parse_min_bytes = 65536;
  int64_t max_request_bytes = int64_t{64} << 20;
  HttpLimits limits;
  BatchingConfig batching;  // defaults for models whose config.json leaves them out
  bool access_log = false;  // one JSON line per request on stderr
  bool strict_startup = false;  // fail start() when a model does not load
};

// What both front ends share.
struct ServerCore {
  ServerOptions options;
  std::shared_ptr<StatsRegistry> stats;
  std::unique_ptr<ModelRepository> repository;
  std::atomic<bool> ready{false};
  void access_log(const std::string& proto, const std::string& method, const std::string& path,
                  int status, uint64_t duration_ns, const std::string& error) const;

 private:
  mutable std::mutex log_mu_;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // stops
  // Loads the repository and starts the endpoints (ports 0 pick free ports). Throws
  // dlrec::Error when an endpoint cannot bind.
  void start();
  // Stops accepting, finishes the requests in flight, then returns. Idempotent.
  void stop();
  int http_port() const;  // the bound ports (useful with port 0)
  int grpc_port() const;
  int metrics_port() const;
  ServerCore& core();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrec::serve
