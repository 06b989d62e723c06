// dlrec training shards, format version 2 (byte-exact layout in docs/FORMATS.md; version 1 is
// still read).
//
//   file    = header block* footer trailer
//   header  = "DLRSHARD" u32 version u32 json_len json u32 crc32c(version..json)
//   block   = u64 rows u64 payload_bytes u32 crc32c(rows, payload_bytes, payload) u32 0 payload
//   payload = labels f32[rows] dense f32[rows*num_dense]
//             per categorical feature t: (multi-hot only) u32 row_end[rows], then ids
//             (u8, u16, i32 or i64: the narrowest holding every id of the feature's
//             cardinality; version 1: i32 when cardinality <= 2^31 else i64)[n_ids]
//   footer  = u64 num_blocks u64 total_rows (u64 first_row, u64 file_offset)[num_blocks]
//   trailer = u64 footer_offset u32 crc32c(footer) u32 0 "DLRSEND\0"
//
// All integers little-endian. The trailer sits at a fixed distance from the end so a reader
// finds the block index without scanning, and a truncated file (no trailer) is detected at open.
#include "dlrec/io/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <exception>
#include <future>
#include <mutex>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"

namespace dlrec::io {

namespace {

constexpr char kMagic[8] = {'D', 'L', 'R', 'S', 'H', 'A', 'R', 'D'};
constexpr char kEndMagic[8] = {'D', 'L', 'R', 'S', 'E', 'N', 'D', '\0'};
constexpr uint32_t kVersion = 2;  // written; 1 and 2 are read
constexpr size_t kBlockHeaderBytes = 24;
constexpr size_t kTrailerBytes = 24;
constexpr int64_t kInt32Cardinality = int64_t{1} << 31;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are little-endian");

std::string base_name(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}

// Bytes per id of a feature of `cardinality` in a file of format `version`: version 2 the
// narrowest of u8/u16/i32/i64 holding ids [0, cardinality); version 1 i32 or i64.
size_t id_width(int64_t cardinality, uint32_t version) {
  if (cardinality > kInt32Cardinality) return 8;
  if (version >= 2 && cardinality <= 256) return 1;
  if (version >= 2 && cardinality <= 65536) return 2;
  return 4;
}

// Stores n ids (checked to fit) as `width`-byte integers at p (any alignment).
void store_ids(char* p, const int64_t* ids, int64_t n, size_t width) {
  switch (width) {
    case 1:
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<char>(ids[i]);
      break;
    case 2:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t v = static_cast<uint16_t>(ids[i]);
        std::memcpy(p + 2 * i, &v, 2);
      }
      break;
    case 4:
      for (int64_t i = 0; i < n; ++i) {
        const int32_t v = static_cast<int32_t>(ids[i]);
        std::memcpy(p + 4 * i, &v, 4);
      }
      break;
    default:
      std::memcpy(p, ids, static_cast<size_t>(n) * 8);
  }
}

// Loads n `width`-byte ids from p into out; false when one is not in [0, cardinality).
bool load_ids(const char* p, int64_t n, size_t width, int64_t cardinality, int64_t* out) {
  const uint64_t card = static_cast<uint64_t>(cardinality);
  uint64_t bad = 0;
  switch (width) {
    case 1:
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t v = static_cast<uint8_t>(p[i]);
        bad |= v >= card;
        out[i] = v;
      }
      break;
    case 2:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        bad |= v >= card;
        out[i] = v;
      }
      break;
    case 4:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        bad |= static_cast<uint64_t>(static_cast<int64_t>(v)) >= card;  // negative: huge
        out[i] = v;
      }
      break;
    default:
      std::memcpy(out, p, static_cast<size_t>(n) * 8);
      for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint64_t>(out[i]) >= card;
  }
  return bad == 0;
}

