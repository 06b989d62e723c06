// KServe v2 gRPC front end: inference.GRPCInferenceService on gRPC's asynchronous server API.
#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <optional>
#include <type_traits>
#include <thread>
#include <vector>

#include "dlrec/serve/grpc_poll.h"
#include "dlrec/serve/infer_wire.h"
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

// ModelInfer's scratch, one per call slot, reused from call to call (no allocation per request
// once the buffers have grown): the request's slices and what was read from them, the encoded
// request the batcher scores in place, the model it runs on (kept alive until the slot is
// re-armed, on the queue's thread: the last reference must not go on a worker, whose batcher
// it would destroy) and the start time for the access log.
struct InferScratch {
  std::vector<grpc::Slice> slices;  // the request's bytes as received (references, no copy)
  std::vector<WireSegment> segments;
  InferWireScratch wire;
  std::unique_ptr<inference::ModelInferRequest> proto;  // messages left to protobuf
  InferRequest req;
  std::vector<std::string_view> raw;
  io::Batch batch;
  std::shared_ptr<ServedModel> model;
  uint64_t t0 = 0;

  // Bytes the reusable buffers hold (their capacity).
  size_t retained_bytes() const {
    size_t n = batch.labels.capacity() * sizeof(float) + batch.dense.capacity() * sizeof(float);
    for (const auto& v : batch.cat_offsets) n += v.capacity() * sizeof(int64_t);
    for (const auto& v : batch.cat_indices) n += v.capacity() * sizeof(int64_t);
    for (const auto& g : wire.gathered) n += g.capacity();
    for (const auto& g : req.storage) n += g.capacity();
    if (proto) n += proto->SpaceUsedLong();
    return n;
  }
  // After a call: buffers grown past kKeepBytes by a big request are released (a slot keeps
  // them otherwise, and with up to 64 slots per queue 16 clients of 17 MB requests left 1.37 GB
  // resident); below it they stay, so that steady small traffic allocates nothing.
  static constexpr size_t kKeepBytes = size_t{1} << 20;
  bool release_if_large() {
    if (retained_bytes() <= kKeepBytes) return false;
    batch = io::Batch{};
    wire = InferWireScratch{};
    proto.reset();
    req = InferRequest{};
    std::vector<std::string_view>().swap(raw);
    return true;
  }
};

// The RPC handlers, each filling its response and returning the call's status. They run on the
// completion-queue threads of GrpcFrontend (below), one call at a time per thread, except
// ModelInfer (read there or on a parse thread, finished where it is scored) and the
// repository's load and unload (on a thread of their own).
class Handlers {
 public:
  explicit Handlers(ServerCore& core) : core_(core) {}

