// Front ends of serve::Server (private to the module).
#pragma once

#include <memory>

#include "dlrec/serve/request_error.h"
#include "dlrec/serve/server.h"

namespace dlrec::serve {

class Frontend {
 public:
  virtual ~Frontend() = default;
  virtual void start() = 0;  // binds and serves on background threads; throws on bind failure
  // Called on every front end before any is stopped: refuse new work from now on (gRPC:
  // inferences and model loads), so that stop() drains. Default: nothing.
  virtual void begin_stop() {}
  virtual void stop() = 0;   // stops accepting, finishes requests in flight
  virtual int port() const = 0;
};

std::unique_ptr<Frontend> make_http_frontend(ServerCore& core);     // KServe v2 REST
std::unique_ptr<Frontend> make_metrics_frontend(ServerCore& core);  // GET /metrics
std::unique_ptr<Frontend> make_grpc_frontend(ServerCore& core);     // inference.GRPCInferenceService

// Converts the exception in flight into a status and message (RequestError keeps its status;
// other dlrec::Error -> InvalidArgument; anything else -> Internal).
Status classify_current_exception(std::string& message);

// Hands memory freed after a big request back to the system (glibc: malloc_trim). glibc raises
// its mmap threshold to the largest block freed (up to 32 MB), so the buffers of later big
// requests come from the heap and stay resident once freed; called after such a request.
void return_freed_memory();

}  // namespace dlrec::serve
