#include "dlrec/serve/server.h"

#include <malloc.h>

#include <cstdio>
#include <ctime>
#include <new>

#include "dlrec/serve/request_error.h"
#include "frontends.h"

namespace dlrec::serve {

void return_freed_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

Status classify_current_exception(std::string& message) {
  try {
    throw;
  } catch (const RequestError& e) {
    message = e.what();
    return e.status();
  } catch (const Error& e) {
    message = e.what();
    return Status::InvalidArgument;
  } catch (const std::bad_alloc&) {
    message = "out of memory while serving the request";
    return Status::ResourceExhausted;
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
    return Status::Internal;
  } catch (...) {
    message = "internal error";
    return Status::Internal;
  }
}

void ServerCore::access_log(const std::string& proto, const std::string& method,
                            const std::string& path, int status, uint64_t duration_ns,
                            const std::string& error) const {
  json j = {{"ts_ms", wall_ms()},
            {"proto", proto},
            {"method", method},
            {"path", path.substr(0, 512)},
            {"status", status},
            {"duration_us", duration_ns / 1000}};
  if (!error.empty()) j["error"] = error.substr(0, 512);
  std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lk(log_mu_);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

struct Server::Impl {
  ServerCore core;
  std::unique_ptr<Frontend> http, grpc, metrics;
  bool started = false;
};

Server::Server(ServerOptions options) : impl_(new Impl) {
  impl_->core.options = std::move(options);
  impl_->core.stats = std::make_shared<StatsRegistry>();
}

Server::~Server() { stop(); }

ServerCore& Server::core() { return impl_->core; }

void Server::start() {
  ServerCore& c = impl_->core;
  const ServerOptions& o = c.options;
  DLREC_CHECK(!impl_->started, "the server is already started");
  DLREC_CHECK(o.max_request_bytes > 0, "the maximum request size must be positive");
  c.repository = std::make_unique<ModelRepository>(o.model_repository, o.batching, c.stats);
  std::vector<std::string> errors = c.repository->load_all();
  for (const auto& e : errors) std::fprintf(stderr, "dlrec serve: model not loaded: %s\n", e.c_str());
  DLREC_CHECK(!o.strict_startup || errors.empty(), "models failed to load (strict start-up)");
  impl_->started = true;
#ifdef __GLIBC__
  // Big request buffers (bodies, tensors, gRPC scratch) are mapped and unmapped on their own
  // from 1 MB. By default glibc raises its mmap threshold to the largest block freed (up to
  // 32 MB) and the heap trim threshold to twice that, so after one big request the next ones
  // come from the threads' heaps, whose free tops (up to 64 MB each) stay resident: the soak saw
  // ~50 MB kept per HTTP worker that had served a big body. Setting the thresholds turns that
  // adjustment off (process-wide: the server owns the process).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
#endif
  if (o.http_port >= 0) {
    impl_->http = make_http_frontend(c);
    impl_->http->start();
  }
  if (o.grpc_port >= 0) {
    impl_->grpc = make_grpc_frontend(c);
    impl_->grpc->start();
  }
  if (o.metrics_port >= 0) {
    impl_->metrics = make_metrics_frontend(c);
    impl_->metrics->start();
  }
  c.ready = true;
}

void Server::stop() {
  if (!impl_ || !impl_->started) return;
  // New work is refused from here on (before readiness goes: a client that sees the server not
  // ready also sees the refusals). Front ends first (they finish their requests in flight),
  // then the models.
  for (auto* f : {impl_->http.get(), impl_->grpc.get(), impl_->metrics.get()})
    if (f) f->begin_stop();
  impl_->core.ready = false;
  if (impl_->http) impl_->http->stop();
  if (impl_->grpc) impl_->grpc->stop();
  if (impl_->metrics) impl_->metrics->stop();
  impl_->http.reset();
  impl_->grpc.reset();
  impl_->metrics.reset();
  impl_->core.repository.reset();
  impl_->started = false;
}

int Server::http_port() const { return impl_->http ? impl_->http->port() : -1; }
int Server::grpc_port() const { return impl_->grpc ? impl_->grpc->port() : -1; }
int Server::metrics_port() const { return impl_->metrics ? impl_->metrics->port() : -1; }

}  // namespace dlrec::serve
