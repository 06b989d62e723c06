// KServe v2 HTTP/REST front end and the Prometheus metrics endpoint, on HttpServer
// (http_server.h: the connection handling, limits and timeouts).
#include <functional>

#include "dlrec/core/config.h"
#include "dlrec/serve/request_error.h"
#include "frontends.h"
#include "http_server.h"

namespace dlrec::serve {

namespace {

thread_local std::string t_request_error;

using Req = HttpRequest;
using Res = HttpResponse;

// Every JSON body goes out through dump_json_safe: a string from outside the program that is
// not valid UTF-8 must not make the serialisation throw (it did, and terminated the server).
void send_json(Res& res, int status, const json& j) {
  res.status = status;
  res.content_type = "application/json";
  res.body = dump_json_safe(j);
}

void send_error(Res& res, int status, const std::string& msg) {
  t_request_error = msg;
  send_json(res, status, {{"error", msg}});
}

// Runs a handler at the request boundary: every failure becomes a JSON error response.
template <class F>
void guarded(Res& res, F&& f) {
  try {
    f();
  } catch (...) {
    std::string msg;
    Status s = classify_current_exception(msg);
    send_error(res, http_status(s), msg);
  }
}

std::string match(const Req& req, size_t i) {
  return i < req.matches.size() ? req.matches[i] : std::string();
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
  json j = {{"name", s.name},
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
  // dlrec extension: the tiered store's hit rate per tier (summed over the instances).
  json tiers = json::object();
  for (const auto& [tier, hm] : s.store_hits_misses()) {
    const int64_t n = hm.first + hm.second;
    tiers[tier] = {{"hits", hm.first},
                   {"misses", hm.second},
                   {"hit_rate", n > 0 ? static_cast<double>(hm.first) / n : 0.0}};
  }
  if (!tiers.empty()) j["embedding_store"] = std::move(tiers);
  return j;
}

json tensors_json(const std::vector<TensorInfo>& ts) {
  json a = json::array();
  for (const auto& t : ts) a.push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}});
  return a;
}

// An optional JSON object body (repository endpoints); empty bodies are fine.
json optional_body(const Req& req) {
  if (req.body.empty()) return json::object();
  json j;
  try {
    j = parse_json(req.body, "the request body");
  } catch (const RequestError&) {
    throw;
  } catch (const Error& e) {
    request_fail(Status::InvalidArgument, e.what());
  }
  if (!j.is_object()) request_fail(Status::InvalidArgument, "the request body must be a JSON object");
  return j;
}

// Method + path template -> handler; the first match runs. A template is a path whose "*"
// segments match any one non-empty segment and are captured in order (req.matches[1..]); a
// model route is added twice, without and with "/versions/*" after the model name (an absent
// version is captured as ""). Plain segment comparison: std::regex backtracks recursively, and a
// long request path (up to the 16 KB head limit) used megabytes of a worker's stack.
class Router {
 public:
  using Handler = std::function<void(Req&, Res&)>;
  void add(const char* method, const std::string& pattern, Handler h) {
    routes_.push_back({method, split(pattern), -1, std::move(h)});
  }
  // `pattern` starts with "/v2/models/*"; also adds it with "/versions/*" after that.
  void add_model(const char* method, const std::string& pattern, Handler h) {
    std::vector<std::string> segs = split(pattern);
    routes_.push_back({method, segs, 3, h});
    segs.insert(segs.begin() + 3, {"versions", "*"});
    routes_.push_back({method, segs, -1, std::move(h)});
  }
  void operator()(Req& req, Res& res) const {
    t_request_error.clear();
    const std::vector<std::string> path = split(req.path);
    for (const auto& r : routes_) {
      if (req.method != r.method || path.size() != r.segments.size() || req.path.empty() ||
          req.path.back() == '/')
        continue;
      std::vector<std::string> caps = {req.path};
      bool ok = true;
      for (size_t i = 0; i < path.size() && ok; ++i) {
        if (r.segments[i] == "*") {
          ok = !path[i].empty();
          caps.push_back(path[i]);
        } else {
          ok = path[i] == r.segments[i];
        }
        if (static_cast<int>(i + 1) == r.empty_version_after) caps.push_back("");
      }
      if (!ok) continue;
      req.matches = std::move(caps);
      return r.handler(req, res);
    }
    send_error(res, 404, "no endpoint " + req.method + " " + req.path.substr(0, 200));
  }