template <class T>
void put(std::string& buf, T v) {
  buf.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <class T>
T get_at(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string hex32(uint32_t v) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

void validate_layout(const ShardLayout& l, const std::string& where) {
  DLREC_CHECK(l.num_dense >= 0, where, ": negative num_dense");
  DLREC_CHECK(l.cardinalities.size() == l.multi_hot.size(), where,
              ": layout has ", l.cardinalities.size(), " cardinalities but ", l.multi_hot.size(),
              " multi_hot flags");
  for (size_t t = 0; t < l.cardinalities.size(); ++t)
    DLREC_CHECK(l.cardinalities[t] >= 1, where, ": categorical feature ", t,
                " has cardinality ", l.cardinalities[t], " (must be >= 1)");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ShardLayout

json ShardLayout::to_json() const {
  json mh = json::array();
  for (bool b : multi_hot) mh.push_back(static_cast<bool>(b));
  return {{"num_dense", num_dense}, {"cardinalities", cardinalities}, {"multi_hot", mh}};
}

ShardLayout ShardLayout::from_json(const json& j) {
  ConfigReader r(j, "layout");
  ShardLayout l;
  l.num_dense = static_cast<int>(r.get_int_range("num_dense", 0, 0, 1 << 30));
  l.cardinalities = r.require<std::vector<int64_t>>("cardinalities");
  l.multi_hot = r.get<std::vector<bool>>("multi_hot",
                                         std::vector<bool>(l.cardinalities.size(), false));
  r.finish();
  validate_layout(l, "layout");
  return l;
}

// ---------------------------------------------------------------------------------------------
// ShardWriter

struct ShardWriter::Impl {
  std::string path, name;
  ShardLayout layout;
  int64_t block_rows;
  AtomicFile file;
  Batch pending;
  Batch spare;                          // write_parts: the next pending rows are built here
  // write_parts: encoded blocks, two sets: one being written to the file by `appending` while
  // the next call encodes into the other (kept between calls: no new pages to fault in).
  std::vector<std::string> block_bufs[2];
  int side = 0;
  uint64_t file_pos = 0;  // bytes written or being written (the next block's file offset)
  std::string buf;
  std::vector<std::pair<uint64_t, uint64_t>> index;  // (first_row, file_offset) per block
  int64_t rows = 0;     // rows accepted (written + pending)
  int64_t written = 0;  // rows in blocks on disk
  bool closed = false;

  // A read-only descriptor of AtomicFile's temporary file ("<path>.tmp.<pid>") to start the
  // disk writeback of the blocks as they come (sync_file_range), so that the fsync of
  // close() finds most of the file already written. -1 when it cannot be opened (no hint).
  int wb_fd = -1;
  uint64_t wb_done = 0;  // bytes whose writeback was started

  Impl(const std::string& p, ShardLayout l, int64_t br)
      : path(p), name(base_name(p)), layout(std::move(l)), block_rows(br), file(p) {
    wb_fd = ::open((p + ".tmp." + std::to_string(::getpid())).c_str(), O_RDONLY | O_CLOEXEC);
  }
  ~Impl() {
    if (appending.valid()) appending.wait();  // its error is dropped with the file
    stop_direct();
    if (wb_fd >= 0) ::close(wb_fd);
  }

  // The blocks of the last write_parts call being written (std::async), or nothing.
  std::future<void> appending;
  Times times;  // file_write is updated by the helper; read once it is done (wait_append)
  // Waits for those blocks; rethrows a write error.
  void wait_append() {
    if (!appending.valid()) return;
    Timer t;
    appending.get();
    times.append_wait += t.seconds();
  }

  // Starts writing back what was written since the last call, every 8 MB (a hint: errors show
  // at the fsync of close()).
  void start_writeback() {
    const uint64_t n = file.bytes_written();
    if (wb_fd < 0 || n - wb_done < (uint64_t{8} << 20)) return;
    ::sync_file_range(wb_fd, static_cast<off_t>(wb_done), static_cast<off_t>(n - wb_done),
                      SYNC_FILE_RANGE_WRITE);
    wb_done = n;
  }

  void write_header() {
    json h = {{"format", "dlrec-shard"}, {"layout", layout.to_json()},
              {"block_rows", block_rows}};
    std::string js = h.dump();
    buf.clear();
    buf.append(kMagic, 8);
    put<uint32_t>(buf, kVersion);
    put<uint32_t>(buf, static_cast<uint32_t>(js.size()));
    buf += js;
    put<uint32_t>(buf, crc32c(buf.data() + 8, buf.size() - 8));
    file.write(buf);
    file_pos = file.bytes_written();
  }

  // Checks the batch's structure and rows [begin, end) (ids in range, one id per one-hot row);
  // messages count rows from `first_row` (the shard row of `begin`).
  void validate(const Batch& b, int64_t begin, int64_t end, int64_t first_row) const {
    const int nc = static_cast<int>(layout.cardinalities.size());
    DLREC_CHECK(b.num_dense == layout.num_dense && b.num_cat() == nc, "shard '", name,
                "': batch has ", b.num_dense, " dense and ", b.num_cat(),
                " categorical features, the layout ", layout.num_dense, " and ", nc);
    DLREC_CHECK(static_cast<int64_t>(b.labels.size()) == b.rows &&
                    static_cast<int64_t>(b.dense.size()) == b.rows * b.num_dense,
                "shard '", name, "': batch of ", b.rows, " rows has ", b.labels.size(),
                " labels and ", b.dense.size(), " dense values");
    DLREC_CHECK(0 <= begin && begin <= end && end <= b.rows, "shard '", name, "': rows [", begin,
                ", ", end, ") of a batch of ", b.rows);
    for (int t = 0; t < nc; ++t) {
      const auto& off = b.cat_offsets[t];
      const auto& ids = b.cat_indices[t];
      DLREC_CHECK(static_cast<int64_t>(off.size()) == b.rows + 1 && off[0] == 0 &&
                      off[b.rows] == static_cast<int64_t>(ids.size()),
                  "shard '", name, "': categorical feature ", t, " has inconsistent offsets");
      const int64_t card = layout.cardinalities[t];
      if (!layout.multi_hot[t]) {
        for (int64_t r = begin; r < end; ++r)
          if (off[r + 1] - off[r] != 1)
            fail("shard '", name, "': one-hot categorical feature ", t, " row ",
                 first_row + r - begin, " has ", off[r + 1] - off[r], " ids (must be exactly 1)");
      } else {
        for (int64_t r = begin; r < end; ++r)
          if (off[r + 1] < off[r])
            fail("shard '", name, "': categorical feature ", t, " row ", first_row + r - begin,
                 " has decreasing offsets");
      }
      for (int64_t i = off[begin]; i < off[end]; ++i) {
        if (static_cast<uint64_t>(ids[i]) >= static_cast<uint64_t>(card)) {
          int64_t r = std::upper_bound(off.begin(), off.end(), i) - off.begin() - 1;
          fail("shard '", name, "': categorical feature ", t, " row ", first_row + r - begin,
               ": id ", ids[i], " is out of range [0, ", card, ")");
        }
      }
    }
  }
  void validate(const Batch& b) const { validate(b, 0, b.rows, rows); }

  // Where the sections of a block start: labels and dense values (section 0), then each
  // categorical feature (section 1 + t); the last entry is the block's size.
  std::vector<size_t> block_sections(const std::vector<BatchRows>& segs, int64_t n) const {
    const int nc = static_cast<int>(layout.cardinalities.size());
    std::vector<size_t> at(nc + 2);
    at[0] = kBlockHeaderBytes;
    at[1] = at[0] + static_cast<size_t>(n) * 4 * (1 + layout.num_dense);
    for (int t = 0; t < nc; ++t) {
      int64_t n_ids = 0;
      for (const auto& s : segs) n_ids += s.batch->cat_offsets[t][s.end] - s.batch->cat_offsets[t][s.begin];
      if (layout.multi_hot[t])
        DLREC_CHECK(n_ids <= int64_t{UINT32_MAX}, "shard '", name, "': block ", index.size(),
                    " holds ", n_ids, " ids of feature ", t, "; use fewer rows per block");
      at[t + 2] = at[t + 1] + (layout.multi_hot[t] ? static_cast<size_t>(n) * 4 : 0) +
                  static_cast<size_t>(n_ids) * id_width(layout.cardinalities[t], kVersion);
    }
    return at;
  }

  // Encodes section `sec` of the block made of `segs` (n rows) at dst.
  void encode_section(const std::vector<BatchRows>& segs, int64_t n, int sec, char* dst) const {
    const int nd = layout.num_dense;
    if (sec == 0) {  // labels, then dense values
      char* lab = dst;
      char* den = dst + n * 4;
      for (const auto& s : segs) {
        const int64_t m = s.end - s.begin;
        std::memcpy(lab, s.batch->labels.data() + s.begin, m * 4);
        std::memcpy(den, s.batch->dense.data() + s.begin * nd, m * nd * 4);
        lab += m * 4;
        den += m * nd * 4;
      }
      return;
    }
    const int t = sec - 1;
    char* p = dst;
    if (layout.multi_hot[t]) {  // row ends, counted from the block's first id
      int64_t before = 0;
      for (const auto& s : segs) {
        const auto& off = s.batch->cat_offsets[t];
        for (int64_t r = s.begin; r < s.end; ++r) {
          const uint32_t e = static_cast<uint32_t>(before + off[r + 1] - off[s.begin]);
          std::memcpy(p, &e, 4);
          p += 4;
        }
        before += off[s.end] - off[s.begin];
      }
    }
    const size_t width = id_width(layout.cardinalities[t], kVersion);
    for (const auto& s : segs) {
      const auto& off = s.batch->cat_offsets[t];
      const int64_t lo = off[s.begin], hi = off[s.end];
      store_ids(p, s.batch->cat_indices[t].data() + lo, hi - lo, width);
      p += (hi - lo) * width;
    }
  }

  // The block header (rows, payload size, checksum) of an encoded block of n rows.
  static void finish_block(std::string& buf, int64_t n) {
    const uint64_t rows64 = static_cast<uint64_t>(n);
    const uint64_t payload = buf.size() - kBlockHeaderBytes;
    std::memcpy(&buf[0], &rows64, 8);
    std::memcpy(&buf[8], &payload, 8);
    uint32_t crc = crc32c(buf.data(), 16);
    crc = crc32c(buf.data() + kBlockHeaderBytes, payload, crc);
    std::memcpy(&buf[16], &crc, 4);
    std::memset(&buf[20], 0, 4);
  }

  void append_block(const std::string& block, int64_t n) {
    wait_append();
    index.emplace_back(static_cast<uint64_t>(written), file_pos);
    file.write(block);
    file_pos += block.size();
    written += n;
  }

  // Encodes rows [begin, end) of `src` as one block.
  void flush_block(const Batch& src, int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    if (n <= 0) return;
    const std::vector<BatchRows> segs = {{&src, begin, end}};
    const std::vector<size_t> at = block_sections(segs, n);
    buf.assign(at.back(), '\0');
    for (size_t sec = 0; sec + 1 < at.size(); ++sec)
      encode_section(segs, n, static_cast<int>(sec), &buf[at[sec]]);
    finish_block(buf, n);
    append_block(buf, n);
  }

  // write_parts: the pending rows and the parts as one row sequence; whole blocks are encoded
  // on all cores (one task per block section, then one per block for the checksum) and written
  // in order; the rows past the last whole block become the pending rows.
  void write_parts(const std::vector<BatchRows>& parts) {
    const size_t np = parts.size();
    std::vector<int64_t> first(np + 1, rows);
    for (size_t i = 0; i < np; ++i) first[i + 1] = first[i] + (parts[i].end - parts[i].begin);
    std::vector<std::exception_ptr> errors(np);
    parallel_for(0, static_cast<int64_t>(np), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        try {
          DLREC_CHECK(parts[i].batch, "shard '", name, "': a part without a batch");
          validate(*parts[i].batch, parts[i].begin, parts[i].end, first[i]);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    });
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);  // the first bad part in order; nothing written
    std::vector<BatchRows> seq;
    if (pending.rows > 0) seq.push_back({&pending, 0, pending.rows});
    for (const auto& p : parts)
      if (p.end > p.begin) seq.push_back(p);
    const int64_t total = pending.rows + (first[np] - rows);
    const int64_t nblocks = total / block_rows;
    std::vector<std::vector<BatchRows>> blocks(nblocks);
    size_t s = 0;
    int64_t at = seq.empty() ? 0 : seq[0].begin;
    for (int64_t k = 0; k < nblocks; ++k) {
      for (int64_t need = block_rows; need > 0;) {
        const int64_t take = std::min(need, seq[s].end - at);
        blocks[k].push_back({seq[s].batch, at, at + take});
        need -= take;
        at += take;
        if (at == seq[s].end && ++s < seq.size()) at = seq[s].begin;
      }
    }
    if (nblocks > 0) {
      const int nsec = static_cast<int>(layout.cardinalities.size()) + 1;
      std::vector<std::vector<size_t>> layouts(nblocks);
      side ^= 1;  // the other set may still be being written
      std::vector<std::string>& bufs = block_bufs[side];
      if (static_cast<int64_t>(bufs.size()) < nblocks) bufs.resize(nblocks);
      for (int64_t k = 0; k < nblocks; ++k) {
        layouts[k] = block_sections(blocks[k], block_rows);
        bufs[k].resize(layouts[k].back());
      }
      parallel_for(0, nblocks * nsec, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t k = i / nsec;
          const int sec = static_cast<int>(i % nsec);
          encode_section(blocks[k], block_rows, sec, &bufs[k][layouts[k][sec]]);
        }
      });
      parallel_for(0, nblocks, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t k = lo; k < hi; ++k) finish_block(bufs[k], block_rows);
      });
      // The blocks go to the file on a helper thread (their offsets are known now), so that the
      // caller goes on (encodes the next rows) while the kernel copies these.
      for (int64_t k = 0; k < nblocks; ++k) {
        index.emplace_back(static_cast<uint64_t>(written), file_pos);
        file_pos += bufs[k].size();
        written += block_rows;
      }
      wait_append();
      appending = std::async(std::launch::async, [this, &bufs, nblocks] {
        Timer t;
        for (int64_t k = 0; k < nblocks; ++k) file.write(bufs[k]);
        start_writeback();
        times.file_write += t.seconds();
      });
    }
    Batch& rest = spare;  // the previous pending rows' vectors, reused
    rest.reset(layout.num_dense, static_cast<int>(layout.cardinalities.size()));
    for (; s < seq.size(); ++s, at = s < seq.size() ? seq[s].begin : 0)
      if (seq[s].end > at) rest.append_rows(*seq[s].batch, at, seq[s].end);
    std::swap(pending, rest);
    rows = first[np];
  }

  // ---- direct mode (reserve/write_at): blocks laid out for block_rows rows, filled by many threads
  struct DirectBlock {
    std::string buf;               // the full block's layout (a last, partial block is packed)
    std::atomic<int64_t> in{0};    // rows written so far
    int64_t reserved = 0;          // rows reserved in it
    bool done = false;             // checksummed (under dmu)
  };
  bool direct = false;
  std::atomic<int64_t> rows_done{0};  // rows whose write_at returned
  std::vector<size_t> dat;  // section offsets of a full block (block_sections for one-hot)
  std::mutex dmu;
  std::condition_variable dcv;  // the file thread's queue, and reserve()'s wait for room
  std::deque<std::unique_ptr<DirectBlock>> dblocks;  // not yet queued for the file; from dfirst
  int64_t dfirst = 0;
  std::deque<std::unique_ptr<DirectBlock>> dqueue;  // finished, in order, for the file thread
  std::vector<std::string> dfree;                   // buffers written, to reuse
  std::thread dthread;
  bool dstop = false;
  std::exception_ptr derror;
  static constexpr size_t kDirectQueue = 8;  // finished blocks waiting for the file, at most

  // Section offsets of a block of n rows of a one-hot layout (block_sections without the id
  // counts: one id per row).
  std::vector<size_t> one_hot_sections(int64_t n) const {
    const int nc = static_cast<int>(layout.cardinalities.size());
    std::vector<size_t> at(nc + 2);
    at[0] = kBlockHeaderBytes;
    at[1] = at[0] + static_cast<size_t>(n) * 4 * (1 + layout.num_dense);
    for (int t = 0; t < nc; ++t) at[t + 2] = at[t + 1] + static_cast<size_t>(n) * id_bytes(t);
    return at;
  }
  void start_direct() {
    direct = true;
    dat = one_hot_sections(block_rows);
    dthread = std::thread([this] { direct_file_loop(); });
    wbthread = std::thread([this] { writeback_loop(); });
  }
  // Direct mode: the disk writeback of what the file thread wrote is started every 8 MB on a
  // thread of its own (as start_writeback() does inline otherwise), so that the file thread
  // only copies (16-core host: file-thread seconds 0.32-0.45 instead of 0.41-0.75 per 1.28 GB).
  std::mutex wbm;
  std::condition_variable wbcv;
  uint64_t wb_target = 0;
  bool wb_stop = false;
  std::thread wbthread;
  void writeback_loop() {
    for (;;) {
      uint64_t n;
      {
        std::unique_lock<std::mutex> l(wbm);
        wbcv.wait(l, [&] { return wb_stop || wb_target - wb_done >= (uint64_t{8} << 20); });
        if (wb_stop) return;
        n = wb_target;
      }
      if (wb_fd >= 0)
        ::sync_file_range(wb_fd, static_cast<off_t>(wb_done), static_cast<off_t>(n - wb_done),
                        SYNC_FILE_RANGE_WRITE);
      wb_done = n;
    }
  }
  size_t id_bytes(int t) const { return id_width(layout.cardinalities[t], kVersion); }
  void stop_direct() {
    if (!dthread.joinable()) return;
    {
      std::lock_guard<std::mutex> g(dmu);
      dstop = true;
    }
    dcv.notify_all();
    dthread.join();
    if (wbthread.joinable()) {
      {
        std::lock_guard<std::mutex> g(wbm);
        wb_stop = true;
      }
      wbcv.notify_all();
      wbthread.join();
    }
  }
  // The file thread: writes the finished blocks in order.
  void direct_file_loop() {
    for (;;) {
      std::unique_ptr<DirectBlock> b;
      {
        std::unique_lock<std::mutex> l(dmu);
        dcv.wait(l, [&] { return dstop || !dqueue.empty(); });
        if (dqueue.empty()) return;
        b = std::move(dqueue.front());
        dqueue.pop_front();
      }
      if (!derror) {
        try {
          Timer t;
          file.write(b->buf);
          {
            std::lock_guard<std::mutex> g(wbm);
            wb_target = file.bytes_written();
          }
          wbcv.notify_one();
          times.file_write += t.seconds();
        } catch (...) {
          std::lock_guard<std::mutex> g(dmu);
          derror = std::current_exception();
        }
      }
      {
        std::lock_guard<std::mutex> g(dmu);
        dfree.push_back(std::move(b->buf));
      }
      dcv.notify_all();
    }
  }
  // Under dmu: hands the leading finished blocks to the file thread (offsets and index now).
  void queue_done_blocks() {
    bool any = false;
    while (!dblocks.empty() && dblocks.front()->done) {
      std::unique_ptr<DirectBlock> b = std::move(dblocks.front());
      dblocks.pop_front();
      ++dfirst;
      index.emplace_back(static_cast<uint64_t>(written), file_pos);
      file_pos += b->buf.size();
      written += b->reserved;
      dqueue.push_back(std::move(b));
      any = true;
    }
    if (any) dcv.notify_all();
  }
  int64_t direct_reserve(int64_t n) {
    std::unique_lock<std::mutex> l(dmu);
    Timer t;
    dcv.wait(l, [&] { return derror || dqueue.size() < kDirectQueue; });
    times.append_wait += t.seconds();
    if (derror) std::rethrow_exception(derror);
    const int64_t first = rows;
    for (int64_t r = rows; r < rows + n;) {
      const int64_t k = r / block_rows;
      if (k - dfirst >= static_cast<int64_t>(dblocks.size())) {
        auto b = std::make_unique<DirectBlock>();
        if (!dfree.empty()) {
          b->buf = std::move(dfree.back());
          dfree.pop_back();
        }
        b->buf.resize(dat.back());
        dblocks.push_back(std::move(b));
      }
      const int64_t take = std::min(rows + n - r, (k + 1) * block_rows - r);
      dblocks[k - dfirst]->reserved += take;
      r += take;
    }
    rows += n;
    return first;
  }
  // Encodes rows [begin, begin + n) of b (validated) at rows [r0, r0 + n) of a full block's layout.
  void encode_direct(const Batch& b, int64_t begin, int64_t n, int64_t r0, char* buf) const {
    const int nd = layout.num_dense;
    std::memcpy(buf + dat[0] + r0 * 4, b.labels.data() + begin, n * 4);
    std::memcpy(buf + dat[0] + block_rows * 4 + r0 * nd * 4, b.dense.data() + begin * nd,
                n * nd * 4);
    for (int t = 0; t + 2 < static_cast<int>(dat.size()); ++t) {
      const int64_t* ids = b.cat_indices[t].data() + b.cat_offsets[t][begin];
      const size_t width = id_bytes(t);
      store_ids(buf + dat[t + 1] + r0 * width, ids, n, width);
    }
  }
  void direct_put(const Batch& b, int64_t begin, int64_t end, int64_t at) {
    validate(b, begin, end, at);
    for (int64_t r = at; r < at + (end - begin);) {
      const int64_t k = r / block_rows;
      DirectBlock* blk;
      {
        std::lock_guard<std::mutex> g(dmu);
        DLREC_CHECK(k >= dfirst && k - dfirst < static_cast<int64_t>(dblocks.size()), "shard '",
                    name, "': row ", r, " was not reserved or is already written");
        blk = dblocks[k - dfirst].get();
      }
      const int64_t take = std::min(at + (end - begin) - r, (k + 1) * block_rows - r);
      encode_direct(b, begin + (r - at), take, r - k * block_rows, blk->buf.data());
      if (blk->in.fetch_add(take) + take == block_rows) finish_direct(blk);
      r += take;
    }
    rows_done += end - begin;
  }
  // A block whose rows are all in: packs a partial one, checksums it, queues it (in order).
  void finish_direct(DirectBlock* blk) {
    const int64_t n = blk->reserved;
    if (n < block_rows) {  // the sections of n rows, moved down (each starts at or before its old place)
      const std::vector<size_t> at = one_hot_sections(n);
      char* p = blk->buf.data();
      std::memmove(p + at[0] + n * 4, p + dat[0] + block_rows * 4, n * layout.num_dense * 4);
      for (size_t sec = 2; sec < dat.size(); ++sec)
        std::memmove(p + at[sec - 1], p + dat[sec - 1], at[sec] - at[sec - 1]);
      blk->buf.resize(at.back());
    }
    finish_block(blk->buf, n);
    std::lock_guard<std::mutex> g(dmu);
    blk->done = true;
    queue_done_blocks();
  }
  // close(): the last block (partial), then the file thread's queue; rethrows a write error.
  void close_direct() {
    DirectBlock* last = nullptr;
    {
      std::lock_guard<std::mutex> g(dmu);
      int64_t missing = 0;
      for (const auto& b : dblocks) {
        missing += b->reserved - b->in.load();
        if (!b->done && b->reserved < block_rows) last = b.get();  // full ones: write_at's
      }
      DLREC_CHECK(missing == 0, "shard '", name, "': closed with ", missing,
                  " reserved rows not written");
    }
    if (last && last->reserved > 0) finish_direct(last);
    stop_direct();
    if (derror) std::rethrow_exception(derror);
    dfree.clear();
  }

  void flush_full_blocks(bool all) {
    int64_t begin = 0;
    while (pending.rows - begin >= block_rows || (all && pending.rows > begin)) {
      int64_t end = std::min(pending.rows, begin + block_rows);
      flush_block(pending, begin, end);
      begin = end;
    }
    if (begin > 0) {
      Batch rest;
      rest.reset(layout.num_dense, static_cast<int>(layout.cardinalities.size()));
      rest.append_rows(pending, begin, pending.rows);
      pending = std::move(rest);
    }
  }
};