  // Runs a handler body; the call's status (OK, or what it threw), logged.
  template <class F>
  grpc::Status guarded(const char* rpc, F&& f) {
    const uint64_t t0 = now_ns();
    try {
      f();
    } catch (...) {
      return failed(rpc, t0);
    }
    log(rpc, t0, grpc::Status::OK);
    return grpc::Status::OK;
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
  // ModelInfer, first half (on a completion-queue thread): reads the request from its bytes
  // into `s.req` (the calling slot's scratch, reused from call to call: its vectors and strings
  // keep their capacity) and finds the model. The wire reader takes the usual messages straight
  // from the received slices; what it leaves to protobuf (infer_wire.h) is parsed into
  // `s.proto`. The input tensors point into the slices, `s.wire` or `s.proto`, which stay until
  // the slot is re-armed. Throws RequestError.
  std::shared_ptr<ServedModel> parse_infer(const grpc::ByteBuffer& bytes, InferScratch& s);
  // ModelInfer, second half (on the thread that scored the request): the response message,
  // written straight into one slice.
  static void fill_infer(const InferResponse& resp, grpc::ByteBuffer* out) {
    grpc::Slice slice(infer_response_size(resp));
    write_infer_response(resp, reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin())));
    grpc::ByteBuffer b(&slice, 1);
    out->Swap(&b);
  }
  // The status of the exception in flight; logs the call when the access log is on.
  grpc::Status failed(const char* rpc, uint64_t t0) {
    try {
      std::string msg;
      grpc::Status st(grpc_code(classify_current_exception(msg)), msg);
      log(rpc, t0, st);
      return st;
    } catch (...) {  // forming the error failed too (out of memory): still an answer
      return grpc::Status(grpc::StatusCode::INTERNAL, "internal error");
    }
  }
  // A call that arrived after stop() began and would start work (an inference, a model load):
  // refused, so that the drain ends.
  grpc::Status refused(const char* rpc) {
    grpc::Status st(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
    log(rpc, now_ns(), st);
    return st;
  }
  void log(const char* rpc, uint64_t t0, const grpc::Status& st) {
    if (core_.options.access_log)
      core_.access_log("grpc", "POST", std::string("/inference.GRPCInferenceService/") + rpc,
                       static_cast<int>(st.error_code()), now_ns() - t0, st.error_message());
  }
  int64_t inline_max_rows() const { return core_.options.grpc_inline_max_rows; }

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
// Completion queues (one by default), each served by one thread: the thread waits in Next(),
// which polls the sockets itself, takes the next event (a new call, or a sent response), runs
// the handler and sends the response, so a quick call involves no hand-off between threads.
// One thread per queue matters: gRPC would pass the polling role between several threads
// waiting on a queue, a wake-up per event.
//
// No handler waits on this thread (a small inference may run on it, see below). ModelInfer
// arrives as raw bytes; a small message is read here (infer_wire.h) and submitted to the
// model's batcher (ServedModel::infer_async), a big one (--grpc-parse-bytes) is handed to a
// parse thread (ParsePool) that does the same, so that this thread only receives bytes. The
// thread that scores the request (a batcher worker) fills the response and calls Finish,
// which gRPC allows from any thread. A small request that finds an instance idle (no queue
// delay) is scored right here, which is what gives batch-1 its latency; a big one
// (--grpc-inline-rows) goes to a worker, so the next calls are read while it runs. Model load
// and unload run on a thread of their own. Each call slot keeps its messages and scratch until
// its Finish has completed; then it is re-armed.
//
// Stopping (GrpcFrontend::stop) drains before it shuts the gRPC server down: new inferences
// and model loads are refused (UNAVAILABLE) while the calls in flight finish, and only once
// every Finish has completed (the response is in the transport's output, ahead of anything
// queued later) does grpc::Server::Shutdown send its GOAWAY and PING. gRPC closes a connection
// as soon as its last stream has been written to the socket after the final GOAWAY, and that
// GOAWAY goes out once the client has acknowledged the PING; the client acknowledges it only
// after reading every byte before it, so every answer has reached the client before its
// connection closes. Shutting down first (GOAWAY and PING at once, the answers later) let the
// connection close, and the process exit, right after the last answers were written to the
// socket: a client that had not read them yet (a loaded machine) got a TCP reset instead, and
// its calls UNAVAILABLE ("Stream removed ... Connection reset by peer").

class GrpcFrontend;

// The armed (waiting) slots of one RPC on one queue; touched only by the queue's thread (and
// start()). A queue keeps between `min` and `max` slots armed: when a call leaves fewer than
// `min` waiting, one more is armed; a finished slot is deleted when `max` are armed already. So slots
// grow with the calls in flight (ModelInfer may have many waiting in the batcher) and shrink
// back when they end.
struct Slots {
  int armed = 0;
  int min = 1, max = 2;
};

// A completion queue and its thread.
struct Queue {
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::thread thread;
  std::mutex mu;          // guards `stopping` (no request after cq->Shutdown())
  bool stopping = false;
  std::vector<Slots> slots;  // per RPC, in arm_all's order
};

class CallBase {
 public:
  virtual ~CallBase() = default;
  // Advances on the completion of the call's pending operation; false: delete the call.
  virtual bool proceed(bool ok) = 0;
};

struct NoScratch {};


// Every RPC asynchronous; ModelInfer "raw": its request and response are byte buffers, which
// the front end reads and writes itself (infer_wire.h).
using AsyncService = inference::GRPCInferenceService::WithRawMethod_ModelInfer<
    inference::GRPCInferenceService::AsyncService>;

// One slot for calls of one unary RPC on one queue: requested from the server, handled when a
// call arrives, finished, then requested again (or deleted, see Slots). The request and
// response messages (and the handler's scratch) are reused from call to call, so that a steady
// stream of calls allocates little.
template <class Req, class Resp, class Scratch = NoScratch>
class UnaryCall final : public CallBase {
 public:
  using RequestFn = void (AsyncService::*)(grpc::ServerContext*, Req*,
                                           grpc::ServerAsyncResponseWriter<Resp>*,
                                           grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                           void*);
  // Starts handling the call that arrived; calls finish() once, now or later, on any thread.
  using Handle = void (*)(GrpcFrontend&, UnaryCall&);

  UnaryCall(GrpcFrontend& fe, Queue& q, Slots& slots, RequestFn request, Handle handle)
      : fe_(fe), q_(q), slots_(slots), request_(request), handle_(handle) {}

  // Asks the server for the next call; false when the queue is shutting down.
  bool arm();
  bool proceed(bool ok) override;
  // Sends the response (status OK) or the error. The slot's messages and scratch stay as they
  // are until the send completes on the queue's thread.
  void finish(const grpc::Status& st);

  GrpcFrontend& frontend() { return fe_; }
  // The front end was stopping when this call arrived: inferences and model loads are refused.
  bool arrived_while_stopping() const { return arrived_while_stopping_; }
  const Req& req() const { return req_; }
  Resp& resp() { return resp_; }
  Scratch& scratch() { return scratch_; }

 private:
  GrpcFrontend& fe_;
  Queue& q_;
  Slots& slots_;
  RequestFn request_;
  Handle handle_;
  bool finishing_ = false;
  bool arrived_while_stopping_ = false;
  std::optional<grpc::ServerContext> ctx_;
  std::optional<grpc::ServerAsyncResponseWriter<Resp>> writer_;
  Req req_;
  Resp resp_;
  Scratch scratch_;
};

// Threads that read big ModelInfer requests off the completion-queue threads
// (ServerOptions::grpc_parse_threads): the queue's thread then only receives the bytes and
// hands the call over; reading, encoding and submitting it (ModelInfer's first half) run here,
// in parallel. Small requests never come here (no hand-off on the batch-1 path).
class ParsePool {
 public:
  void start(int threads) {
    for (int i = 0; i < threads; ++i)
      threads_.emplace_back([this, i] {
#ifdef __linux__
        pthread_setname_np(pthread_self(), ("grpc-parse" + std::to_string(i)).substr(0, 15).c_str());
#endif
        run();
      });
  }
  bool active() const { return !threads_.empty(); }
  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Runs what was posted, then joins the threads.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping and drained
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
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
    // gRPC binds with SO_REUSEPORT by default: a second server on the same port would start
    // and silently share the connections. Off, binding a port in use fails (below).
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    b.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(o.max_request_bytes, INT32_MAX)));
    b.SetMaxSendMessageSize(INT32_MAX);
    b.RegisterService(&service_);
    const int n = std::max(1, o.grpc_threads);
    for (int i = 0; i < n; ++i) {
      queues_.push_back(std::make_unique<Queue>());
      queues_.back()->cq = b.AddCompletionQueue();
      queues_.back()->slots.resize(kRpcs);
    }
    server_ = b.BuildAndStart();
    DLREC_CHECK(server_ && port_ > 0, "gRPC: cannot bind ", addr, " (in use, or not a local address)");
    parse_pool_.start(std::max(0, o.grpc_parse_threads));
    for (auto& q : queues_) arm_all(*q);
    const auto spin = std::chrono::microseconds(std::max(0, o.grpc_spin_us));
    for (size_t i = 0; i < queues_.size(); ++i)
      queues_[i]->thread = std::thread([qp = queues_[i].get(), i, spin] {
#ifdef __linux__
        // Named for top -H / perf: is the queue's thread the bottleneck?
        pthread_setname_np(pthread_self(), ("grpc-cq" + std::to_string(i)).substr(0, 15).c_str());
#endif
        void* tag = nullptr;
        bool ok = false;
        while (next_event(*qp->cq, spin, &tag, &ok)) {
          auto* call = static_cast<CallBase*>(tag);
          if (!call->proceed(ok)) delete call;
        }
      });
  }

  // New inferences and model loads are refused from now on (UNAVAILABLE).
  void begin_stop() override {
    std::lock_guard<std::mutex> lk(active_mu_);
    stopping_ = true;
  }

  void stop() override {
    if (!server_) return;
    // Drains first (see above): the calls in flight finish (up to 30 s; the queues' threads
    // and the batchers' workers keep serving them, new inferences and loads are refused) and
    // their responses are handed to the transport, ahead of the GOAWAY and PING of Shutdown.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    {
      std::unique_lock<std::mutex> lk(active_mu_);
      stopping_ = true;
      active_cv_.wait_until(lk, deadline, [&] { return active_ == 0; });
    }
    // Then the connections close once their clients have acknowledged the PING (gRPC waits
    // up to 20 s for it). At the deadline (at least 10 s from now, for that acknowledgement)
    // what is left is cancelled; requested calls complete with ok = false and are deleted.
    const auto grace = std::max<std::chrono::steady_clock::duration>(
        deadline - std::chrono::steady_clock::now(), std::chrono::seconds(10));
    server_->Shutdown(std::chrono::system_clock::now() + grace);
    // A call cancelled at the deadline may still be in a batcher or a model load: its Finish
    // must come (and complete) before the queue shuts down.
    {
      std::unique_lock<std::mutex> lk(active_mu_);
      active_cv_.wait(lk, [&] { return active_ == 0; });
    }
    parse_pool_.stop();  // idle now: every call it was given has finished
    for (auto& q : queues_) {
      std::lock_guard<std::mutex> lk(q->mu);
      q->stopping = true;
      q->cq->Shutdown();
    }
    // The threads drain their queue (deleting the calls) and return.
    for (auto& q : queues_) q->thread.join();
    server_.reset();
    queues_.clear();
  }

  int port() const override { return port_; }

  Handlers& handlers() { return handlers_; }
  // ModelInfer requests of at least this many bytes go to the parse pool, when it has threads.
  bool parse_elsewhere(size_t bytes) const {
    return parse_pool_.active() &&
           static_cast<int64_t>(bytes) >= core_.options.grpc_parse_min_bytes;
  }
  ParsePool& parse_pool() { return parse_pool_; }
  AsyncService& service() { return service_; }

  // Calls between their start and the completion of their Finish (stop() waits for none).
  // call_started returns whether the front end is stopping (under the same lock as stop()'s
  // check of the count: a call either counts before the drain looks, or sees it).
  bool call_started() {
    std::lock_guard<std::mutex> lk(active_mu_);
    ++active_;
    return stopping_;
  }
  void call_finished() {
    std::lock_guard<std::mutex> lk(active_mu_);
    if (--active_ == 0) active_cv_.notify_all();  // under the lock: stop() may be waiting
  }

 private:
  // Slots index per RPC (arm_all); ModelInfer first.
  static constexpr int kRpcs = 10;

  template <class Req, class Resp, class Scratch = NoScratch>
  void arm(Queue& q, Slots& slots, int min, int max,
           typename UnaryCall<Req, Resp, Scratch>::RequestFn request,
           typename UnaryCall<Req, Resp, Scratch>::Handle handle) {
    slots.min = min;
    slots.max = max;
    for (int i = 0; i < min; ++i) {
      auto* c = new UnaryCall<Req, Resp, Scratch>(*this, q, slots, request, handle);
      if (!c->arm()) delete c;
    }
  }

  void arm_all(Queue& q);

  ServerCore& core_;
  Handlers handlers_;
  AsyncService service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<Queue>> queues_;
  ParsePool parse_pool_;
  std::mutex active_mu_;
  std::condition_variable active_cv_;
  int active_ = 0;
  bool stopping_ = false;  // begin_stop() or stop() was called: inferences and loads refused
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
  ++slots_.armed;
  return true;
}

