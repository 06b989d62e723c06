// KServe v2 HTTP/REST front end (cpp-httplib) and the Prometheus metrics endpoint.
#include <httplib.h>
#include <sys/socket.h>

#include <new>
#include <thread>

#include "dlrec/serve/request_error.h"
#include "frontends.h"

namespace dlrec::serve {

namespace {

thread_local uint64_t t_request_start = 0;
thread_local std::string t_request_error;

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& msg) {
  t_request_error = msg;
  send_json(res, status, {{"error", msg}});
}

// Runs a handler at the request boundary: every failure becomes a JSON error response.
template <class F>
void guarded(httplib::Response& res, F&& f) {
  try {
    f();
  } catch (...) {
    std::string msg;
    Status s = classify_current_exception(msg);
    send_error(res, http_status(s), msg);
  }
}

std::string match(const httplib::Request& req, size_t i) {
  return i < req.matches.size() ? req.matches[i].str() : std::string();
}

json duration(const Duration& d) { return {{"count", d.count.load()}, {"ns", d.ns.load()}}; }

json model_stats_json(const ModelStats& s) {
  json batches = json::array();
  for (const auto& [rows, cn] : s.batch_stats()) {
    json zero = {{"count", cn.first}, {"ns", 0}};
    batches.push_back({{"batch_size", rows},
                       {"compute_input", zero},
                       {"compute_infer", {{"count", cn.first}, {"ns", cn.second}}},
                       {"compute_output", zero}});
  }
  return {{"name", s.name},
          {"version", s.version},
          {"last_inference", s.last_inference_ms.load()},
          {"inference_count", s.inference_count.load()},
          {"execution_count", s.execution_count.load()},
          {"inference_stats",
           {{"success", duration(s.success)},
            {"fail", duration(s.fail)},
            {"queue", duration(s.queue)},
            {"compute_input", duration(s.compute_input)},
            {"compute_infer", duration(s.compute_infer)},
            {"compute_output", duration(s.compute_output)},
            {"cache_hit", {{"count", 0}, {"ns", 0}}},
            {"cache_miss", {{"count", 0}, {"ns", 0}}}}},
          {"batch_stats", std::move(batches)}};
}

json tensors_json(const std::vector<TensorInfo>& ts) {
  json a = json::array();
  for (const auto& t : ts) a.push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}});
  return a;
}

// An optional JSON object body (repository endpoints); empty bodies are fine.
json optional_body(const httplib::Request& req) {
  if (req.body.empty()) return json::object();
  json j = json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    request_fail(Status::InvalidArgument, "malformed JSON in the request body");
  return j;
}

class HttpFrontend : public Frontend {
 public:
  explicit HttpFrontend(ServerCore& core) : core_(core) { routes(); }
  ~HttpFrontend() override { stop(); }