ShardWriter::ShardWriter(const std::string& path, ShardLayout layout, int64_t block_rows) {
  validate_layout(layout, "shard '" + base_name(path) + "'");
  DLREC_CHECK(block_rows >= 1, "shard '", base_name(path), "': block_rows must be >= 1");
  impl_ = std::make_unique<Impl>(path, std::move(layout), block_rows);
  impl_->pending.reset(impl_->layout.num_dense,
                       static_cast<int>(impl_->layout.cardinalities.size()));
  impl_->write_header();
}

ShardWriter::~ShardWriter() = default;  // without close(), AtomicFile drops the temporary file

void ShardWriter::write(const Batch& batch) {
  Impl& m = *impl_;
  DLREC_CHECK(!m.closed, "shard '", m.name, "': write after close");
  DLREC_CHECK(!m.direct, "shard '", m.name, "': write after reserve/write_at");
  m.validate(batch);
  if (m.pending.rows == 0 && batch.rows >= m.block_rows) {
    // Whole blocks straight from the caller's batch; only the remainder is copied.
    int64_t begin = 0;
    for (; batch.rows - begin >= m.block_rows; begin += m.block_rows)
      m.flush_block(batch, begin, begin + m.block_rows);
    m.pending.append_rows(batch, begin, batch.rows);
  } else {
    m.pending.append(batch);
    m.flush_full_blocks(false);
  }
  m.rows += batch.rows;
}

