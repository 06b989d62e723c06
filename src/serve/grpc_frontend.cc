// KServe v2 gRPC front end: inference.GRPCInferenceService (synchronous gRPC server).
#include <grpcpp/grpcpp.h>

#include <cstring>

#include "dlrec/serve/request_error.h"
#include "frontends.h"
#include "grpc_service.grpc.pb.h"

namespace dlrec::serve {

namespace {

grpc::StatusCode grpc_code(Status s) {
  switch (s) {
    case Status::InvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case Status::NotFound: return grpc::StatusCode::NOT_FOUND;
    case Status::ResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case Status::Unavailable: return grpc::StatusCode::UNAVAILABLE;
    case Status::Internal: break;
  }
  return grpc::StatusCode::INTERNAL;
}

template <class T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof v);
  s.append(b, sizeof b);
}

// Typed contents -> the wire layout. Checks the element count against the shape.
std::string contents_to_wire(const inference::InferTensorContents& c, const std::string& dt,
                             int64_t count, const std::string& name) {
  std::string s;
  auto check = [&](int n) {
    if (n != count)
      request_fail(Status::InvalidArgument, "input '", name, "': contents hold ", n,
                   " elements; its shape needs ", count);
  };
  if (dt == "FP32") {
    check(c.fp32_contents_size());
    s.assign(reinterpret_cast<const char*>(c.fp32_contents().data()), sizeof(float) * count);
  } else if (dt == "FP64") {
    check(c.fp64_contents_size());
    s.assign(reinterpret_cast<const char*>(c.fp64_contents().data()), sizeof(double) * count);
  } else if (dt == "INT64") {
    check(c.int64_contents_size());
    s.assign(reinterpret_cast<const char*>(c.int64_contents().data()), sizeof(int64_t) * count);
  } else if (dt == "INT32") {
    check(c.int_contents_size());
    s.assign(reinterpret_cast<const char*>(c.int_contents().data()), sizeof(int32_t) * count);
  } else if (dt == "BYTES") {
    check(c.bytes_contents_size());
    for (const auto& b : c.bytes_contents()) {
      put<uint32_t>(s, static_cast<uint32_t>(b.size()));
      s += b;
    }
  } else {
    request_fail(Status::InvalidArgument, "input '", name, "': datatype ", dt.substr(0, 20),
                 " is not supported in typed contents (use raw_input_contents)");
  }
  return s;
}

class Service final : public inference::GRPCInferenceService::Service {
 public:
  explicit Service(ServerCore& core) : core_(core) {}

