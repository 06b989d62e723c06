// dlrec bench serve (registered by add_bench in cmd_bench_train.cc): a load generator for KServe v2 servers (like Triton's perf_analyzer).
//
// Closed loop (--concurrency N): N clients, each sending its next request when the previous
// one is answered. Open loop (--rate R): requests are due on a fixed schedule (R per second)
// and taken by a pool of --concurrency senders; latency runs from the scheduled time, so a
// server that falls behind is charged for the wait (no coordinated omission).
//
// Inputs come from the model's metadata: raw features (Criteo-like synthetic rows, or --rows
// FILE in the logs' TSV layout) or encoded inputs (random ids below each cat_<t> cardinality,
// read from the exported model's model.json via --model-dir). HTTP uses the binary tensor
// extension; gRPC uses raw_input_contents. A failed request is counted (and the first few
// messages printed); it never stops the run.
//
// gRPC senders use their own completion queue and send requests serialized once before the run
// (--grpc-client sync: the generated blocking stub instead). --rpc live sends liveness checks
// instead of inferences: the protocol's round-trip floor on the same connection.
#ifdef DLREC_WITH_SERVER

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "dlrec/core/config.h"
#include "dlrec/core/error.h"
#include "dlrec/io/shard.h"
#include "dlrec/serve/grpc_poll.h"
#include "grpc_service.grpc.pb.h"

namespace dlrec::cli {

namespace {

using Clock = std::chrono::steady_clock;
using njson = nlohmann::json;
namespace fs = std::filesystem;

struct ServeBenchOptions {
  std::string url;  // host:port; default 127.0.0.1:8001 (gRPC) or :8000 (HTTP)
  std::string protocol = "grpc";
  std::string model, version;
  int64_t batch = 1;
  int concurrency = 0;  // 0: 1 for the closed loop, 64 senders for the open loop
  double rate = 0;      // > 0: open loop
  double duration = 10, warmup = 2;
  std::string input = "raw";
  std::string model_dir, rows_file, json_file;
  int64_t max_requests = 20000000;
  int timeout_ms = 10000;
  int grpc_channels = 0;  // 0: one per 16 clients
  int variants = 8;       // distinct request payloads, cycled
  uint64_t seed = 1;
  std::string rpc = "infer";          // infer, or live: the protocol's floor without the model
  std::string grpc_client = "async";  // async: own completion queue, pre-serialized requests
  int grpc_spin_us = 0;  // async client: poll the queue this long before sleeping in Next()
};

struct Tensor {
  std::string name, datatype;
  std::vector<int64_t> shape;
  std::string data;  // little-endian wire layout (BYTES: 4-byte length + bytes per element)
};

template <class T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof v);
  s.append(b, sizeof b);
}

void put_bytes(std::string& s, const std::string& v) {
  put<uint32_t>(s, static_cast<uint32_t>(v.size()));
  s += v;
}

std::pair<std::string, int> split_url(const std::string& url) {
  std::string u = url;
  for (const char* p : {"http://", "https://", "grpc://"})
    if (u.rfind(p, 0) == 0) u = u.substr(std::strlen(p));
  while (!u.empty() && u.back() == '/') u.pop_back();
  auto c = u.rfind(':');
  DLREC_CHECK(c != std::string::npos && c + 1 < u.size(), "--url '", url,
              "': expected host:port");
  int port = 0;
  try {
    port = std::stoi(u.substr(c + 1));
  } catch (...) {
    port = -1;
  }
  DLREC_CHECK(port > 0 && port < 65536, "--url '", url, "': bad port");
  std::string host = u.substr(0, c);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, port};
}

std::string model_path(const ServeBenchOptions& o) {
  return "/v2/models/" + o.model + (o.version.empty() ? "" : "/versions/" + o.version);
}

struct InputMeta {
  std::string name, datatype;
};

std::vector<InputMeta> fetch_metadata_http(const ServeBenchOptions& o) {
  auto [host, port] = split_url(o.url);
  httplib::Client cli(host, port);
  cli.set_connection_timeout(std::chrono::milliseconds(o.timeout_ms));
  cli.set_read_timeout(std::chrono::milliseconds(o.timeout_ms));
  auto res = cli.Get(model_path(o).c_str());
  DLREC_CHECK(res, "model metadata from http://", o.url, model_path(o), ": ",
              httplib::to_string(res.error()));
  DLREC_CHECK(res->status == 200, "model metadata from http://", o.url, model_path(o),
              ": HTTP ", res->status, " ", res->body.substr(0, 300));
  njson j = parse_json(res->body, "model metadata from http://" + o.url + model_path(o));
  DLREC_CHECK(j.is_object() && j.contains("inputs") && j["inputs"].is_array(),
              "model metadata: no 'inputs' array in ", res->body.substr(0, 300));
  std::vector<InputMeta> out;
  for (const auto& t : j["inputs"])
    out.push_back({t.value("name", std::string()), t.value("datatype", std::string())});
  return out;
}