void ShardWriter::write_parts(const std::vector<BatchRows>& parts) {
  DLREC_CHECK(!impl_->closed, "shard '", impl_->name, "': write after close");
  DLREC_CHECK(!impl_->direct, "shard '", impl_->name, "': write after reserve/write_at");
  impl_->write_parts(parts);
}

int64_t ShardWriter::unwritten() const {
  Impl& m = *impl_;
  if (!m.direct) return 0;
  std::lock_guard<std::mutex> g(m.dmu);
  return m.rows - m.rows_done;
}

bool ShardWriter::direct_ok() const {
  for (bool mh : impl_->layout.multi_hot)
    if (mh) return false;
  return true;
}

int64_t ShardWriter::reserve(int64_t n) {
  Impl& m = *impl_;
  DLREC_CHECK(!m.closed, "shard '", m.name, "': reserve after close");
  DLREC_CHECK(n >= 0, "shard '", m.name, "': reserve of ", n, " rows");
  if (!m.direct) {
    DLREC_CHECK(direct_ok(), "shard '", m.name, "': reserve/write_at need one-hot features only");
    DLREC_CHECK(m.rows == 0 && m.index.empty(), "shard '", m.name,
                "': reserve/write_at after write()/write_parts()");
    m.start_direct();
  }
  return m.direct_reserve(n);
}