  template <class F>
  grpc::Status guarded(const char* rpc, F&& f) {
    const uint64_t t0 = now_ns();
    grpc::Status st = grpc::Status::OK;
    std::string msg;
    try {
      f();
    } catch (...) {
      Status s = classify_current_exception(msg);
      st = grpc::Status(grpc_code(s), msg);
    }
    if (core_.options.access_log)
      core_.access_log("grpc", "POST", std::string("/inference.GRPCInferenceService/") + rpc,
                       static_cast<int>(st.error_code()), now_ns() - t0, msg);
    return st;
  }

  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse* r) override {
    return guarded("ServerLive", [&] { r->set_live(true); });
  }
  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse* r) override {
    return guarded("ServerReady", [&] { r->set_ready(core_.ready.load()); });
  }
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest* q,
                          inference::ModelReadyResponse* r) override {
    return guarded("ModelReady", [&] {
      check_model_name(q->name());
      r->set_ready(core_.repository->ready(q->name(), q->version()));
    });
  }
  grpc::Status ServerMetadata(grpc::ServerContext*, const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse* r) override {
    return guarded("ServerMetadata", [&] {
      r->set_name("dlrec");
      r->set_version("0.1.0");
      for (const char* e : {"binary_tensor_data", "statistics", "model_repository", "schedule_policy"})
        r->add_extensions(e);
    });
  }
  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest* q,
                             inference::ModelMetadataResponse* r) override {
    return guarded("ModelMetadata", [&] {
      auto model = core_.repository->get(q->name(), q->version());
      r->set_name(q->name());
      for (int64_t v : core_.repository->loaded_versions(q->name()))
        r->add_versions(std::to_string(v));
      r->set_platform("dlrec");
      auto fill = [](const TensorInfo& t, inference::ModelMetadataResponse::TensorMetadata* m) {
        m->set_name(t.name);
        m->set_datatype(t.datatype);
        for (int64_t d : t.shape) m->add_shape(d);
      };
      for (const auto& t : model->raw_inputs()) fill(t, r->add_inputs());
      for (const auto& t : model->outputs()) fill(t, r->add_outputs());
    });
  }
  grpc::Status ModelInfer(grpc::ServerContext*, const inference::ModelInferRequest* q,
                          inference::ModelInferResponse* r) override {
    return guarded("ModelInfer", [&] {
      auto model = core_.repository->get(q->model_name(), q->model_version());
      InferRequest req;
      req.model = q->model_name();
      req.version = q->model_version();
      req.id = q->id();
      const bool raw = q->raw_input_contents_size() > 0;
      if (raw && q->raw_input_contents_size() != q->inputs_size())
        request_fail(Status::InvalidArgument, "raw_input_contents has ",
                     q->raw_input_contents_size(), " entries for ", q->inputs_size(), " inputs");
      for (int i = 0; i < q->inputs_size(); ++i) {
        const auto& in = q->inputs(i);
        InputTensor t;
        t.name = in.name();
        t.datatype = in.datatype();
        if (datatype_size(t.datatype) < 0)
          request_fail(Status::InvalidArgument, "input '", t.name, "': unknown datatype '",
                       t.datatype.substr(0, 20), "'");
        if (in.shape_size() > 8)
          request_fail(Status::InvalidArgument, "input '", t.name, "': more than 8 dimensions");
        t.shape.assign(in.shape().begin(), in.shape().end());
        const int64_t count =
            element_count(t.shape, t.name, core_.options.limits.max_tensor_elements);
        if (raw) {
          t.data = q->raw_input_contents(i);
          const int es = datatype_size(t.datatype);
          if (es > 0 && static_cast<int64_t>(t.data.size()) != count * es)
            request_fail(Status::InvalidArgument, "input '", t.name, "': ", t.data.size(),
                         " bytes of raw_input_contents; shape and ", t.datatype, " need ",
                         count * es);
        } else {
          req.storage.push_back(contents_to_wire(in.contents(), t.datatype, count, t.name));
          t.data = req.storage.back();
        }
        req.inputs.push_back(std::move(t));
      }
      for (const auto& o : q->outputs()) req.outputs.push_back({o.name(), false});
      InferResponse resp = model->infer(req);
      r->set_model_name(resp.model);
      r->set_model_version(resp.version);
      r->set_id(resp.id);
      auto* out = r->add_outputs();
      out->set_name("probability");
      out->set_datatype("FP32");
      out->add_shape(resp.rows);
      out->add_shape(1);
      r->add_raw_output_contents()->assign(reinterpret_cast<const char*>(resp.probability.data()),
                                           resp.probability.size() * sizeof(float));
    });
  }
  grpc::Status ModelStatistics(grpc::ServerContext*, const inference::ModelStatisticsRequest* q,
                               inference::ModelStatisticsResponse* r) override {
    return guarded("ModelStatistics", [&] {
      if (!q->name().empty()) {
        check_model_name(q->name());
        if (!q->version().empty()) core_.repository->get(q->name(), q->version());
        else if (core_.repository->loaded_versions(q->name()).empty())
          request_fail(Status::NotFound, "model '", q->name(), "' is not loaded");
      }
      for (const auto& s : core_.stats->list(q->name(), q->version())) {
        auto* m = r->add_model_stats();
        m->set_name(s->name);
        m->set_version(s->version);
        m->set_last_inference(s->last_inference_ms.load());
        m->set_inference_count(s->inference_count.load());
        m->set_execution_count(s->execution_count.load());
        auto set = [](inference::StatisticDuration* d, const Duration& x) {
          d->set_count(x.count.load());
          d->set_ns(x.ns.load());
        };
        auto* is = m->mutable_inference_stats();
        set(is->mutable_success(), s->success);
        set(is->mutable_fail(), s->fail);
        set(is->mutable_queue(), s->queue);
        set(is->mutable_compute_input(), s->compute_input);
        set(is->mutable_compute_infer(), s->compute_infer);
        set(is->mutable_compute_output(), s->compute_output);
        is->mutable_cache_hit();
        is->mutable_cache_miss();
        for (const auto& [rows, cn] : s->batch_stats()) {
          auto* b = m->add_batch_stats();
          b->set_batch_size(static_cast<uint64_t>(rows));
          b->mutable_compute_input()->set_count(cn.first);
          b->mutable_compute_infer()->set_count(cn.first);
          b->mutable_compute_infer()->set_ns(cn.second);
          b->mutable_compute_output()->set_count(cn.first);
        }
      }
    });
  }
  grpc::Status RepositoryIndex(grpc::ServerContext*, const inference::RepositoryIndexRequest* q,
                               inference::RepositoryIndexResponse* r) override {
    return guarded("RepositoryIndex", [&] {
      for (const auto& e : core_.repository->index(q->ready())) {
        auto* m = r->add_models();
        m->set_name(e.name);
        m->set_version(e.version);
        m->set_state(e.state);
        m->set_reason(e.reason);
      }
    });
  }
  grpc::Status RepositoryModelLoad(grpc::ServerContext*,
                                   const inference::RepositoryModelLoadRequest* q,
                                   inference::RepositoryModelLoadResponse*) override {
    return guarded("RepositoryModelLoad", [&] { core_.repository->load(q->model_name()); });
  }
  grpc::Status RepositoryModelUnload(grpc::ServerContext*,
                                     const inference::RepositoryModelUnloadRequest* q,
                                     inference::RepositoryModelUnloadResponse*) override {
    return guarded("RepositoryModelUnload", [&] { core_.repository->unload(q->model_name()); });
  }

 private:
  ServerCore& core_;
};

class GrpcFrontend : public Frontend {
 public:
  explicit GrpcFrontend(ServerCore& core) : core_(core), service_(core) {}
  ~GrpcFrontend() override { stop(); }

  void start() override {
    const auto& o = core_.options;
    grpc::ServerBuilder b;
    std::string addr = (o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host) +
                       ":" + std::to_string(o.grpc_port);
    b.AddListeningPort(addr, grpc::InsecureServerCredentials(), &port_);
    b.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(o.max_request_bytes, INT32_MAX)));
    b.SetMaxSendMessageSize(INT32_MAX);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    DLREC_CHECK(server_ && port_ > 0, "gRPC: cannot bind ", addr, " (in use, or not a local address)");
  }

  void stop() override {
    if (server_) {
      // Finishes the calls in flight (up to 30 s), then cancels what is left.
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(30));
      server_->Wait();
      server_.reset();
    }
  }

  int port() const override { return port_; }

 private:
  ServerCore& core_;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace

std::unique_ptr<Frontend> make_grpc_frontend(ServerCore& core) {
  return std::make_unique<GrpcFrontend>(core);
}

}  // namespace dlrec::serve
