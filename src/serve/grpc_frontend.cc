// KServe v2 gRPC front end: inference.GRPCInferenceService on gRPC's asynchronous server API.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

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

// The RPC handlers, each filling its response and returning the call's status. They run on the
// completion-queue threads of GrpcFrontend (below), one call at a time per thread.
class Handlers {
 public:
  explicit Handlers(ServerCore& core) : core_(core) {}

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
                          inference::ServerLiveResponse* r) {
    return guarded("ServerLive", [&] { r->set_live(true); });
  }
  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse* r) {
    return guarded("ServerReady", [&] { r->set_ready(core_.ready.load()); });
  }
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest* q,
                          inference::ModelReadyResponse* r) {
    return guarded("ModelReady", [&] {
      check_model_name(q->name());
      r->set_ready(core_.repository->ready(q->name(), q->version()));
    });
  }
  grpc::Status ServerMetadata(grpc::ServerContext*, const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse* r) {
    return guarded("ServerMetadata", [&] {
      r->set_name("dlrec");
      r->set_version("0.1.0");
      for (const char* e : {"binary_tensor_data", "statistics", "model_repository", "schedule_policy"})
        r->add_extensions(e);
    });
  }
  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest* q,
                             inference::ModelMetadataResponse* r) {
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
  // `req` is the calling slot's scratch, reused from call to call (its vectors and strings keep
  // their capacity); the input tensors point into the request message, which outlives it.
  grpc::Status ModelInfer(grpc::ServerContext*, const inference::ModelInferRequest* q,
                          inference::ModelInferResponse* r, InferRequest& req) {
    return guarded("ModelInfer", [&] {
      auto model = core_.repository->get(q->model_name(), q->model_version());
      req.model = q->model_name();
      req.version = q->model_version();
      req.id = q->id();
      req.storage.clear();
      const bool raw = q->raw_input_contents_size() > 0;
      if (raw && q->raw_input_contents_size() != q->inputs_size())
        request_fail(Status::InvalidArgument, "raw_input_contents has ",
                     q->raw_input_contents_size(), " entries for ", q->inputs_size(), " inputs");
      req.inputs.resize(static_cast<size_t>(q->inputs_size()));
      for (int i = 0; i < q->inputs_size(); ++i) {
        const auto& in = q->inputs(i);
        InputTensor& t = req.inputs[static_cast<size_t>(i)];
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
          t.data = q->raw_input_contents(i);  // in place: no copy of the tensor
          const int es = datatype_size(t.datatype);
          if (es > 0 && static_cast<int64_t>(t.data.size()) != count * es)
            request_fail(Status::InvalidArgument, "input '", t.name, "': ", t.data.size(),
                         " bytes of raw_input_contents; shape and ", t.datatype, " need ",
                         count * es);
        } else {
          req.storage.push_back(contents_to_wire(in.contents(), t.datatype, count, t.name));
          t.data = req.storage.back();
        }
      }
      req.outputs.resize(static_cast<size_t>(q->outputs_size()));
      for (int i = 0; i < q->outputs_size(); ++i) {
        req.outputs[static_cast<size_t>(i)].name = q->outputs(i).name();
        req.outputs[static_cast<size_t>(i)].binary = false;
      }
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
                               inference::ModelStatisticsResponse* r) {
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
                               inference::RepositoryIndexResponse* r) {
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
                                   inference::RepositoryModelLoadResponse*) {
    return guarded("RepositoryModelLoad", [&] { core_.repository->load(q->model_name()); });
  }
  grpc::Status RepositoryModelUnload(grpc::ServerContext*,
                                     const inference::RepositoryModelUnloadRequest* q,
                                     inference::RepositoryModelUnloadResponse*) {
    return guarded("RepositoryModelUnload", [&] { core_.repository->unload(q->model_name()); });
  }

 private:
  ServerCore& core_;
};

// --- the asynchronous server -------------------------------------------------------------------
//
// Completion queues (one by default), each served by one thread while the calls are quick: the
// thread waits in Next(), which polls the sockets itself, takes the next event (a new call, or
// a sent response), runs the handler and sends the response, so a call involves no hand-off
// between threads. (The synchronous server handed calls between two polling threads and
// created a completion queue per call.) A single thread per queue matters: gRPC passes the
// polling role between the threads waiting on a queue, a wake-up per event.
//
// More threads are needed when handlers block (an inference waiting in the batcher's queue or
// running a big batch, a model load) or when one thread cannot keep up (many clients). A
// monitor looks at each queue every kWindowMs and sets its target thread count: one more when
// no thread is free and none took an event in the window (stalled), or when the threads were
// busy in handlers more than 90 % of the window; one fewer when they were busy less than 50 %.
// Threads are added by the monitor (up to kMaxThreads over all queues); a thread beyond the
// target leaves after its next event (never a queue's first thread).

// A completion queue and its threads.
struct Queue {
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::mutex mu;  // guards `stopping` (no request after cq->Shutdown()) and `live`
  std::condition_variable done;  // `live` reached 0
  bool stopping = false;
  int live = 0;                   // threads running (detached; stop() waits for 0)
  std::atomic<int> idle{0};       // threads waiting in Next()
  std::atomic<int> running{0};    // threads running (what `live` is, readable without mu)
  std::atomic<int> target{1};     // threads wanted (set by the monitor)
  std::atomic<uint64_t> events{0};   // events taken so far (the monitor's sign of progress)
  std::atomic<uint64_t> busy_ns{0};  // time spent in handlers so far, all threads
};

class CallBase {
 public:
  virtual ~CallBase() = default;
  // Advances on the completion of the call's pending operation; false: delete the call.
  virtual bool proceed(bool ok) = 0;
};

struct NoScratch {};

using AsyncService = inference::GRPCInferenceService::AsyncService;

class GrpcFrontend;

// One slot for calls of one unary RPC on one queue: requested from the server, handled when a
// call arrives, finished, then requested again. The request and response messages (and the
// handler's scratch) are reused from call to call, so that a steady stream of calls allocates
// little.
template <class Req, class Resp, class Scratch = NoScratch>
class UnaryCall final : public CallBase {
 public:
  using RequestFn = void (AsyncService::*)(grpc::ServerContext*, Req*,
                                           grpc::ServerAsyncResponseWriter<Resp>*,
                                           grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                           void*);
  using Handle = grpc::Status (*)(Handlers&, grpc::ServerContext*, const Req&, Resp&, Scratch&);

  UnaryCall(GrpcFrontend& fe, Queue& q, RequestFn request, Handle handle)
      : fe_(fe), q_(q), request_(request), handle_(handle) {}

  // Asks the server for the next call; false when the queue is shutting down.
  bool arm();
  bool proceed(bool ok) override;

 private:
  GrpcFrontend& fe_;
  Queue& q_;
  RequestFn request_;
  Handle handle_;
  bool finishing_ = false;
  std::optional<grpc::ServerContext> ctx_;
  std::optional<grpc::ServerAsyncResponseWriter<Resp>> writer_;
  Req req_;
  Resp resp_;
  Scratch scratch_;
};

class GrpcFrontend : public Frontend {
 public:
  explicit GrpcFrontend(ServerCore& core) : core_(core), handlers_(core) {}
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
    const int n = std::max(1, o.grpc_threads);
    for (int i = 0; i < n; ++i) {
      queues_.push_back(std::make_unique<Queue>());
      queues_.back()->cq = b.AddCompletionQueue();
    }
    server_ = b.BuildAndStart();
    DLREC_CHECK(server_ && port_ > 0, "gRPC: cannot bind ", addr, " (in use, or not a local address)");
    for (auto& q : queues_) {
      arm_all(*q);
      std::lock_guard<std::mutex> lk(q->mu);
      add_thread(*q, true);
    }
    monitor_ = std::thread([this] { monitor(); });
  }

  void stop() override {
    if (!server_) return;
    // Finishes the calls in flight (up to 30 s; the queues' threads keep serving them), then
    // cancels what is left; requested calls complete with ok = false and are deleted.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stopping_ = true;
    for (auto& q : queues_) {
      std::lock_guard<std::mutex> lk(q->mu);
      q->stopping = true;
      q->cq->Shutdown();
    }
    monitor_.join();
    // The threads drain their queue (deleting the calls) and return; none is added any more.
    for (auto& q : queues_) {
      std::unique_lock<std::mutex> lk(q->mu);
      q->done.wait(lk, [&] { return q->live == 0; });
    }
    server_.reset();
    queues_.clear();
  }

  int port() const override { return port_; }

  Handlers& handlers() { return handlers_; }
  AsyncService& service() { return service_; }

 private:
  static constexpr int kMaxThreads = 1024;
  static constexpr int kWindowMs = 2;

  // One more thread on `q`; with q.mu held. `first`: the queue's own thread, which stays.
  void add_thread(Queue& q, bool first) {
    ++q.live;
    q.running.fetch_add(1, std::memory_order_relaxed);
    total_threads_.fetch_add(1, std::memory_order_relaxed);
    q.idle.fetch_add(1, std::memory_order_relaxed);  // counted free until it takes an event
    std::thread([this, &q, first] {
      void* tag = nullptr;
      bool ok = false;
      bool more = true;
      while (more && q.cq->Next(&tag, &ok)) {
        q.idle.fetch_sub(1, std::memory_order_relaxed);
        q.events.fetch_add(1, std::memory_order_relaxed);
        const uint64_t t0 = now_ns();
        auto* call = static_cast<CallBase*>(tag);
        if (!call->proceed(ok)) delete call;
        q.busy_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
        // Beyond the target, an extra thread leaves (not while stopping: then the queue must
        // be drained to its end by whoever is left, the first thread at least).
        more = first || stopping_.load(std::memory_order_relaxed) ||
               q.running.load(std::memory_order_relaxed) <= q.target.load(std::memory_order_relaxed);
        if (more) {
          q.idle.fetch_add(1, std::memory_order_relaxed);
        } else if (q.running.fetch_sub(1, std::memory_order_relaxed) <=
                   q.target.load(std::memory_order_relaxed)) {
          // Another extra thread left at the same time: stay after all.
          q.running.fetch_add(1, std::memory_order_relaxed);
          q.idle.fetch_add(1, std::memory_order_relaxed);
          more = true;
        }
      }
      if (more) q.running.fetch_sub(1, std::memory_order_relaxed);
      total_threads_.fetch_sub(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lk(q.mu);
      if (--q.live == 0) q.done.notify_all();
    }).detach();
  }

  // Every kWindowMs: sets each queue's target thread count from what its threads did in the
  // window and adds the threads the target asks for.
  void monitor() {
    std::vector<uint64_t> events(queues_.size(), 0), busy(queues_.size(), 0);
    const uint64_t window_ns = uint64_t{kWindowMs} * 1000000;
    uint64_t last = now_ns();
    while (!stopping_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kWindowMs));
      const uint64_t now = now_ns();
      const uint64_t elapsed = std::max<uint64_t>(now - last, window_ns);
      last = now;
      for (size_t i = 0; i < queues_.size(); ++i) {
        Queue& q = *queues_[i];
        const uint64_t ev = q.events.load(std::memory_order_relaxed);
        const uint64_t bz = q.busy_ns.load(std::memory_order_relaxed);
        const int running = q.running.load(std::memory_order_relaxed);
        const bool stalled = q.idle.load(std::memory_order_relaxed) == 0 && ev == events[i];
        const double use = static_cast<double>(bz - busy[i]) /
                           (static_cast<double>(elapsed) * std::max(running, 1));
        events[i] = ev;
        busy[i] = bz;
        int target = q.target.load(std::memory_order_relaxed);
        if (stalled || use > 0.9) target = std::max(target, running) + 1;
        else if (use < 0.5) target = std::max(1, std::min(target, running) - 1);
        q.target.store(target, std::memory_order_relaxed);
        if (running >= target || total_threads_.load(std::memory_order_relaxed) >= kMaxThreads)
          continue;
        std::lock_guard<std::mutex> lk(q.mu);
        if (!q.stopping) add_thread(q, false);
      }
    }
  }

  template <class Req, class Resp, class Scratch = NoScratch>
  void arm(Queue& q, int slots, typename UnaryCall<Req, Resp, Scratch>::RequestFn request,
           typename UnaryCall<Req, Resp, Scratch>::Handle handle) {
    for (int i = 0; i < slots; ++i) {
      auto* c = new UnaryCall<Req, Resp, Scratch>(*this, q, request, handle);
      if (!c->arm()) delete c;
    }
  }

  void arm_all(Queue& q);

  ServerCore& core_;
  Handlers handlers_;
  AsyncService service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::atomic<int> total_threads_{0};
  std::atomic<bool> stopping_{false};
  std::thread monitor_;
  int port_ = 0;
};