void ShardWriter::write_at(const Batch& b, int64_t begin, int64_t end, int64_t at) {
  Impl& m = *impl_;
  DLREC_CHECK(m.direct && !m.closed, "shard '", m.name, "': write_at without reserve, or after close");
  int64_t reserved;
  {
    std::lock_guard<std::mutex> g(m.dmu);  // reserve() may run meanwhile
    reserved = m.rows;
  }
  DLREC_CHECK(0 <= begin && begin <= end && end <= b.rows && at >= 0 && at + (end - begin) <= reserved,
              "shard '", m.name, "': write_at of rows [", begin, ", ", end, ") of a batch of ", b.rows,
              " at row ", at, " of ", reserved, " reserved");
  m.direct_put(b, begin, end, at);
}

void ShardWriter::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  if (m.direct) m.close_direct();
  m.wait_append();
  m.flush_full_blocks(true);
  const uint64_t footer_offset = m.file_pos;
  std::string& b = m.buf;
  b.clear();
  put<uint64_t>(b, m.index.size());
  put<uint64_t>(b, static_cast<uint64_t>(m.written));
  for (auto& [row, off] : m.index) {
    put<uint64_t>(b, row);
    put<uint64_t>(b, off);
  }
  const uint32_t crc = crc32c(b.data(), b.size());
  put<uint64_t>(b, footer_offset);
  put<uint32_t>(b, crc);
  put<uint32_t>(b, 0);
  b.append(kEndMagic, 8);
  m.file.write(b);
  m.file.commit();
  m.closed = true;
  // A closed writer may be kept alive for a while (the ETL closes full files on a helper thread
  // and collects them at the end): it keeps none of its encoding buffers.
  for (auto& set : m.block_bufs) std::vector<std::string>().swap(set);
  m.pending = Batch();
  m.spare = Batch();
  std::string().swap(m.buf);
}

