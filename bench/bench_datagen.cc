// Throughput of the synthetic data generator (and of the text reader on its output).
//
//   bench_datagen [rows=2000000] [--read]
//
// Generates `rows` Criteo-like rows with the default config into a discarding sink, first on
// one thread, then on all threads, and prints rows/s and MB/s. With --read it also writes the
// rows to a temporary file and times io::TextReader on it (1 thread and all threads).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <streambuf>
#include <string>

#include <unistd.h>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/text_reader.h"

namespace {

// Counts and discards everything written to it.
class NullBuffer : public std::streambuf {
 protected:
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
  int overflow(int c) override { return c; }
};

void bench_generate(const dlrec::io::DatagenConfig& cfg, int threads) {
  dlrec::set_num_threads(threads);
  NullBuffer nb;
  std::ostream sink(&nb);
  dlrec::Timer t;
  dlrec::io::DatagenResult r = dlrec::io::generate(cfg, sink);
  const double s = t.seconds();
  std::printf("datagen  threads=%-2d rows=%lld  %.2fs  %.3fM rows/s  %.1f MB/s  "
              "(positive rate %.4f, signal AUC %.4f)\n",
              dlrec::num_threads(), static_cast<long long>(r.rows), s, r.rows / s / 1e6,
              r.bytes / s / 1e6, r.positive_rate, r.signal_auc);
}

void bench_read(const std::string& path, const dlrec::io::Schema& schema, int threads) {
  dlrec::set_num_threads(threads);
  dlrec::Timer t;
  dlrec::io::TextReader reader({path}, schema);
  dlrec::io::RawChunk chunk;
  while (reader.next(chunk)) {
  }
  const double s = t.seconds();
  const auto& st = reader.stats();
  std::printf("reader   threads=%-2d rows=%lld  %.2fs  %.3fM rows/s  %.1f MB/s\n",
              dlrec::num_threads(), static_cast<long long>(st.rows), s, st.rows / s / 1e6,
              st.bytes / s / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    dlrec::io::DatagenConfig cfg;
    cfg.rows = 2000000;
    bool read = false;
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--read") == 0)
        read = true;
      else
        cfg.rows = std::atoll(argv[i]);
    }
    bench_generate(cfg, 1);
    bench_generate(cfg, 0);
    if (read) {
      const char* tmp = std::getenv("TMPDIR");
      const std::string path =
          std::string(tmp ? tmp : "/tmp") + "/bench_datagen." + std::to_string(::getpid()) + ".tsv";
      dlrec::set_num_threads(0);
      dlrec::io::generate_file(cfg, path);
      bench_read(path, cfg.schema(), 1);
      bench_read(path, cfg.schema(), 0);
      std::remove(path.c_str());
    }
  } catch (const dlrec::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