  void start() override {
    const auto& o = core_.options;
    if (o.http_port == 0) {
      port_ = svr_.bind_to_any_port(o.host);
      DLREC_CHECK(port_ > 0, "HTTP: cannot bind ", o.host, " on any port");
    } else {
      DLREC_CHECK(svr_.bind_to_port(o.host, o.http_port), "HTTP: cannot bind ", o.host, ":",
                  o.http_port, " (in use, or not a local address)");
      port_ = o.http_port;
    }
    // cpp-httplib listens with a backlog of 5: a burst of new connections (64 clients starting
    // at once) overflows it and clients see resets. Listening again raises the backlog.
    if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    // stop() only works once the server runs; do not return before it does.
    for (int i = 0; i < 5000 && !svr_.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  void stop() override {
    if (thread_.joinable()) {
      svr_.stop();  // closes the listening socket; the pool finishes requests in flight
      thread_.join();
    }
  }

  int port() const override { return port_; }

 private:
  void routes() {
    const auto& o = core_.options;
    svr_.set_payload_max_length(static_cast<size_t>(o.max_request_bytes));
    const int threads = std::max(2, o.http_threads);
    svr_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    svr_.set_read_timeout(30, 0);
    svr_.set_tcp_nodelay(true);  // small responses must not wait for delayed ACKs (Nagle)
    // Keep connections open (cpp-httplib closes them after 5 requests by default): under load
    // that churn overflows its listen backlog of 5 and clients see resets and 1-2 s connects.
    svr_.set_keep_alive_max_count(size_t{1} << 30);
    svr_.set_socket_options([this](socket_t sock) {
      httplib::default_socket_options(sock);
      listen_fd_ = sock;  // the listening socket (start() raises its backlog)
    });
    svr_.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
      t_request_start = now_ns();
      t_request_error.clear();
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string msg;
      if (res.status == 413) msg = "the request body exceeds the server's maximum request size";
      else if (res.status == 404) msg = "no endpoint " + req.method + " " + req.path.substr(0, 200);
      else msg = "HTTP error " + std::to_string(res.status);
      send_error(res, res.status, msg);
    });
    svr_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string msg;
          try {
            std::rethrow_exception(ep);
          } catch (...) {
            send_error(res, http_status(classify_current_exception(msg)), msg);
          }
        });
    if (o.access_log) {
      svr_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
        core_.access_log("http", req.method, req.path, res.status, now_ns() - t_request_start,
                         t_request_error);
      });
    }

    using Req = httplib::Request;
    using Res = httplib::Response;
    svr_.Get("/v2/health/live", [](const Req&, Res& res) { send_json(res, 200, {{"live", true}}); });
    svr_.Get("/v2/health/ready", [this](const Req&, Res& res) {
      if (core_.ready) send_json(res, 200, {{"ready", true}});
      else send_error(res, 503, "the server is not ready");
    });
    svr_.Get("/v2", [](const Req&, Res& res) {
      send_json(res, 200,
                {{"name", "dlrec"},
                 {"version", "0.1.0"},
                 {"extensions",
                  {"binary_tensor_data", "statistics", "model_repository", "schedule_policy"}}});
    });
    svr_.Get("/v2/models/stats", [this](const Req&, Res& res) {
      guarded(res, [&] {
        json a = json::array();
        for (const auto& s : core_.stats->list()) a.push_back(model_stats_json(*s));
        send_json(res, 200, {{"model_stats", a}});
      });
    });
    const std::string m = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
    svr_.Get(m + "/stats", [this](const Req& req, Res& res) {
      guarded(res, [&] {
        std::string name = match(req, 1), version = match(req, 2);
        check_model_name(name);
        if (!version.empty()) core_.repository->get(name, version);  // NotFound if not loaded
        else if (core_.repository->loaded_versions(name).empty())
          request_fail(Status::NotFound, "model '", name, "' is not loaded");
        json a = json::array();
        for (const auto& s : core_.stats->list(name, version)) a.push_back(model_stats_json(*s));
        send_json(res, 200, {{"model_stats", a}});
      });
    });
    svr_.Get(m + "/ready", [this](const Req& req, Res& res) {
      guarded(res, [&] {
        core_.repository->get(match(req, 1), match(req, 2));
        send_json(res, 200, {{"ready", true}});
      });
    });
    svr_.Get(m, [this](const Req& req, Res& res) {
      guarded(res, [&] {
        std::string name = match(req, 1);
        auto model = core_.repository->get(name, match(req, 2));
        json versions = json::array();
        for (int64_t v : core_.repository->loaded_versions(name)) versions.push_back(std::to_string(v));
        send_json(res, 200,
                  {{"name", name},
                   {"versions", versions},
                   {"platform", "dlrec"},
                   {"inputs", tensors_json(model->raw_inputs())},
                   {"outputs", tensors_json(model->outputs())}});
      });
    });
    svr_.Post(m + "/infer", [this](const Req& req, Res& res) {
      guarded(res, [&] {
        std::string name = match(req, 1), version = match(req, 2);
        check_model_name(name);
        int64_t header_length = -1;
        if (req.has_header("Inference-Header-Content-Length")) {
          const std::string h = req.get_header_value("Inference-Header-Content-Length");
          char* end = nullptr;
          long long v = std::strtoll(h.c_str(), &end, 10);
          if (h.empty() || *end != '\0' || v < 0)
            request_fail(Status::InvalidArgument, "bad Inference-Header-Content-Length '",
                         h.substr(0, 40), "'");
          header_length = v;
        }
        auto model = core_.repository->get(name, version);
        InferRequest ir = parse_infer_request(req.body, header_length, core_.options.limits);
        ir.model = name;
        InferResponse resp = model->infer(ir);
        HttpBody b = encode_infer_response(resp, ir);
        if (b.header_length >= 0)
          res.set_header("Inference-Header-Content-Length", std::to_string(b.header_length));
        res.status = 200;
        res.set_content(std::move(b.body), b.content_type.c_str());
      });
    });
    svr_.Post("/v2/repository/index", [this](const Req& req, Res& res) {
      guarded(res, [&] {
        json body = optional_body(req);
        bool ready_only = body.value("ready", false);
        json a = json::array();
        for (const auto& e : core_.repository->index(ready_only)) {
          json x = {{"name", e.name}, {"state", e.state}, {"reason", e.reason}};
          if (!e.version.empty()) x["version"] = e.version;
          a.push_back(std::move(x));
        }
        send_json(res, 200, a);
      });
    });
    svr_.Post(R"(/v2/repository/models/([^/]+)/(load|unload))", [this](const Req& req, Res& res) {
      guarded(res, [&] {
        optional_body(req);
        if (match(req, 2) == "load") core_.repository->load(match(req, 1));
        else core_.repository->unload(match(req, 1));
        send_json(res, 200, json::object());
      });
    });
  }

  ServerCore& core_;
  httplib::Server svr_;
  std::thread thread_;
  int port_ = -1;
  int listen_fd_ = -1;
};

class MetricsFrontend : public Frontend {
 public:
  explicit MetricsFrontend(ServerCore& core) : core_(core) {
    svr_.new_task_queue = [] { return new httplib::ThreadPool(2); };
    svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(core_.stats->prometheus(), "text/plain; version=0.0.4");
    });
  }
  ~MetricsFrontend() override { stop(); }
  void start() override {
    const auto& o = core_.options;
    if (o.metrics_port == 0) {
      port_ = svr_.bind_to_any_port(o.host);
      DLREC_CHECK(port_ > 0, "metrics: cannot bind ", o.host, " on any port");
    } else {
      DLREC_CHECK(svr_.bind_to_port(o.host, o.metrics_port), "metrics: cannot bind ", o.host,
                  ":", o.metrics_port);
      port_ = o.metrics_port;
    }
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    // stop() only works once the server runs; do not return before it does.
    for (int i = 0; i < 5000 && !svr_.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void stop() override {
    if (thread_.joinable()) {
      svr_.stop();
      thread_.join();
    }
  }
  int port() const override { return port_; }

 private:
  ServerCore& core_;
  httplib::Server svr_;
  std::thread thread_;
  int port_ = -1;
};

}  // namespace

std::unique_ptr<Frontend> make_http_frontend(ServerCore& core) {
  return std::make_unique<HttpFrontend>(core);
}
std::unique_ptr<Frontend> make_metrics_frontend(ServerCore& core) {
  return std::make_unique<MetricsFrontend>(core);
}

}  // namespace dlrec::serve