int64_t ShardWriter::rows() const { return impl_->rows; }

ShardWriter::Times ShardWriter::times() const { return impl_->times; }

// ---------------------------------------------------------------------------------------------
// ShardReader

struct ShardReader::Impl {
  std::string path, name;
  int fd = -1;
  uint64_t size = 0;
  uint32_t file_version = 0;  // the file's format version (the width of its ids)
  ShardLayout layout;
  int64_t rows = 0;
  std::vector<uint64_t> first_row;  // per block, plus total at the end
  std::vector<uint64_t> offset;     // per block, plus footer offset at the end
  // The last block read, verified: its payload and where each section starts.
  int64_t cached = -1;
  std::string block;
  std::vector<size_t> off_pos, ids_pos;  // per feature, byte positions inside `block`
  std::vector<int64_t> n_ids;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  void pread_all(void* dst, size_t n, uint64_t at, const std::string& what) const {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd, p, n, static_cast<off_t>(at));
      if (got < 0) {
        if (errno == EINTR) continue;
        fail("shard '", name, "': reading ", what, " failed: ", std::strerror(errno));
      }
      if (got == 0) fail("shard '", name, "': truncated file (", what, " is cut off)");
      p += got;
      n -= static_cast<size_t>(got);
      at += static_cast<uint64_t>(got);
    }
  }

  void open() {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open shard '", path, "': ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) fail("cannot stat shard '", path, "': ", std::strerror(errno));
    size = static_cast<uint64_t>(st.st_size);

    char head[16];
    if (size < 16) {
      std::string got(size, '\0');
      if (size) pread_all(&got[0], size, 0, "header");
      if (got.compare(0, std::min<size_t>(8, size), std::string(kMagic, 8), 0,
                      std::min<size_t>(8, size)) != 0)
        fail("shard '", name, "': bad magic (not a dlrec shard)");
      fail("shard '", name, "': truncated file (", size, " bytes)");
    }
    pread_all(head, 16, 0, "header");
    if (std::memcmp(head, kMagic, 8) != 0) fail("shard '", name, "': bad magic (not a dlrec shard)");
    const uint32_t version = get_at<uint32_t>(head + 8);
    if (version != 1 && version != kVersion)
      fail("shard '", name, "': unsupported format version ", version, " (this build reads 1 "
           "and ", kVersion, ")");
    file_version = version;
    const uint32_t json_len = get_at<uint32_t>(head + 12);
    if (16 + uint64_t{json_len} + 4 + kTrailerBytes > size)
      fail("shard '", name, "': truncated file (header of ", json_len, " bytes, file of ", size,
           " bytes)");
    std::string hdr(16 + json_len + 4, '\0');
    pread_all(&hdr[0], hdr.size(), 0, "header");
    const uint32_t stored = get_at<uint32_t>(hdr.data() + 16 + json_len);
    const uint32_t computed = crc32c(hdr.data() + 8, 8 + json_len);
    if (stored != computed)
      fail("shard '", name, "' header: checksum mismatch (stored ", hex32(stored), ", computed ",
           hex32(computed), ")");
    try {
      json h = json::parse(hdr.substr(16, json_len));
      layout = ShardLayout::from_json(h.at("layout"));
    } catch (const json::exception& e) {
      fail("shard '", name, "' header: invalid layout: ", e.what());
    }
    const uint64_t header_end = hdr.size();

    char tr[kTrailerBytes];
    pread_all(tr, kTrailerBytes, size - kTrailerBytes, "trailer");
    if (std::memcmp(tr + 16, kEndMagic, 8) != 0)
      fail("shard '", name, "': truncated file (no end marker; the writer did not finish)");
    const uint64_t footer_offset = get_at<uint64_t>(tr);
    const uint32_t footer_crc = get_at<uint32_t>(tr + 8);
    if (footer_offset < header_end || footer_offset + 16 > size - kTrailerBytes)
      fail("shard '", name, "' footer: bad offset ", footer_offset);
    std::string foot(size - kTrailerBytes - footer_offset, '\0');
    pread_all(&foot[0], foot.size(), footer_offset, "footer");
    const uint32_t fc = crc32c(foot.data(), foot.size());
    if (fc != footer_crc)
      fail("shard '", name, "' footer: checksum mismatch (stored ", hex32(footer_crc),
           ", computed ", hex32(fc), ")");
    const uint64_t nb = get_at<uint64_t>(foot.data());
    const uint64_t total = get_at<uint64_t>(foot.data() + 8);
    if (foot.size() != 16 + nb * 16)
      fail("shard '", name, "' footer: ", nb, " blocks do not fit its ", foot.size(), " bytes");
    first_row.resize(nb + 1);
    offset.resize(nb + 1);
    for (uint64_t b = 0; b < nb; ++b) {
      first_row[b] = get_at<uint64_t>(foot.data() + 16 + b * 16);
      offset[b] = get_at<uint64_t>(foot.data() + 24 + b * 16);
      const uint64_t prev_row = b ? first_row[b - 1] : 0;
      const uint64_t prev_off = b ? offset[b - 1] : header_end;
      if ((b == 0 && (first_row[0] != 0 || offset[0] != header_end)) ||
          (b > 0 && (first_row[b] <= prev_row || offset[b] <= prev_off)))
        fail("shard '", name, "' footer: block ", b, " has an inconsistent index entry");
    }
    first_row[nb] = total;
    offset[nb] = footer_offset;
    if (nb > 0 && total <= first_row[nb - 1])
      fail("shard '", name, "' footer: inconsistent row count ", total);
    if (nb == 0 && (total != 0 || footer_offset != header_end))
      fail("shard '", name, "' footer: inconsistent empty shard");
    rows = static_cast<int64_t>(total);
  }

  // Reads block b into `block` and verifies it.
  void load_block(int64_t b) {
    if (cached == b) return;
    cached = -1;
    const uint64_t at = offset[b], len = offset[b + 1] - offset[b];
    const std::string where = "shard '" + name + "' block " + std::to_string(b);
    if (len < kBlockHeaderBytes) fail(where, ": corrupt index (", len, " bytes)");
    block.resize(len);
    pread_all(&block[0], len, at, "block " + std::to_string(b));
    const uint64_t n = get_at<uint64_t>(block.data());
    const uint64_t payload = get_at<uint64_t>(block.data() + 8);
    const uint32_t stored = get_at<uint32_t>(block.data() + 16);
    uint32_t computed = crc32c(block.data(), 16);
    if (payload == len - kBlockHeaderBytes)
      computed = crc32c(block.data() + kBlockHeaderBytes, payload, computed);
    if (stored != computed || payload != len - kBlockHeaderBytes)
      fail(where, ": checksum mismatch (stored ", hex32(stored), ", computed ", hex32(computed),
           ")");
    if (n != first_row[b + 1] - first_row[b])
      fail(where, ": holds ", n, " rows, the index says ", first_row[b + 1] - first_row[b]);
    // Section positions; sizes are checked against the payload.
    const size_t nc = layout.cardinalities.size();
    off_pos.assign(nc, 0);
    ids_pos.assign(nc, 0);
    n_ids.assign(nc, 0);
    uint64_t pos = kBlockHeaderBytes + n * 4 + n * 4 * static_cast<uint64_t>(layout.num_dense);
    for (size_t t = 0; t < nc; ++t) {
      uint64_t count = n;
      if (layout.multi_hot[t]) {
        off_pos[t] = pos;
        if (pos + n * 4 > len) fail(where, ": payload too short");
        count = n ? get_at<uint32_t>(block.data() + pos + (n - 1) * 4) : 0;
        pos += n * 4;
      }
      ids_pos[t] = pos;
      n_ids[t] = static_cast<int64_t>(count);
      pos += count * id_width(layout.cardinalities[t], file_version);
      if (pos > len) fail(where, ": payload too short");
    }
    if (pos != len) fail(where, ": payload has ", len - pos, " unexpected trailing bytes");
    cached = b;
  }

  // Appends rows [lo, hi) of the cached block to `out`.
  void decode(int64_t lo, int64_t hi, Batch& out) const {
    const int64_t n = static_cast<int64_t>(first_row[cached + 1] - first_row[cached]);
    const int64_t k = hi - lo;
    const int nd = layout.num_dense;
    const char* p = block.data() + kBlockHeaderBytes;
    size_t old = out.labels.size();
    out.labels.resize(old + k);
    std::memcpy(out.labels.data() + old, p + lo * 4, k * 4);
    p += n * 4;
    old = out.dense.size();
    out.dense.resize(old + k * nd);
    std::memcpy(out.dense.data() + old, p + lo * nd * 4, k * nd * 4);
    for (size_t t = 0; t < layout.cardinalities.size(); ++t) {
      auto& ooff = out.cat_offsets[t];
      auto& oids = out.cat_indices[t];
      int64_t id_lo = lo, id_hi = hi;
      const int64_t base = ooff.back();
      if (layout.multi_hot[t]) {
        const char* ends = block.data() + off_pos[t];
        id_lo = lo ? get_at<uint32_t>(ends + (lo - 1) * 4) : 0;
        id_hi = hi ? get_at<uint32_t>(ends + (hi - 1) * 4) : 0;
        if (id_lo > id_hi || id_hi > n_ids[t])
          fail("shard '", name, "' block ", cached, ": bad offsets of feature ", t);
        for (int64_t r = lo; r < hi; ++r)
          ooff.push_back(base + get_at<uint32_t>(ends + r * 4) - id_lo);
      } else {
        for (int64_t r = 1; r <= k; ++r) ooff.push_back(base + r);
      }
      const int64_t m = id_hi - id_lo;
      const size_t at = oids.size();
      oids.resize(at + m);
      const int64_t card = layout.cardinalities[t];
      const size_t width = id_width(card, file_version);
      if (!load_ids(block.data() + ids_pos[t] + id_lo * width, m, width, card,
                    oids.data() + at))
        fail("shard '", name, "' block ", cached, ": id out of range in feature ", t);
    }
    out.rows += k;
  }
};