 private:
  static std::vector<std::string> split(const std::string& path) {
    std::vector<std::string> out;
    size_t i = 1;  // after the leading '/'
    while (i <= path.size()) {
      size_t j = path.find('/', i);
      if (j == std::string::npos) j = path.size();
      out.push_back(path.substr(i, j - i));
      i = j + 1;
    }
    return out;
  }
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    int empty_version_after;  // >= 0: capture "" as the version after this many segments
    Handler handler;
  };
  std::vector<Route> routes_;
};

HttpServerLimits http_limits(const ServerOptions& o, int threads) {
  HttpServerLimits l;
  l.threads = threads;
  l.max_connections = o.http_max_connections;
  l.max_body_bytes = o.max_request_bytes;
  l.header_timeout_ms = o.http_header_timeout_ms;
  l.body_timeout_ms = o.http_body_timeout_ms;
  l.idle_timeout_ms = o.http_idle_timeout_ms;
  l.write_timeout_ms = o.http_write_timeout_ms;
  return l;
}

class HttpFrontend : public Frontend {
 public:
  explicit HttpFrontend(ServerCore& core) : core_(core) {
    routes();
    HttpLogger logger;
    if (core_.options.access_log)
      logger = [this](const Req& req, const Res& res, uint64_t ns) {
        core_.access_log("http", req.method, req.path, res.status, ns,
                         res.status >= 400 ? error_of(res) : std::string());
      };
    server_ = std::make_unique<HttpServer>(
        "HTTP", http_limits(core_.options, std::max(2, core_.options.http_threads)),
        [this](Req& req, Res& res) { router_(req, res); }, std::move(logger));
  }
  ~HttpFrontend() override { stop(); }

  void start() override { server_->start(core_.options.host, core_.options.http_port); }
  void begin_stop() override { server_->begin_stop(); }
  void stop() override { server_->stop(); }
  int port() const override { return server_->port(); }

 private:
  // The message of an error body (the handlers' own, or the server's refusals).
  static std::string error_of(const Res& res) {
    if (!t_request_error.empty()) return t_request_error;
    try {
      json j = parse_json(res.body, "error body");
      if (j.is_object() && j.contains("error") && j["error"].is_string()) return j["error"];
    } catch (...) {
    }
    return {};
  }

  // Inferences and model loads that arrive once stopping began are refused (as over gRPC).
  void refuse_if_stopping() const {
    if (server_->stopping()) request_fail(Status::Unavailable, "the server is shutting down");
  }

