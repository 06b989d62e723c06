// dlrec serve: the KServe v2 inference server (docs/SERVING.md).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "dlrec/serve/model_config.h"
#include "dlrec/serve/server.h"
#include "dlrec/train/export.h"

namespace dlrec::cli {

namespace {
// serve --dry-run: for each model of the repository, the versions its policy serves and the
// memory each tier and the model would use per instance (predict --plan's), then the total.
// Opens each version as an instance would (tables in RocksDB are not read; a Redis tier
// connects), scores nothing, binds no port. Returns the count of models that would not load.
int dry_run(const serve::ServerOptions& o) {
  namespace fs = std::filesystem;
  std::vector<fs::path> models;
  for (const auto& e : fs::directory_iterator(o.model_repository))
    if (e.is_directory() && serve::model_name_problem(e.path().filename().string()).empty())
      models.push_back(e.path());
  std::sort(models.begin(), models.end());
  int failed = 0;
  for (const fs::path& dir : models) {
    const std::string name = dir.filename().string();
    try {
      serve::ModelConfig cfg;
      cfg.batching = o.batching;
      if (fs::exists(dir / "config.json"))
        cfg = serve::ModelConfig::from_json(read_json_file((dir / "config.json").string()),
                                            o.batching, dir.string());
      std::vector<int64_t> available;
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string v = e.path().filename().string();
        if (e.is_directory() && !v.empty() && v.size() < 18 &&
            v.find_first_not_of("0123456789") == std::string::npos && v[0] != '0')
          available.push_back(std::stoll(v));
      }
      const std::vector<int64_t> chosen = cfg.version_policy.select(available);
      DLREC_CHECK(!chosen.empty(), "no version to serve under its version policy");
      for (int64_t v : chosen) {
        const std::string vdir = (dir / std::to_string(v)).string();
        std::printf("model %s version %lld: %lld %s instance(s), each:\n", name.c_str(),
                    static_cast<long long>(v), static_cast<long long>(cfg.instances.count),
                    cfg.instances.gpu ? "GPU" : "CPU");
        // A GPU instance is opened on its first device (the GPU cache is sized from its free
        // memory, so a host without that GPU reports the model as not loading).
        const Device dev = cfg.instances.gpu
                               ? Device::cuda(static_cast<int>(cfg.instances.gpus.at(0)))
                               : Device::cpu();
        train::Predictor p(vdir, dev, cfg.instances.precision, cfg.instances.store.get());
        std::fputs(p.memory_plan().c_str(), stdout);
      }
    } catch (const std::exception& e) {
      std::printf("model %s: would not load: %s\n", name.c_str(), e.what());
      ++failed;
    }
  }
  std::printf("%zu model(s), %d would not load\n", models.size(), failed);
  return failed;
}
}  // namespace