std::vector<InputMeta> fetch_metadata_grpc(inference::GRPCInferenceService::Stub& stub,
                                           const ServeBenchOptions& o) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(o.timeout_ms));
  inference::ModelMetadataRequest q;
  q.set_name(o.model);
  q.set_version(o.version);
  inference::ModelMetadataResponse r;
  grpc::Status st = stub.ModelMetadata(&ctx, q, &r);
  DLREC_CHECK(st.ok(), "model metadata from grpc ", o.url, ": ", st.error_message(),
              " (code ", static_cast<int>(st.error_code()), ")");
  std::vector<InputMeta> out;
  for (const auto& t : r.inputs()) out.push_back({t.name(), t.datatype()});
  return out;
}

// The exported model directory holding model.json: `dir` itself, or its highest version.
io::ShardLayout read_layout(const std::string& dir) {
  fs::path p(dir);
  if (!fs::exists(p / "model.json")) {
    int64_t best = -1;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(p, ec)) {
      const std::string n = e.path().filename().string();
      if (!n.empty() && n.size() < 18 &&
          std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
          fs::exists(e.path() / "model.json"))
        best = std::max<int64_t>(best, std::stoll(n));
    }
    DLREC_CHECK(best > 0, "--model-dir '", dir,
                "': no model.json there nor in a numbered version directory");
    p /= std::to_string(best);
  }
  njson j = read_json_file((p / "model.json").string());
  DLREC_CHECK(j.is_object() && j.contains("layout"), (p / "model.json").string(),
              ": no 'layout' (not a dlrec export?)");
  return io::ShardLayout::from_json(j.at("layout"));
}