template <class Req, class Resp, class Scratch>
bool UnaryCall<Req, Resp, Scratch>::proceed(bool ok) {
  if (finishing_) {
    // The response is in the transport's output (or the client went away): the next call,
    // unless enough slots wait.
    if constexpr (std::is_same_v<Scratch, InferScratch>) {
      scratch_.model.reset();
      scratch_.slices.clear();  // the transport's receive buffers go back
      if (scratch_.release_if_large()) return_freed_memory();
    }
    fe_.call_finished();
    if (slots_.armed >= slots_.max) return false;
    return arm();
  }
  --slots_.armed;
  if (!ok) return false;  // the server is shutting down
  // A call took this slot: keep `min` slots waiting for the next ones.
  while (slots_.armed < slots_.min) {
    auto* c = new UnaryCall(fe_, q_, slots_, request_, handle_);
    if (!c->arm()) {
      delete c;
      break;
    }
  }
  arrived_while_stopping_ = fe_.call_started();
  handle_(fe_, *this);  // finish() now or later; the call is not touched here after it
  return true;
}

template <class Req, class Resp, class Scratch>
void UnaryCall<Req, Resp, Scratch>::finish(const grpc::Status& st) {
  // `this` may be re-armed by the queue's thread once Finish is called: nothing after it. The
  // call counts as in flight until the Finish completes (proceed).
  finishing_ = true;
  if (st.ok()) writer_->Finish(resp_, st, this);
  else writer_->FinishWithError(st, this);
}