Runner add_serve(CLI::App& app) {
  auto o = std::make_shared<serve::ServerOptions>();
  CLI::App* c = app.add_subcommand(
      "serve", "Serve exported models over KServe v2 HTTP/REST and gRPC (Triton-compatible)");
  c->add_option("--model-repository", o->model_repository,
                "Directory of <model>/<version>/ exported models")
      ->required();
  c->add_option("--host", o->host, "Address to bind (default 127.0.0.1: loopback only)");
  c->add_option("--http-port", o->http_port, "HTTP/REST port (0: any free port, -1: off)");
  c->add_option("--grpc-port", o->grpc_port, "gRPC port (0: any free port, -1: off)");
  c->add_option("--metrics-port", o->metrics_port,
                "Prometheus metrics port, GET /metrics (0: any free port, -1: off)");
  c->add_option("--http-threads", o->http_threads,
                "HTTP worker threads (default 16); they run complete requests only, connections "
                "are read by one event-loop thread")
      ->check(CLI::Range(2, 1024));
  c->add_option("--http-max-connections", o->http_max_connections,
                "Open HTTP connections allowed (default 1024); beyond, a new one is answered 503 "
                "and closed")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--http-header-timeout-ms", o->http_header_timeout_ms,
                "A request's line and headers must arrive within this many ms of its first byte "
                "(default 10000; 408 and closed otherwise)")
      ->check(CLI::Range(100, 3600000));
  c->add_option("--http-body-timeout-ms", o->http_body_timeout_ms,
                "A request body must arrive within this many ms of the end of its headers "
                "(default 60000; 408 and closed otherwise)")
      ->check(CLI::Range(100, 3600000));
  c->add_option("--http-idle-timeout-ms", o->http_idle_timeout_ms,
                "A keep-alive connection that sends no request for this many ms is closed "
                "(default 30000)")
      ->check(CLI::Range(100, 3600000));
  c->add_option("--http-write-timeout-ms", o->http_write_timeout_ms,
                "Sending one response may take this many ms before the connection is dropped "
                "(default 30000)")
      ->check(CLI::Range(100, 3600000));
  c->add_option("--grpc-threads", o->grpc_threads,
                "gRPC completion queues (default 1), each with one polling thread that receives "
                "the calls and hands inferences on without waiting (more: gRPC passes events "
                "between the threads, slower single calls)")
      ->check(CLI::Range(1, 256));
  c->add_option("--grpc-inline-rows", o->grpc_inline_max_rows,
                "gRPC inferences of fewer rows (default 1024) are scored on the polling thread "
                "when an instance is idle and the queue delay is 0; bigger ones on a worker")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  c->add_option("--grpc-spin-us", o->grpc_spin_us,
                "Microseconds a gRPC polling thread keeps polling after each event before it "
                "sleeps (default 0; saves a thread wake-up per call at the price of CPU; 2000 "
                "for the lowest latency, docs/SERVING.md)")
      ->check(CLI::Range(0, 100000));
  c->add_option("--grpc-parse-threads", o->grpc_parse_threads,
                "Threads that read and encode big gRPC inferences (default 2) so that the "
                "polling threads only receive bytes; 0: the polling threads do it")
      ->check(CLI::Range(0, 256));
  c->add_option("--grpc-parse-bytes", o->grpc_parse_min_bytes,
                "gRPC inference messages of at least this many bytes (default 65536) go to the "
                "parse threads; smaller ones are handled on the polling thread")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  c->add_option("--max-request-bytes", o->max_request_bytes,
                "Largest request body accepted (HTTP 413 / gRPC RESOURCE_EXHAUSTED beyond)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 31));
  c->add_option("--max-tensor-elements", o->limits.max_tensor_elements,
                "Largest element count of one input tensor")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  c->add_option("--max-batch-size", o->batching.max_batch_size,
                "Default max rows per request and per merged execution (config.json overrides)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  c->add_option("--max-queue-delay-us", o->batching.max_queue_delay_us,
                "Default dynamic batching delay (config.json overrides)")
      ->check(CLI::Range(int64_t{0}, int64_t{10000000}));
  c->add_option("--max-queue-size", o->batching.max_queue_size,
                "Default queued requests per model version before HTTP 429 / RESOURCE_EXHAUSTED")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  c->add_flag("--access-log", o->access_log, "One JSON line per request on standard error");
  c->add_flag("--strict-startup", o->strict_startup, "Exit when a model fails to load");
  auto dry = std::make_shared<bool>(false);
  c->add_flag("--dry-run", *dry,
              "Print the memory each model version, and each tier of its embedding store, will "
              "use (per instance), and exit (exit status 1 when a model would not load)");
  return [o, dry] {
    if (*dry) return dry_run(*o) == 0 ? 0 : 1;
    // Signals are taken by one waiting thread, never by the serving threads.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);
    serve::Server server(*o);
    server.start();
    std::fprintf(stderr,
                 "dlrec serve: ready; HTTP %s:%d, gRPC %s:%d, metrics %s:%d (repository %s)\n",
                 o->host.c_str(), server.http_port(), o->host.c_str(), server.grpc_port(),
                 o->host.c_str(), server.metrics_port(), o->model_repository.c_str());
    std::fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "dlrec serve: %s received; finishing requests in flight\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop();
    std::fprintf(stderr, "dlrec serve: stopped\n");
    return 0;
  };
}

}  // namespace dlrec::cli