ShardReader::ShardReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->name = base_name(path);
  impl_->open();
}

ShardReader::~ShardReader() = default;

const ShardLayout& ShardReader::layout() const { return impl_->layout; }
int64_t ShardReader::rows() const { return impl_->rows; }

void ShardReader::read(int64_t begin, int64_t count, Batch& out) {
  Impl& m = *impl_;
  DLREC_CHECK(begin >= 0 && count >= 0 && begin + count <= m.rows, "shard '", m.name,
              "': read of rows [", begin, ", ", begin + count, ") outside [0, ", m.rows, ")");
  out.reset(m.layout.num_dense, static_cast<int>(m.layout.cardinalities.size()));
  int64_t row = begin;
  const int64_t end = begin + count;
  while (row < end) {
    const int64_t b = std::upper_bound(m.first_row.begin(), m.first_row.end() - 1,
                                       static_cast<uint64_t>(row)) -
                      m.first_row.begin() - 1;
    m.load_block(b);
    const int64_t lo = row - static_cast<int64_t>(m.first_row[b]);
    const int64_t hi = std::min<int64_t>(end, m.first_row[b + 1]) - m.first_row[b];
    m.decode(lo, hi, out);
    row += hi - lo;
  }
}

// ---------------------------------------------------------------------------------------------
// DatasetInfo

json DatasetInfo::to_json() const {
  json j = {{"format", "dlrec-dataset"},        {"version", 1},
            {"layout", layout.to_json()},       {"train_shards", train_shards},
            {"valid_shards", valid_shards},     {"train_rows", train_rows},
            {"valid_rows", valid_rows}};
  if (!dense_names.empty()) j["dense_names"] = dense_names;
  if (!cat_names.empty()) j["cat_names"] = cat_names;
  return j;
}