using InferCall = UnaryCall<grpc::ByteBuffer, grpc::ByteBuffer, InferScratch>;

std::shared_ptr<ServedModel> Handlers::parse_infer(const grpc::ByteBuffer& bytes,
                                                   InferScratch& s) {
  s.slices.clear();
  s.segments.clear();
  if (bytes.Valid() && !bytes.Dump(&s.slices).ok()) s.slices.clear();
  for (const grpc::Slice& sl : s.slices)
    s.segments.push_back({reinterpret_cast<const char*>(sl.begin()), sl.size()});
  const inference::ModelInferRequest* typed = nullptr;
  // A tensor that spans slices is gathered straight into the model's input buffer (the slot's
  // batch) when the model is known by then (its name comes first in the message): then it is
  // copied once, not gathered here and copied again by the encoding. Failing to find the model
  // here only means the ordinary gather; the lookup below reports it.
  std::shared_ptr<ServedModel> early;
  bool looked = false;
  auto target = [&](size_t, const InputTensor& t, size_t bytes) -> char* {
    if (!looked) {
      looked = true;
      try {
        early = core_.repository->get(s.req.model, s.req.version);
      } catch (...) {
      }
    }
    return early ? early->input_buffer(s.batch, t, bytes) : nullptr;
  };
  if (read_infer_wire(s.segments.data(), s.segments.size(), s.req, s.raw, s.wire, target) ==
      WireRead::Unusual) {
    if (!s.proto) s.proto = std::make_unique<inference::ModelInferRequest>();
    s.proto->Clear();
    // A copy of the (unusual) message's slices for protobuf to read: the slot keeps its own.
    grpc::ByteBuffer copy(s.slices.data(), s.slices.size());
    if (!grpc::SerializationTraits<inference::ModelInferRequest>::Deserialize(&copy, s.proto.get())
             .ok())
      request_fail(Status::InvalidArgument, "the request (", bytes.Length(),
                   " bytes) is not a valid inference.ModelInferRequest message");
    read_infer_proto(*s.proto, s.req, s.raw);
    typed = s.proto.get();
  }
  auto model = core_.repository->get(s.req.model, s.req.version);
  bind_infer_inputs(s.req, s.raw, typed, core_.options.limits.max_tensor_elements);
  return model;
}

