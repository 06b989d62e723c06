// Fuzz target: the delimited-text reader (io::TextReader: Criteo TSV, CSV with a header,
// multi-hot lists, hex and string categories) on a memfd (the mapped, parsed-ahead path) or a
// pipe (the block path, whose buffers are on the heap where ASan sees every byte).
//
// Input: 2 selector bytes, then the file's bytes.
//   byte 0: bits 0-1 schema (Criteo 13/26, Criteo 2/3, CSV header + multi-hot + string
//           categories, TSV hex + multi-hot + skip column); bit 2 on_error skip; bit 3 pipe;
//           bits 4-5 chunk_rows (1, 7, 64, 65536); bit 6 61-byte blocks (else 64 KiB); bit 7 max_rows 5
//   byte 1: memfd only: when non-zero, the file is padded with this byte to a multiple of the
//           page size, so that a read past its end leaves the mapping and faults
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/text_reader.h"
#include "fuzz_util.h"

namespace {

using namespace dlrec;

io::Schema schema_for(int which) {
  switch (which) {
    case 0:
      return io::Schema::criteo();
    case 1:
      return io::Schema::criteo(2, 3);
    case 2:
      return io::Schema::from_json(json::parse(R"({"format": "csv", "columns": [
        {"name": "label", "kind": "label"}, {"name": "price", "kind": "dense"},
        {"name": "user", "kind": "categorical"},
        {"name": "tags", "kind": "categorical", "multi_hot": true},
        {"name": "note", "kind": "skip"}]})"));
    default:
      return io::Schema::from_json(json::parse(R"({"format": "criteo", "list_sep": ",",
        "columns": [{"name": "label", "kind": "label"}, {"name": "I1", "kind": "dense"},
        {"name": "x", "kind": "skip"}, {"name": "C1", "kind": "categorical"},
        {"name": "C2", "kind": "categorical", "multi_hot": true}]})"));
  }
}

void read_all(const std::string& path, const io::Schema& schema, const io::ReadOptions& opt) {
  fuzz::guarded("text_reader", [&] {
    io::TextReader reader({path}, schema, opt);
    io::RawChunk chunk;
    int64_t rows = 0;
    while (reader.next(chunk)) {
      // Every row the reader delivers must be whole: CSR offsets within the values.
      if (chunk.num_dense != schema.num_dense() || chunk.num_cat != schema.num_cat())
        fuzz::finding("text_reader", "chunk column counts differ from the schema");
      for (int c = 0; c < chunk.num_cat; ++c) {
        const auto& off = chunk.cat_offsets[c];
        if (off.size() != static_cast<size_t>(chunk.rows) + 1 ||
            off.back() != static_cast<int64_t>(chunk.cat_values[c].size()))
          fuzz::finding("text_reader", "chunk CSR offsets do not match its values");
      }
      rows += chunk.rows;
    }
    if (reader.stats().rows != rows)
      fuzz::finding("text_reader", "stats().rows differs from the rows delivered");
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const uint8_t sel = in.byte();
  const uint8_t pad = in.byte();
  static const io::Schema schemas[4] = {schema_for(0), schema_for(1), schema_for(2), schema_for(3)};
  const io::Schema& schema = schemas[sel & 3];
  io::ReadOptions opt;
  opt.on_error = (sel & 4) ? io::OnError::Skip : io::OnError::Fail;
  static const int64_t kChunkRows[4] = {1, 7, 64, 65536};
  opt.chunk_rows = kChunkRows[(sel >> 4) & 3];
  // The reader allocates its block buffer whatever the input; 64 KiB instead of the default
  // 8 MiB keeps page faults out of every execution.
  opt.block_bytes = (sel & 64) ? 61 : 64u << 10;
  opt.max_rows = (sel & 128) ? 5 : -1;
  const bool pipe = (sel & 8) != 0 && in.size() <= 60000;  // fits the pipe's buffer
  if (pipe) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) fuzz::finding("text_reader", "pipe2 failed");
    const char* p = in.rest().data();
    size_t left = in.size();
    while (left > 0) {
      ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) fuzz::finding("text_reader", "write to pipe failed");
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::close(fds[1]);
    read_all("/proc/self/fd/" + std::to_string(fds[0]), schema, opt);
    ::close(fds[0]);
    return 0;
  }
  std::string bytes(in.rest());
  if (pad != 0 && !bytes.empty()) bytes.resize((bytes.size() + 4095) / 4096 * 4096, char(pad));
  fuzz::MemFile file(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  read_all(file.path(), schema, opt);
  return 0;
}
