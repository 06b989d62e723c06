// Throughput of io::TextReader alone (parse into RawChunks, nothing else) on an existing
// Criteo-shaped TSV file, for A/B runs of the parser.
//
//   bench_text_reader FILE [threads=1] [repeat=5] [chunk_rows=65536]
//
// Reads FILE `repeat` times with the Criteo schema (13 dense, 26 hexadecimal categorical
// columns) on `threads` threads (0: all cores) and prints MB/s of each run and the best. The
// first run also brings the file into the page cache.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dlrec/core/error.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/schema.h"
#include "dlrec/io/text_reader.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_text_reader FILE [threads=1] [repeat=5] [chunk_rows]\n");
    return 2;
  }
  try {
    const std::string path = argv[1];
    dlrec::set_num_threads(argc > 2 ? std::atoi(argv[2]) : 1);
    const int repeat = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
    dlrec::io::ReadOptions ro;
    if (argc > 4) ro.chunk_rows = std::atoll(argv[4]);
    const dlrec::io::Schema schema = dlrec::io::Schema::criteo();
    double best = 0;
    for (int r = 0; r < repeat; ++r) {
      dlrec::Timer t;
      dlrec::io::TextReader reader({path}, schema, ro);
      dlrec::io::RawChunk chunk;
      uint64_t check = 0;  // a sum over the values, so that nothing is optimized away
      while (reader.next(chunk)) check += chunk.cat_values[0].empty() ? 0 : chunk.cat_values[0][0];
      const double s = t.seconds();
      const auto& st = reader.stats();
      const double mbs = st.bytes / s / 1e6;
      best = std::max(best, mbs);
      std::printf("reader threads=%d rows=%lld %.3fs %.1f MB/s (check %llu)\n", dlrec::num_threads(),
                  static_cast<long long>(st.rows), s, mbs, static_cast<unsigned long long>(check));
    }
    std::printf("best %.1f MB/s\n", best);
  } catch (const dlrec::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