// ModelInfer's first half: parsed and submitted (on the queue's thread or a parse thread);
// finished by whoever scores it.
void run_infer(GrpcFrontend& fe, InferCall& call) {
  Handlers& h = fe.handlers();
  InferScratch& s = call.scratch();
  s.t0 = now_ns();
  try {
    s.model = h.parse_infer(call.req(), s);
  } catch (...) {
    return call.finish(h.failed("ModelInfer", s.t0));
  }
  // `s.model` stays set until the slot is re-armed, so the model outlives the request.
  s.model->infer_async(
      s.req,
      [&call](InferResponse* resp, std::exception_ptr err) {
        Handlers& hd = call.frontend().handlers();
        const uint64_t t0 = call.scratch().t0;
        if (err) {
          try {
            std::rethrow_exception(err);
          } catch (...) {
            return call.finish(hd.failed("ModelInfer", t0));
          }
        }
        Handlers::fill_infer(*resp, &call.resp());
        hd.log("ModelInfer", t0, grpc::Status::OK);
        call.finish(grpc::Status::OK);
      },
      h.inline_max_rows(), &s.batch);
}

// ModelInfer on the queue's thread: a big request is handed to a parse thread (the queue's
// thread only receives bytes); a small one is read, encoded and submitted (or scored) right
// here. Until its Finish completes the call is not touched by the queue's thread, so the parse
// thread may use the slot freely.
void start_infer(GrpcFrontend& fe, InferCall& call) {
  if (call.arrived_while_stopping()) return call.finish(fe.handlers().refused("ModelInfer"));
  if (fe.parse_elsewhere(call.req().Length())) {
    fe.parse_pool().post([&fe, &call] { run_infer(fe, call); });
    return;
  }
  run_infer(fe, call);
}