template <class Req, class Resp, class Scratch>
bool UnaryCall<Req, Resp, Scratch>::arm() {
  finishing_ = false;
  writer_.reset();
  ctx_.reset();  // a server context serves one call only
  ctx_.emplace();
  writer_.emplace(&*ctx_);
  req_.Clear();  // keeps the allocated fields for the next call
  resp_.Clear();
  std::lock_guard<std::mutex> lk(q_.mu);
  if (q_.stopping) return false;
  (fe_.service().*request_)(&*ctx_, &req_, &*writer_, q_.cq.get(), q_.cq.get(), this);
  return true;
}

template <class Req, class Resp, class Scratch>
bool UnaryCall<Req, Resp, Scratch>::proceed(bool ok) {
  if (finishing_) return arm();  // the response is sent (or the client went away): next call
  if (!ok) return false;         // the server is shutting down
  grpc::Status st = handle_(fe_.handlers(), &*ctx_, req_, resp_, scratch_);
  finishing_ = true;
  if (st.ok()) writer_->Finish(resp_, st, this);
  else writer_->FinishWithError(st, this);
  return true;
}

void GrpcFrontend::arm_all(Queue& q) {
  using namespace inference;
  using S = AsyncService;
  // Several ModelInfer slots per queue so that concurrent inferences are matched at once.
  arm<ModelInferRequest, ModelInferResponse, InferRequest>(
      q, 8, &S::RequestModelInfer,
      [](Handlers& h, grpc::ServerContext* c, const ModelInferRequest& q, ModelInferResponse& r,
         InferRequest& scratch) { return h.ModelInfer(c, &q, &r, scratch); });
#define DLREC_GRPC_ARM(RPC)                                                                    \
  arm<RPC##Request, RPC##Response>(                                                            \
      q, 2, &S::Request##RPC,                                                                  \
      [](Handlers& h, grpc::ServerContext* c, const RPC##Request& q, RPC##Response& r,         \
         NoScratch&) { return h.RPC(c, &q, &r); })
  DLREC_GRPC_ARM(ServerLive);
  DLREC_GRPC_ARM(ServerReady);
  DLREC_GRPC_ARM(ModelReady);
  DLREC_GRPC_ARM(ServerMetadata);
  DLREC_GRPC_ARM(ModelMetadata);
  DLREC_GRPC_ARM(ModelStatistics);
  DLREC_GRPC_ARM(RepositoryIndex);
  DLREC_GRPC_ARM(RepositoryModelLoad);
  DLREC_GRPC_ARM(RepositoryModelUnload);
#undef DLREC_GRPC_ARM
}

}  // namespace

std::unique_ptr<Frontend> make_grpc_frontend(ServerCore& core) {
  return std::make_unique<GrpcFrontend>(core);
}

}  // namespace dlrec::serve
