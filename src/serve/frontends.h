// Front ends of serve::Server (private to the module).
#pragma once

#include <memory>

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

}  // namespace dlrec::serve