// Model load and unload take long: on a thread of their own, so that the queue's thread keeps
// serving other calls.
template <class Req, class Resp>
void start_blocking(GrpcFrontend& fe, UnaryCall<Req, Resp>& call, const char* name,
                    grpc::Status (Handlers::*rpc)(grpc::ServerContext*, const Req*, Resp*)) {
  if (call.arrived_while_stopping()) return call.finish(fe.handlers().refused(name));
  std::thread([&fe, &call, rpc] {
    call.finish((fe.handlers().*rpc)(nullptr, &call.req(), &call.resp()));
  }).detach();
}

void GrpcFrontend::arm_all(Queue& q) {
  std::vector<Slots>& slots = q.slots;
  using namespace inference;
  using S = AsyncService;
  // ModelInfer: 8 to 64 slots waiting, more while many calls are in flight.
  arm<grpc::ByteBuffer, grpc::ByteBuffer, InferScratch>(q, slots[0], 8, 64,
                                                        &S::RequestModelInfer, &start_infer);
#define DLREC_GRPC_ARM(I, RPC)                                                                 \
  arm<RPC##Request, RPC##Response>(q, slots[I], 1, 2, &S::Request##RPC,                        \
                                   [](GrpcFrontend& fe, UnaryCall<RPC##Request, RPC##Response>& c) { \
                                     c.finish(fe.handlers().RPC(nullptr, &c.req(), &c.resp())); \
                                   })
  DLREC_GRPC_ARM(1, ServerLive);
  DLREC_GRPC_ARM(2, ServerReady);
  DLREC_GRPC_ARM(3, ModelReady);
  DLREC_GRPC_ARM(4, ServerMetadata);
  DLREC_GRPC_ARM(5, ModelMetadata);
  DLREC_GRPC_ARM(6, ModelStatistics);
  DLREC_GRPC_ARM(7, RepositoryIndex);
#undef DLREC_GRPC_ARM
#define DLREC_GRPC_ARM_BLOCKING(I, RPC)                                                        \
  arm<RPC##Request, RPC##Response>(q, slots[I], 1, 2, &S::Request##RPC,                        \
                                   [](GrpcFrontend& fe, UnaryCall<RPC##Request, RPC##Response>& c) { \
                                     start_blocking(fe, c, #RPC, &Handlers::RPC);              \
                                   })
  DLREC_GRPC_ARM_BLOCKING(8, RepositoryModelLoad);
  DLREC_GRPC_ARM_BLOCKING(9, RepositoryModelUnload);
#undef DLREC_GRPC_ARM_BLOCKING
}

}  // namespace

std::unique_ptr<Frontend> make_grpc_frontend(ServerCore& core) {
  return std::make_unique<GrpcFrontend>(core);
}

}  // namespace dlrec::serve