// Criteo-like raw rows: integer counts with a heavy tail and ~10 % missing; categorical
// 32-bit hex hashes drawn from a power-law pool with ~5 % missing.
std::vector<Tensor> synthetic_raw(const std::vector<InputMeta>& meta, int64_t rows,
                                  std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> nd(0, 1.5);
  std::vector<Tensor> out;
  for (size_t c = 0; c < meta.size(); ++c) {
    Tensor t{meta[c].name, meta[c].datatype, {rows, 1}, {}};
    for (int64_t r = 0; r < rows; ++r) {
      const bool missing = u(rng) < (meta[c].datatype == "BYTES" ? 0.05 : 0.10);
      if (meta[c].datatype == "BYTES") {
        std::string v;
        if (!missing) {
          const uint64_t id = static_cast<uint64_t>(std::pow(1e6, u(rng) * u(rng)));
          uint64_t h = (id + 0x9e3779b97f4a7c15ULL * (c + 1)) * 0xbf58476d1ce4e5b9ULL;
          h ^= h >> 31;
          char b[9];
          std::snprintf(b, sizeof b, "%08x", static_cast<unsigned>(h & 0xffffffffu));
          v = b;
        }
        put_bytes(t.data, v);
      } else {
        const double v = missing ? NAN : std::floor(std::exp(std::fabs(nd(rng))) - 1);
        if (t.datatype == "FP64") put<double>(t.data, v);
        else if (t.datatype == "INT64") put<int64_t>(t.data, missing ? 0 : static_cast<int64_t>(v));
        else if (t.datatype == "INT32") put<int32_t>(t.data, missing ? 0 : static_cast<int32_t>(v));
        else put<float>(t.data, static_cast<float>(v));
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Rows of a TSV file in the logs' layout (an optional leading label, then one field per input).
std::vector<Tensor> file_raw(const std::vector<InputMeta>& meta,
                             const std::vector<std::vector<std::string>>& lines, int64_t rows,
                             int64_t first) {
  std::vector<Tensor> out;
  for (const auto& m : meta) out.push_back({m.name, m.datatype, {rows, 1}, {}});
  for (int64_t r = 0; r < rows; ++r) {
    const auto& f = lines[static_cast<size_t>((first + r) % static_cast<int64_t>(lines.size()))];
    const size_t skip = f.size() - meta.size();
    for (size_t c = 0; c < meta.size(); ++c) {
      const std::string& v = f[c + skip];
      Tensor& t = out[c];
      if (t.datatype == "BYTES") {
        put_bytes(t.data, v);
        continue;
      }
      double x = NAN;
      if (!v.empty()) {
        char* end = nullptr;
        x = std::strtod(v.c_str(), &end);
        DLREC_CHECK(end && *end == 0, "--rows: field '", v.substr(0, 40), "' of column ",
                    meta[c].name, " is not a number");
      }
      if (t.datatype == "FP64") put<double>(t.data, x);
      else if (t.datatype == "INT64") put<int64_t>(t.data, std::isnan(x) ? 0 : int64_t(x));
      else if (t.datatype == "INT32") put<int32_t>(t.data, std::isnan(x) ? 0 : int32_t(x));
      else put<float>(t.data, static_cast<float>(x));
    }
  }
  return out;
}

std::vector<std::vector<std::string>> read_rows(const std::string& path, size_t inputs,
                                                int64_t max_lines) {
  std::ifstream f(path);
  DLREC_CHECK(f.good(), "--rows: cannot open '", path, "'");
  std::vector<std::vector<std::string>> lines;
  std::string line;
  while (static_cast<int64_t>(lines.size()) < max_lines && std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<std::string> fields;
    size_t p = 0;
    for (;;) {
      size_t q = line.find('\t', p);
      fields.push_back(line.substr(p, q == std::string::npos ? std::string::npos : q - p));
      if (q == std::string::npos) break;
      p = q + 1;
    }
    DLREC_CHECK(fields.size() == inputs || fields.size() == inputs + 1, "--rows: line ",
                lines.size() + 1, " of '", path, "' has ", fields.size(),
                " tab-separated fields; the model has ", inputs,
                " inputs (optionally preceded by a label)");
    lines.push_back(std::move(fields));
  }
  DLREC_CHECK(!lines.empty(), "--rows: '", path, "' holds no rows");
  return lines;
}

std::vector<Tensor> synthetic_encoded(const io::ShardLayout& layout, int64_t rows,
                                      std::mt19937_64& rng) {
  std::vector<Tensor> out;
  std::uniform_real_distribution<float> u(0, 1);
  Tensor d{"dense", "FP32", {rows, layout.num_dense}, {}};
  for (int64_t i = 0; i < rows * layout.num_dense; ++i) put<float>(d.data, u(rng));
  out.push_back(std::move(d));
  for (size_t t = 0; t < layout.cardinalities.size(); ++t) {
    Tensor c{"cat_" + std::to_string(t), "INT64", {rows}, {}};
    std::uniform_int_distribution<int64_t> id(0, std::max<int64_t>(layout.cardinalities[t], 1) - 1);
    for (int64_t r = 0; r < rows; ++r) put<int64_t>(c.data, id(rng));
    out.push_back(std::move(c));
  }
  return out;
}

// One request, prepared for both protocols' wire formats.
struct Payload {
  inference::ModelInferRequest grpc;
  grpc::ByteBuffer grpc_bytes;  // `grpc` serialized once (the async client sends it as is)
  std::string http_body;
  size_t http_header_length = 0;
};

Payload make_payload(const ServeBenchOptions& o, const std::vector<Tensor>& tensors) {
  Payload p;
  if (o.protocol == "grpc") {
    p.grpc.set_model_name(o.model);
    p.grpc.set_model_version(o.version);
    for (const auto& t : tensors) {
      auto* in = p.grpc.add_inputs();
      in->set_name(t.name);
      in->set_datatype(t.datatype);
      for (int64_t d : t.shape) in->add_shape(d);
      *p.grpc.add_raw_input_contents() = t.data;
    }
    p.grpc.add_outputs()->set_name("probability");
    bool own = false;
    grpc::Status st = grpc::SerializationTraits<inference::ModelInferRequest>::Serialize(
        p.grpc, &p.grpc_bytes, &own);
    DLREC_CHECK(st.ok(), "cannot serialize the gRPC request: ", st.error_message());
    return p;
  }
  njson h;
  h["inputs"] = njson::array();
  for (const auto& t : tensors)
    h["inputs"].push_back({{"name", t.name},
                           {"datatype", t.datatype},
                           {"shape", t.shape},
                           {"parameters", {{"binary_data_size", t.data.size()}}}});
  h["outputs"] = njson::array({{{"name", "probability"}, {"parameters", {{"binary_data", true}}}}});
  p.http_body = h.dump();
  p.http_header_length = p.http_body.size();
  for (const auto& t : tensors) p.http_body += t.data;
  return p;
}

// What the senders share.
struct Run {
  const ServeBenchOptions* o = nullptr;
  std::vector<Payload> payloads;
  Clock::time_point start, measure_from, end;
  std::atomic<int64_t> next{0};  // requests claimed (closed loop) or schedule slots (open loop)
  std::mutex err_mu;
  std::vector<std::string> errors;  // the first few messages
  std::atomic<int64_t> error_count{0};
  void failed(const std::string& msg) {
    int64_t n = error_count.fetch_add(1) + 1;
    if (n > 5) return;
    std::lock_guard<std::mutex> lk(err_mu);
    errors.push_back(msg);
    std::fprintf(stderr, "dlrec bench: request failed: %s\n", msg.c_str());
    if (n == 5) std::fprintf(stderr, "dlrec bench: (further failures are counted, not shown)\n");
  }
};

struct SenderResult {
  std::vector<uint32_t> latency_us;  // measured window, successful requests
  int64_t ok = 0, fail = 0;          // measured window
  int64_t ok_total = 0, fail_total = 0;
  int64_t late = 0;  // open loop: sent more than 1 ms after the scheduled time
};

// Sends requests until the end of the run; `send` returns an empty string on success.
template <class Send>
void sender_loop(Run& run, SenderResult& res, Send&& send) {
  const ServeBenchOptions& o = *run.o;
  const bool open = o.rate > 0;
  for (;;) {
    const int64_t i = run.next.fetch_add(1);
    if (i >= o.max_requests) break;
    Clock::time_point t0;
    if (open) {
      t0 = run.start + std::chrono::nanoseconds(static_cast<int64_t>(1e9 * i / o.rate));
      if (t0 >= run.end) break;
      std::this_thread::sleep_until(t0);
      if (Clock::now() - t0 > std::chrono::milliseconds(1)) ++res.late;
    } else {
      t0 = Clock::now();
      if (t0 >= run.end) break;
    }
    std::string err;
    try {
      err = send(run.payloads[static_cast<size_t>(i) % run.payloads.size()]);
    } catch (const std::exception& e) {
      err = std::string("client exception: ") + e.what();
    }
    const auto t1 = Clock::now();
    const bool measured = t0 >= run.measure_from;
    if (err.empty()) {
      ++res.ok_total;
      if (measured) {
        ++res.ok;
        const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count();
        res.latency_us.push_back(static_cast<uint32_t>(std::min<int64_t>(us, UINT32_MAX)));
      }
    } else {
      ++res.fail_total;
      if (measured) ++res.fail;
      run.failed(err);
    }
  }
}

std::string check_http(const httplib::Result& res, int64_t batch) {
  if (!res) return "HTTP: " + httplib::to_string(res.error());
  if (res->status != 200)
    return "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300);
  if (!res->has_header("Inference-Header-Content-Length"))
    return "HTTP 200 without binary output (no Inference-Header-Content-Length)";
  int64_t hl = -1;
  try {
    hl = std::stoll(res->get_header_value("Inference-Header-Content-Length"));
  } catch (...) {
  }
  if (hl < 0 || static_cast<int64_t>(res->body.size()) - hl != batch * 4)
    return "HTTP 200 with " + std::to_string(res->body.size()) + " bytes and header length " +
           std::to_string(hl) + "; expected " + std::to_string(batch * 4) + " output bytes";
  return {};
}

std::string check_grpc(const grpc::Status& st, const inference::ModelInferResponse& r,
                       int64_t batch) {
  if (!st.ok())
    return "gRPC code " + std::to_string(static_cast<int>(st.error_code())) + ": " +
           st.error_message().substr(0, 300);
  if (r.raw_output_contents_size() != 1 ||
      static_cast<int64_t>(r.raw_output_contents(0).size()) != batch * 4)
    return "gRPC OK with a malformed response (" + std::to_string(r.raw_output_contents_size()) +
           " raw outputs)";
  return {};
}

// The async gRPC client of one sender thread: its own completion queue, the requests sent as
// the bytes serialized before the run (a reference, not a copy), the response parsed into one
// reused message. No thread but the sender's takes part in a call. With spin_us > 0 the sender
// polls its queue without sleeping (zero-deadline AsyncNext) for up to spin_us before it blocks,
// so a quick answer does not wait for the sender's thread (and its CPU) to wake up: the client's
// own wake-up then stays out of the measured latency, at the price of a busy core per sender.
class GrpcAsyncClient {
 public:
  GrpcAsyncClient(std::shared_ptr<grpc::Channel> ch, int spin_us)
      : stub_(std::move(ch)), spin_(std::chrono::microseconds(std::max(0, spin_us))) {}
  ~GrpcAsyncClient() {
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // One call of `method` ("/inference.GRPCInferenceService/ModelInfer"); "" on success.
  std::string call(const std::string& method, const grpc::ByteBuffer& request, int64_t batch,
                   int timeout_ms) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    auto rpc = stub_.PrepareUnaryCall(&ctx, method, request, &cq_);
    rpc->StartCall();
    grpc::ByteBuffer reply;
    grpc::Status st;
    rpc->Finish(&reply, &st, this);
    void* tag = nullptr;
    bool ok = false;
    if (!next(&tag, &ok) || !ok || tag != this) return "gRPC: the call did not complete";
    if (batch < 0) {  // ServerLive
      if (!st.ok()) return check_grpc(st, infer_, 0);
      inference::ServerLiveResponse live;
      if (!grpc::SerializationTraits<inference::ServerLiveResponse>::Deserialize(&reply, &live)
               .ok() || !live.live())
        return "gRPC ServerLive: not live";
      return {};
    }
    infer_.Clear();
    if (st.ok() &&
        !grpc::SerializationTraits<inference::ModelInferResponse>::Deserialize(&reply, &infer_).ok())
      return "gRPC OK with a response that does not parse";
    return check_grpc(st, infer_, batch);
  }

 private:
  bool next(void** tag, bool* ok) { return serve::next_event(cq_, spin_, tag, ok); }

  grpc::GenericStub stub_;
  std::chrono::microseconds spin_;
  grpc::CompletionQueue cq_;
  inference::ModelInferResponse infer_;
};

double percentile(const std::vector<uint32_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) ;
  k = std::min(std::max<size_t>(k, 1), sorted.size());
  return sorted[k - 1];
}

// One long function (~230 lines) on purpose: the load generator's setup, its client threads
// (closed and open loop) and the report share the options, counters and latency buffers; split,
// each piece would take most of them as arguments.
int run_serve_bench(ServeBenchOptions o) {
  signal(SIGPIPE, SIG_IGN);
  DLREC_CHECK(o.protocol == "grpc" || o.protocol == "http", "--protocol must be grpc or http");
  DLREC_CHECK(o.input == "raw" || o.input == "encoded", "--input must be raw or encoded");
  if (o.url.empty()) o.url = o.protocol == "grpc" ? "127.0.0.1:8001" : "127.0.0.1:8000";
  const bool open = o.rate > 0;
  if (o.concurrency <= 0) o.concurrency = open ? 64 : 1;
  DLREC_CHECK(o.input == "raw" || !o.model_dir.empty(),
              "--input encoded needs --model-dir (the model's directory in the repository or "
              "an export directory): the model metadata lists raw inputs and no cardinalities");
  DLREC_CHECK(o.rows_file.empty() || o.input == "raw", "--rows goes with --input raw");
  // Plain variables, not a structured binding: lambdas below capture them (C++20 for
  // bindings; clang rejects it in C++17).
  const auto url_parts = split_url(o.url);
  const std::string host = url_parts.first;
  const int port = url_parts.second;

  // gRPC channels: several connections so that one HTTP/2 connection is not the bottleneck.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  if (o.protocol == "grpc") {
    int n = o.grpc_channels > 0 ? o.grpc_channels : (o.concurrency + 15) / 16;
    n = std::min(n, o.concurrency);
    for (int i = 0; i < n; ++i) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      args.SetInt("dlrec.bench.channel", i);  // distinct arguments: a connection of its own
      channels.push_back(grpc::CreateCustomChannel(o.url, grpc::InsecureChannelCredentials(), args));
    }
    for (auto& ch : channels)
      DLREC_CHECK(ch->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::milliseconds(o.timeout_ms)),
                  "cannot connect to the gRPC server at ", o.url);
  }

  // Inputs from the model's metadata.
  std::vector<InputMeta> meta;
  if (o.protocol == "grpc") {
    auto stub = inference::GRPCInferenceService::NewStub(channels[0]);
    meta = fetch_metadata_grpc(*stub, o);
  } else {
    meta = fetch_metadata_http(o);
  }
  DLREC_CHECK(!meta.empty(), "model '", o.model, "' lists no inputs");
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<std::string>> lines;
  io::ShardLayout layout;
  if (o.input == "encoded") layout = read_layout(o.model_dir);
  if (!o.rows_file.empty())
    lines = read_rows(o.rows_file, meta.size(), std::max<int64_t>(o.batch * o.variants, 1));
  const int variants = std::max(1, o.variants);
  Run run;
  run.o = &o;
  for (int v = 0; v < variants; ++v) {
    std::vector<Tensor> t = o.input == "encoded" ? synthetic_encoded(layout, o.batch, rng)
                            : lines.empty()     ? synthetic_raw(meta, o.batch, rng)
                                                : file_raw(meta, lines, o.batch, v * o.batch);
    run.payloads.push_back(make_payload(o, t));
  }
  const bool live = o.rpc == "live";
  const size_t bytes = live                 ? 0
                       : o.protocol == "grpc" ? run.payloads[0].grpc.ByteSizeLong()
                                              : run.payloads[0].http_body.size();
  grpc::ByteBuffer live_bytes;  // an empty ServerLiveRequest
  if (live && o.protocol == "grpc") {
    bool own = false;
    (void)grpc::SerializationTraits<inference::ServerLiveRequest>::Serialize(
        inference::ServerLiveRequest(), &live_bytes, &own);
  }

  std::printf("dlrec bench serve: %s %s%s, model '%s' version %s, batch %lld, %s, %s inputs "
              "(%zu tensors, %zu bytes per request)\n",
              o.protocol.c_str(), o.url.c_str(),
              live ? " (liveness round trips only: no inference)"
              : o.protocol == "grpc" ? (" (" + o.grpc_client + " client" +
                                        (o.grpc_spin_us > 0 && o.grpc_client == "async"
                                             ? ", spinning " + std::to_string(o.grpc_spin_us) + " us"
                                             : std::string()) +
                                        ")").c_str()
                                     : "",
              o.model.c_str(),
              o.version.empty() ? "latest" : o.version.c_str(), static_cast<long long>(o.batch),
              open ? ("open loop " + std::to_string(o.rate) + " req/s, " +
                      std::to_string(o.concurrency) + " senders")
                         .c_str()
                   : ("closed loop, concurrency " + std::to_string(o.concurrency)).c_str(),
              o.input.c_str(), meta.size(), bytes);
  std::printf("  warmup %.1f s, measuring %.1f s\n", o.warmup, o.duration);
  std::fflush(stdout);

  std::vector<SenderResult> results(static_cast<size_t>(o.concurrency));
  std::vector<std::thread> threads;
  run.start = Clock::now() + std::chrono::milliseconds(20);
  run.measure_from = run.start + std::chrono::microseconds(static_cast<int64_t>(o.warmup * 1e6));
  run.end = run.measure_from + std::chrono::microseconds(static_cast<int64_t>(o.duration * 1e6));
  const std::string path = model_path(o) + "/infer";
  for (int c = 0; c < o.concurrency; ++c) {
    threads.emplace_back([&, c] {
      SenderResult& res = results[static_cast<size_t>(c)];
      res.latency_us.reserve(4096);
      std::this_thread::sleep_until(run.start);
      std::shared_ptr<grpc::Channel> channel;
      if (!channels.empty()) channel = channels[static_cast<size_t>(c) % channels.size()];
      if (o.protocol == "grpc" && o.grpc_client == "async") {
        GrpcAsyncClient client(channel, o.grpc_spin_us);
        const std::string method = live ? "/inference.GRPCInferenceService/ServerLive"
                                         : "/inference.GRPCInferenceService/ModelInfer";
        sender_loop(run, res, [&](const Payload& p) {
          return client.call(method, live ? live_bytes : p.grpc_bytes, live ? -1 : o.batch,
                             o.timeout_ms);
        });
      } else if (o.protocol == "grpc") {
        auto stub = inference::GRPCInferenceService::NewStub(channel);
        inference::ModelInferResponse r;  // reused: Clear() keeps its buffers
        sender_loop(run, res, [&](const Payload& p) {
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(o.timeout_ms));
          if (live) {
            inference::ServerLiveResponse lr;
            grpc::Status st = stub->ServerLive(&ctx, inference::ServerLiveRequest(), &lr);
            if (st.ok() && !lr.live()) return std::string("gRPC ServerLive: not live");
            return st.ok() ? std::string() : check_grpc(st, r, 0);
          }
          r.Clear();
          grpc::Status st = stub->ModelInfer(&ctx, p.grpc, &r);
          return check_grpc(st, r, o.batch);
        });
      } else {
        httplib::Client cli(host, port);
        cli.set_keep_alive(true);
        cli.set_tcp_nodelay(true);
        cli.set_connection_timeout(std::chrono::milliseconds(o.timeout_ms));
        cli.set_read_timeout(std::chrono::milliseconds(o.timeout_ms));
        cli.set_write_timeout(std::chrono::milliseconds(o.timeout_ms));
        sender_loop(run, res, [&](const Payload& p) {
          if (live) {
            auto r = cli.Get("/v2/health/live");
            if (!r) return "HTTP: " + httplib::to_string(r.error());
            return r->status == 200 ? std::string()
                                    : "HTTP " + std::to_string(r->status) + " from /v2/health/live";
          }
          httplib::Headers h = {
              {"Inference-Header-Content-Length", std::to_string(p.http_header_length)}};
          auto r = cli.Post(path.c_str(), h, p.http_body, "application/octet-stream");
          return check_http(r, o.batch);
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto finished = Clock::now();

  SenderResult all;
  for (auto& r : results) {
    all.ok += r.ok;
    all.fail += r.fail;
    all.ok_total += r.ok_total;
    all.fail_total += r.fail_total;
    all.late += r.late;
    all.latency_us.insert(all.latency_us.end(), r.latency_us.begin(), r.latency_us.end());
    r.latency_us = {};
  }
  std::sort(all.latency_us.begin(), all.latency_us.end());
  const double p50 = percentile(all.latency_us, 0.50), p90 = percentile(all.latency_us, 0.90),
               p99 = percentile(all.latency_us, 0.99),
               mx = all.latency_us.empty() ? 0 : all.latency_us.back();
  double mean = 0;
  for (uint32_t v : all.latency_us) mean += v;
  if (!all.latency_us.empty()) mean /= static_cast<double>(all.latency_us.size());
  const double rps = static_cast<double>(all.ok) / o.duration;
  const double sps = rps * static_cast<double>(o.batch);
  const double drain_s = std::chrono::duration<double>(finished - run.end).count();

  std::printf("\n  %-22s %14s\n", "metric", "value");
  std::printf("  %-22s %14lld\n", "requests (measured)", static_cast<long long>(all.ok + all.fail));
  std::printf("  %-22s %14lld\n", "succeeded", static_cast<long long>(all.ok));
  std::printf("  %-22s %14lld\n", "failed", static_cast<long long>(all.fail));
  std::printf("  %-22s %14lld\n", "succeeded (all)", static_cast<long long>(all.ok_total));
  std::printf("  %-22s %14lld\n", "failed (all)", static_cast<long long>(all.fail_total));
  std::printf("  %-22s %14.1f\n", "throughput (req/s)", rps);
  std::printf("  %-22s %14.1f\n", "throughput (samples/s)", sps);
  std::printf("  %-22s %14.0f\n", "latency p50 (us)", p50);
  std::printf("  %-22s %14.0f\n", "latency p90 (us)", p90);
  std::printf("  %-22s %14.0f\n", "latency p99 (us)", p99);
  std::printf("  %-22s %14.0f\n", "latency max (us)", mx);
  std::printf("  %-22s %14.0f\n", "latency mean (us)", mean);
  if (open) std::printf("  %-22s %14lld\n", "sent late (> 1 ms)", static_cast<long long>(all.late));
  std::printf("\nsummary: %s batch=%lld %s requests=%lld failures=%lld throughput=%.1f req/s "
              "(%.1f samples/s)%s latency_us p50=%.0f p90=%.0f p99=%.0f max=%.0f\n",
              o.protocol.c_str(), static_cast<long long>(o.batch),
              open ? ("rate=" + std::to_string(o.rate)).c_str()
                   : ("concurrency=" + std::to_string(o.concurrency)).c_str(),
              static_cast<long long>(all.ok + all.fail), static_cast<long long>(all.fail_total),
              rps, sps, live ? " rpc=live" : "", p50, p90, p99, mx);
  std::fflush(stdout);

  if (!o.json_file.empty()) {
    njson j = {{"protocol", o.protocol},
               {"url", o.url},
               {"model", o.model},
               {"version", o.version},
               {"batch", o.batch},
               {"mode", open ? "open" : "closed"},
               {"concurrency", o.concurrency},
               {"rate", o.rate},
               {"input", o.input},
               {"rpc", o.rpc},
               {"grpc_client", o.grpc_client},
               {"grpc_spin_us", o.grpc_spin_us},
               {"warmup_s", o.warmup},
               {"duration_s", o.duration},
               {"drain_s", drain_s},
               {"requests", all.ok + all.fail},
               {"success", all.ok},
               {"failures", all.fail},
               {"total_success", all.ok_total},
               {"total_failures", all.fail_total},
               {"throughput_rps", rps},
               {"throughput_sps", sps},
               {"latency_us",
                {{"p50", p50}, {"p90", p90}, {"p99", p99}, {"max", mx}, {"mean", mean}}},
               {"late", all.late},
               {"errors", run.errors}};
    std::ofstream f(o.json_file);
    f << j.dump(2) << '\n';
    DLREC_CHECK(f.good(), "cannot write --json '", o.json_file, "'");
  }
  return all.fail_total == 0 ? 0 : 3;
}

}  // namespace

Runner add_bench_serve(CLI::App* b) {
  auto o = std::make_shared<ServeBenchOptions>();
  CLI::App* s = b->add_subcommand(
      "serve",
      "Load a KServe v2 server (closed loop --concurrency or open loop --rate) and report "
      "throughput and latency percentiles; exit status 3 when any request failed");
  s->add_option("--url", o->url, "Server host:port (default 127.0.0.1:8001 gRPC, :8000 HTTP)");
  s->add_option("--protocol", o->protocol, "grpc or http")
      ->check(CLI::IsMember({"grpc", "http"}));
  s->add_option("--model", o->model, "Model name")->required();
  s->add_option("--version", o->version, "Model version (default: the server's latest)");
  s->add_option("--batch", o->batch, "Rows per request")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  s->add_option("--concurrency", o->concurrency,
                "Closed loop: clients sending back to back (default 1); with --rate: senders "
                "(most requests in flight, default 64)")
      ->check(CLI::Range(1, 4096));
  s->add_option("--rate", o->rate, "Open loop: requests per second on a fixed schedule")
      ->check(CLI::Range(0.0, 1e7));
  s->add_option("--duration", o->duration, "Measured seconds")->check(CLI::Range(0.1, 86400.0));
  s->add_option("--warmup", o->warmup, "Seconds of load before measuring")
      ->check(CLI::Range(0.0, 3600.0));
  s->add_option("--input", o->input, "raw (features as in the logs) or encoded (ids, dense)")
      ->check(CLI::IsMember({"raw", "encoded"}));
  s->add_option("--model-dir", o->model_dir,
                "Model directory (repository entry or export) for --input encoded cardinalities");
  s->add_option("--rows", o->rows_file, "TSV rows (logs layout) for --input raw instead of synthetic");
  s->add_option("--json", o->json_file, "Write the figures as JSON to this file");
  s->add_option("--max-requests", o->max_requests, "Stop after this many requests")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  s->add_option("--timeout-ms", o->timeout_ms, "Per-request deadline")->check(CLI::Range(1, 3600000));
  s->add_option("--grpc-channels", o->grpc_channels, "gRPC connections (default: one per 16 clients)")
      ->check(CLI::Range(1, 1024));
  s->add_option("--variants", o->variants, "Distinct request payloads, cycled")
      ->check(CLI::Range(1, 1024));
  s->add_option("--seed", o->seed, "Seed of the synthetic inputs");
  s->add_option("--rpc", o->rpc,
                "infer (ModelInfer / POST .../infer), or live: ServerLive / GET /v2/health/live "
                "round trips, the protocol's floor without the model")
      ->check(CLI::IsMember({"infer", "live"}));
  s->add_option("--grpc-client", o->grpc_client,
                "async (a completion queue per sender, requests serialized once) or sync "
                "(the generated blocking stub, serializing each request)")
      ->check(CLI::IsMember({"async", "sync"}));
  s->add_option("--grpc-spin-us", o->grpc_spin_us,
                "Async gRPC client: poll for the answer this many microseconds before sleeping "
                "(keeps the client's own wake-up out of the latency; a busy core per sender)")
      ->check(CLI::Range(0, 1000000));
  return [o]() -> int { return run_serve_bench(*o); };
}

}  // namespace dlrec::cli

#endif  // DLREC_WITH_SERVER