  void routes() {
    Router& r = router_;
    r.add("GET", "/v2/health/live", [](const Req&, Res& res) { send_json(res, 200, {{"live", true}}); });
    r.add("GET", "/v2/health/ready", [this](const Req&, Res& res) {
      if (core_.ready) send_json(res, 200, {{"ready", true}});
      else send_error(res, 503, "the server is not ready");
    });
    r.add("GET", "/v2", [](const Req&, Res& res) {
      send_json(res, 200,
                {{"name", "dlrec"},
                 {"version", "0.1.0"},
                 {"extensions",
                  {"binary_tensor_data", "statistics", "model_repository", "schedule_policy"}}});
    });
    r.add("GET", "/v2/models/stats", [this](const Req&, Res& res) {
      guarded(res, [&] {
        json a = json::array();
        for (const auto& s : core_.stats->list()) a.push_back(model_stats_json(*s));
        send_json(res, 200, {{"model_stats", a}});
      });
    });
    const std::string m = "/v2/models/*";
    r.add_model("GET", m + "/stats", [this](const Req& req, Res& res) {
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
    r.add_model("GET", m + "/ready", [this](const Req& req, Res& res) {
      guarded(res, [&] {
        core_.repository->get(match(req, 1), match(req, 2));
        send_json(res, 200, {{"ready", true}});
      });
    });
    r.add_model("GET", m, [this](const Req& req, Res& res) {
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
    r.add_model("POST", m + "/infer", [this](Req& req, Res& res) {
      guarded(res, [&] { infer(req, res); });
    });
    r.add("POST", "/v2/repository/index", [this](const Req& req, Res& res) {
      guarded(res, [&] {
        json body = optional_body(req);
        auto ready = body.find("ready");
        if (ready != body.end() && !ready->is_boolean())
          request_fail(Status::InvalidArgument, "'ready' must be true or false");
        const bool ready_only = ready != body.end() && ready->get<bool>();
        json a = json::array();
        for (const auto& e : core_.repository->index(ready_only)) {
          json x = {{"name", e.name}, {"state", e.state}, {"reason", e.reason}};
          if (!e.version.empty()) x["version"] = e.version;
          a.push_back(std::move(x));
        }
        send_json(res, 200, a);
      });
    });
    r.add("POST", "/v2/repository/models/*/*", [this](const Req& req, Res& res) {
      if (match(req, 2) != "load" && match(req, 2) != "unload")
        return send_error(res, 404, "no endpoint POST " + req.path.substr(0, 200));
      guarded(res, [&] {
        optional_body(req);
        if (match(req, 2) == "load") {
          refuse_if_stopping();
          core_.repository->load(match(req, 1));
        } else {
          core_.repository->unload(match(req, 1));
        }
        send_json(res, 200, json::object());
      });
    });
  }

  void infer(Req& req, Res& res) {
    refuse_if_stopping();
    std::string name = match(req, 1), version = match(req, 2);
    check_model_name(name);
    int64_t header_length = -1;
    if (const std::string* h = req.header("inference-header-content-length")) {
      char* end = nullptr;
      long long v = std::strtoll(h->c_str(), &end, 10);
      if (h->empty() || *end != '\0' || v < 0)
        request_fail(Status::InvalidArgument, "bad Inference-Header-Content-Length '",
                     h->substr(0, 40), "'");
      header_length = v;
    }
    auto model = core_.repository->get(name, version);
    InferRequest ir = parse_infer_request(req.body, header_length, core_.options.limits);
    ir.model = name;
    InferResponse resp = model->infer(ir);
    // The body and the converted inputs go before the response is formed (peak memory).
    InferRequest shape_of_answer;
    shape_of_answer.binary_output = ir.binary_output;
    shape_of_answer.outputs = std::move(ir.outputs);
    ir = InferRequest{};
    std::string().swap(req.body);
    HttpBody b = encode_infer_response(resp, shape_of_answer);
    if (b.header_length >= 0)
      res.headers.emplace_back("Inference-Header-Content-Length", std::to_string(b.header_length));
    res.status = 200;
    res.body = std::move(b.body);
    res.content_type = std::move(b.content_type);
  }

  ServerCore& core_;
  Router router_;
  std::unique_ptr<HttpServer> server_;
};

class MetricsFrontend : public Frontend {
 public:
  explicit MetricsFrontend(ServerCore& core) : core_(core) {
    HttpServerLimits l = http_limits(core_.options, 2);
    l.max_body_bytes = 65536;  // GET /metrics takes no body
    server_ = std::make_unique<HttpServer>("metrics", l, [this](Req& req, Res& res) {
      if (req.method != "GET" || req.path != "/metrics") {
        send_error(res, 404, "no endpoint " + req.method + " " + req.path.substr(0, 200));
        return;
      }
      res.status = 200;
      res.content_type = "text/plain; version=0.0.4";
      res.body = core_.stats->prometheus();
    });
  }
  ~MetricsFrontend() override { stop(); }
  void start() override { server_->start(core_.options.host, core_.options.metrics_port); }
  void begin_stop() override { server_->begin_stop(); }
  void stop() override { server_->stop(); }
  int port() const override { return server_->port(); }

 private:
  ServerCore& core_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace

std::unique_ptr<Frontend> make_http_frontend(ServerCore& core) {
  return std::make_unique<HttpFrontend>(core);
}
std::unique_ptr<Frontend> make_metrics_frontend(ServerCore& core) {
  return std::make_unique<MetricsFrontend>(core);
}

}  // namespace dlrec::serve
