// Fuzz target: the training shard reader (io::ShardReader: header JSON and layout, footer block
// index, block payloads with their id widths and multi-hot row ends).
//
// Input: 1 selector byte, then the file's bytes.
//   bit 0: fix the checksums (header, every block the footer lists, footer) before reading, so
//          that mutations reach the decoding behind them instead of stopping at the CRC check
//   bits 1-2: rows per read() call (1, 3, 64, 4096)
// At most kMaxRows rows are read (from the start, and the last ones) whatever the file claims.
#include <algorithm>
#include <cstring>
#include <string>

#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"
#include "fuzz_util.h"

namespace {

using namespace dlrec;
constexpr int64_t kMaxRows = 1 << 14;

template <class T>
T get(const std::string& b, uint64_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}
template <class T>
void put(std::string& b, uint64_t at, T v) {
  std::memcpy(&b[at], &v, sizeof v);
}

// Rewrites the CRC-32C fields where the layout (docs/FORMATS.md, "Shard") says they are,
// as far as the file's own offsets allow.
void fix_checksums(std::string& f) {
  const uint64_t size = f.size();
  if (size < 16 + 4 + 24) return;
  const uint64_t json_len = get<uint32_t>(f, 12);  // < 2^32: the sums below cannot wrap
  if (16 + json_len + 4 > size) return;
  put<uint32_t>(f, 16 + json_len, crc32c(f.data() + 8, 8 + json_len));
  const uint64_t header_end = 16 + json_len + 4;
  const uint64_t footer = get<uint64_t>(f, size - 24);
  // (Comparisons written so that no sum of file values can wrap.)
  if (footer < header_end || footer > size - 24 - 16) return;
  const uint64_t nb = get<uint64_t>(f, footer);
  if ((size - 24 - footer - 16) / 16 >= nb) {
    for (uint64_t b = 0; b < nb; ++b) {
      const uint64_t at = get<uint64_t>(f, footer + 24 + b * 16);
      const uint64_t end = b + 1 < nb ? get<uint64_t>(f, footer + 40 + b * 16) : footer;
      if (at < header_end || end > footer || at > end || end - at < 24) continue;
      const uint64_t payload = get<uint64_t>(f, at + 8);
      uint32_t crc = crc32c(f.data() + at, 16);
      if (payload == end - at - 24) crc = crc32c(f.data() + at + 24, payload, crc);
      put<uint32_t>(f, at + 16, crc);
    }
  }
  put<uint32_t>(f, size - 16, crc32c(f.data() + footer, size - 24 - footer));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const uint8_t sel = in.byte();
  std::string bytes(in.rest());
  if (sel & 1) fix_checksums(bytes);
  static const int64_t kStep[4] = {1, 3, 64, 4096};
  const int64_t step = kStep[(sel >> 1) & 3];
  fuzz::MemFile file(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  fuzz::guarded("shard", [&] {
    io::ShardReader reader(file.path());
    const int64_t rows = reader.rows();
    io::Batch b;
    auto read = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; r += step) {
        const int64_t n = std::min(step, end - r);
        reader.read(r, n, b);
        if (b.rows != n || b.labels.size() != static_cast<size_t>(n))
          fuzz::finding("shard", "read() returned another row count than asked");
        const auto& card = reader.layout().cardinalities;
        for (size_t t = 0; t < card.size(); ++t)
          for (int64_t id : b.cat_indices[t])
            if (id < 0 || id >= card[t]) fuzz::finding("shard", "an id outside its cardinality");
      }
    };
    read(0, std::min(rows, kMaxRows));
    if (rows > kMaxRows) read(rows - std::min<int64_t>(step, rows), rows);
  });
  return 0;
}
