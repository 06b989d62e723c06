// dlrec push: publishes the embedding rows changed between two weight files as an online update
// (docs/SERVING.md, "Online updates").
#include <cstdio>
#include <memory>

#include "commands.h"
#include "dlrec/core/error.h"
#include "dlrec/train/push.h"

namespace dlrec::cli {

Runner add_push(CLI::App& app) {
  struct Args {
    std::string model, base, weights, redis, stream;
    int64_t chunk_rows = 4096;
    int64_t timeout_ms = 5000;
    uint64_t version = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "push",
      "Publish the embedding rows changed since the last push as the next version of a "
      "Redis Stream that serving stores read (online updates)");
  c->add_option("--model", a->model, "The served model's directory (its tables: model.json)")
      ->required();
  c->add_option("--base", a->base,
                "Weights last pushed or exported (a checkpoint.dlrec or weights.dlrec with the "
                "tables): the diff is against these")
      ->required();
  c->add_option("--weights", a->weights, "The new weights (checkpoint.dlrec or weights.dlrec)")
      ->required();
  c->add_option("--redis", a->redis, "HOST:PORT of the Redis server with the stream")->required();
  c->add_option("--stream", a->stream, "The stream's key (the store config's updates.stream)")
      ->required();
  c->add_option("--chunk-rows", a->chunk_rows, "Rows per stream entry (default 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--timeout-ms", a->timeout_ms, "Redis connect and reply timeout (default 5000)")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}));
  c->add_option("--version", a->version,
                "Publish this version (>= 2) instead of the next one: to publish again, "
                "corrected, a version the stores rejected (default: the next)");
  return [a] {
    const size_t colon = a->redis.rfind(':');
    DLREC_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < a->redis.size() &&
                    a->redis.size() - colon <= 6 &&
                    a->redis.find_first_not_of("0123456789", colon + 1) == std::string::npos,
                "--redis '", a->redis, "': expected HOST:PORT");
    const int port = std::stoi(a->redis.substr(colon + 1));
    DLREC_CHECK(port >= 1 && port <= 65535, "--redis '", a->redis, "': port 1..65535");
    store::StreamAddress at{a->redis.substr(0, colon), port, a->stream, a->timeout_ms};
    const train::PushResult r = train::push_update(train::model_store_tables(a->model), a->base,
                                                   a->weights, at, a->chunk_rows, a->version);
    if (r.version == 0)
      std::printf("push: no row changed; nothing published\n");
    else
      std::printf("push: version %llu, %lld rows -> %s\n",
                  static_cast<unsigned long long>(r.version), static_cast<long long>(r.rows),
                  at.str().c_str());
    return 0;
  };
}

}  // namespace dlrec::cli
