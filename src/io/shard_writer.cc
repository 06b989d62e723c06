// ShardWriter: encodes batches as the blocks of a training shard (format: shard_format.h and
// docs/FORMATS.md), in order (write, write_parts) or at reserved rows from many threads
// (reserve, write_at).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/shard.h"
#include "shard_format.h"

namespace dlrec::io {

using namespace shard_format;

namespace {


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
      if (n > 0) std::memcpy(p, ids, static_cast<size_t>(n) * 8);  // (ids may be null if 0)
  }
}
}  // namespace

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
        // First whether any row has other than one id, without a branch per row (a loop the
        // compiler vectorizes: this check and the range check below were 3.4 % of a Criteo
        // ETL's CPU as branchy loops); then the first such row for the message.
        uint64_t other = 0;
        for (int64_t r = begin; r < end; ++r)
          other |= static_cast<uint64_t>(off[r + 1] - off[r]) ^ 1u;
        for (int64_t r = begin; other != 0 && r < end; ++r)
          if (off[r + 1] - off[r] != 1)
            fail("shard '", name, "': one-hot categorical feature ", t, " row ",
                 first_row + r - begin, " has ", off[r + 1] - off[r], " ids (must be exactly 1)");
      } else {
        for (int64_t r = begin; r < end; ++r)
          if (off[r + 1] < off[r])
            fail("shard '", name, "': categorical feature ", t, " row ", first_row + r - begin,
                 " has decreasing offsets");
      }
      uint64_t out_of_range = 0;  // as above: whether there is one, then which
      for (int64_t i = off[begin]; i < off[end]; ++i)
        out_of_range |=
            static_cast<uint64_t>(static_cast<uint64_t>(ids[i]) >= static_cast<uint64_t>(card));
      for (int64_t i = off[begin]; out_of_range != 0 && i < off[end]; ++i) {
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
        // (no copy when a segment or the dense section is empty: data() may be null then)
        if (m > 0) std::memcpy(lab, s.batch->labels.data() + s.begin, m * 4);
        if (m > 0 && nd > 0) std::memcpy(den, s.batch->dense.data() + s.begin * nd, m * nd * 4);
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
    // (no copy of nothing: data() may be null, e.g. without dense features)
    if (n > 0) std::memcpy(buf + dat[0] + r0 * 4, b.labels.data() + begin, n * 4);
    if (n * nd > 0)
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

}  // namespace dlrec::io