DatasetInfo DatasetInfo::from_json(const json& j) {
  ConfigReader r(j, "dataset");
  DatasetInfo d;
  std::string format = r.get<std::string>("format", "dlrec-dataset");
  DLREC_CHECK(format == "dlrec-dataset", "dataset.json: format is '", format,
              "', expected 'dlrec-dataset'");
  int64_t version = r.get<int64_t>("version", 1);
  DLREC_CHECK(version == 1, "dataset.json: unsupported version ", version);
  d.layout = ShardLayout::from_json(r.raw("layout"));
  d.train_shards = r.get<std::vector<std::string>>("train_shards", {});
  d.valid_shards = r.get<std::vector<std::string>>("valid_shards", {});
  d.train_rows = r.get_int_range("train_rows", 0, 0, INT64_MAX);
  d.valid_rows = r.get_int_range("valid_rows", 0, 0, INT64_MAX);
  d.dense_names = r.get<std::vector<std::string>>("dense_names", {});
  d.cat_names = r.get<std::vector<std::string>>("cat_names", {});
  r.finish();
  DLREC_CHECK(d.dense_names.empty() || static_cast<int>(d.dense_names.size()) ==
                                           d.layout.num_dense,
              "dataset.json: ", d.dense_names.size(), " dense_names for ", d.layout.num_dense,
              " dense features");
  DLREC_CHECK(d.cat_names.empty() || d.cat_names.size() == d.layout.cardinalities.size(),
              "dataset.json: ", d.cat_names.size(), " cat_names for ",
              d.layout.cardinalities.size(), " categorical features");
  return d;
}

DatasetInfo DatasetInfo::load(const std::string& dir) {
  const std::string path = dir + "/dataset.json";
  json j = read_json_file(path);
  try {
    return from_json(j);
  } catch (const Error& e) {
    fail("'", path, "': ", e.what());
  }
}

void DatasetInfo::save(const std::string& dir) const {
  write_file_atomic(dir + "/dataset.json", to_json().dump(2) + "\n");
}

// ---------------------------------------------------------------------------------------------
// ShardLoader

// Batches are read by `workers` threads, worker w producing batches w, w + workers, ...
// (each with its own readers: a reader caches one block), at most kDepth batches ahead of the
// consumer per worker; next() hands them out in order. An error is raised when the consumer
// reaches the batch that failed, after every batch before it.
struct ShardLoader::Impl {
  std::vector<std::string> paths;
  std::vector<std::vector<std::unique_ptr<ShardReader>>> readers;  // [worker][shard]
  std::vector<int64_t> starts;  // first global row of each shard, plus the total
  int64_t batch_size = 0;
  int64_t first = 0;      // start_row
  int64_t nbatches = 0;
  int64_t delivered = 0;  // global row position of the next batch handed out
  ShardLayout layout;
  int workers = 1;

  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, Batch> ready;  // batch index -> batch
  int64_t next_index = 0;          // the consumer's next batch
  std::vector<Batch> free_list;
  std::exception_ptr error;
  int64_t error_index = INT64_MAX;
  bool stop = false;
  static constexpr int64_t kDepth = 2;  // batches ahead per worker
  std::vector<std::thread> threads;

  void produce(int w) {
    int64_t i = w;
    try {
      const int64_t total = starts.back();
      for (; i < nbatches; i += workers) {
        Batch b;
        {
          std::unique_lock<std::mutex> l(mu);
          cv.wait(l, [&] { return stop || i < next_index + kDepth * workers; });
          if (stop) return;
          if (!free_list.empty()) {
            b = std::move(free_list.back());
            free_list.pop_back();
          }
        }
        int64_t pos = first + i * batch_size;
        const int64_t end = std::min(total, pos + batch_size);
        b.reset(layout.num_dense, static_cast<int>(layout.cardinalities.size()));
        Batch part;
        while (pos < end) {
          size_t s = std::upper_bound(starts.begin(), starts.end(), pos) - starts.begin() - 1;
          const int64_t lo = pos - starts[s];
          const int64_t n = std::min(end, starts[s + 1]) - pos;
          if (b.rows == 0 && n == end - pos) {
            readers[w][s]->read(lo, n, b);
          } else {
            readers[w][s]->read(lo, n, part);
            b.append(part);
          }
          pos += n;
        }
        {
          std::lock_guard<std::mutex> g(mu);
          ready.emplace(i, std::move(b));
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (i < error_index) {
        error = std::current_exception();
        error_index = i;
      }
    }
    cv.notify_all();
  }
};

ShardLoader::ShardLoader(std::vector<std::string> paths, int64_t batch_size, int64_t start_row)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  DLREC_CHECK(batch_size >= 1, "ShardLoader: batch_size must be >= 1, got ", batch_size);
  DLREC_CHECK(!paths.empty(), "ShardLoader: no shard files");
  m.paths = std::move(paths);
  m.batch_size = batch_size;
  m.starts.push_back(0);
  m.workers = std::clamp(num_threads() / 4, 1, 4);
  m.readers.resize(static_cast<size_t>(m.workers));
  for (const auto& p : m.paths) {
    m.readers[0].push_back(std::make_unique<ShardReader>(p));
    const ShardReader& r = *m.readers[0].back();
    if (m.readers[0].size() == 1) {
      m.layout = r.layout();
    } else if (!(r.layout() == m.layout)) {
      fail("shard '", p, "' has a different layout (", r.layout().to_json().dump(), ") than '",
           m.paths[0], "' (", m.layout.to_json().dump(), ")");
    }
    m.starts.push_back(m.starts.back() + r.rows());
  }
  for (int w = 1; w < m.workers; ++w)
    for (const auto& p : m.paths) m.readers[w].push_back(std::make_unique<ShardReader>(p));
  DLREC_CHECK(start_row >= 0 && start_row <= m.starts.back(), "ShardLoader: start_row ",
              start_row, " is outside [0, ", m.starts.back(), "]");
  m.delivered = m.first = start_row;
  m.nbatches = (m.starts.back() - start_row + batch_size - 1) / batch_size;
  for (int w = 0; w < m.workers; ++w) m.threads.emplace_back([this, w] { impl_->produce(w); });
}

ShardLoader::~ShardLoader() {
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
}

bool ShardLoader::next(Batch& out) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> l(m.mu);
  m.cv.wait(l, [&] {
    return m.next_index >= m.nbatches || m.ready.count(m.next_index) ||
           m.error_index <= m.next_index;
  });
  auto it = m.ready.find(m.next_index);
  if (it == m.ready.end()) {
    if (m.error_index <= m.next_index && m.error) {
      std::exception_ptr e = m.error;
      m.error = nullptr;
      std::rethrow_exception(e);
    }
    return false;
  }
  std::swap(out, it->second);  // the caller's old buffers go back to the producers
  m.free_list.push_back(std::move(it->second));
  m.ready.erase(it);
  ++m.next_index;
  m.delivered += out.rows;
  l.unlock();
  m.cv.notify_all();
  return true;
}

int64_t ShardLoader::position() const { return impl_->delivered; }
int64_t ShardLoader::total_rows() const { return impl_->starts.back(); }
const ShardLayout& ShardLoader::layout() const { return impl_->layout; }

}  // namespace dlrec::io
