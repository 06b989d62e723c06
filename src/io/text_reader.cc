#include "dlrec/io/text_reader.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "text_line_parser.h"

namespace dlrec::io {

using namespace text_detail;

// ---------------------------------------------------------------------------------------------
// TextReader

namespace {
struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

// Outcome of one parsing task (a contiguous run of lines).
struct TaskResult {
  int64_t skipped = 0;
  int64_t error_line = -1;  // index (within the chunk) of the first bad line, -1 if none
  LineError error;
};
}  // namespace

struct TextReader::Impl {
  std::vector<std::string> files;
  Schema schema;
  ReadOptions opt;
  ReadStats stats;

  size_t next_file = 0;
  FilePtr file;
  std::string name;
  bool eof = false;
  // Unconsumed input is data[pos, end); capacity `cap`. `data` is `buf` (read in blocks), or
  // the whole file mapped in memory (regular files): no copy, and the pages already parsed
  // are dropped from the mapping as the reader moves on, so RSS stays bounded.
  std::unique_ptr<char[]> buf;
  char* data = nullptr;
  size_t cap = 0, pos = 0, end = 0;
  bool is_open = false;
  void* map = nullptr;
  size_t map_size = 0, released = 0;

  void close_current() {
    if (active) stop_pieces();
    file.reset();
    if (map) ::munmap(map, map_size);
    map = nullptr;
    map_size = released = 0;
    data = buf.get();
    is_open = false;
  }

  // Maps a regular, non-empty file; false to read it in blocks instead, from `stream_fd` when
  // the file could be opened (a FIFO or pipe must be read from the descriptor that opened it:
  // opening it again waits for another writer, and its data may be gone).
  int stream_fd = -1;
  bool map_file() {
    int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st {};
    void* m = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
      m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      stream_fd = fd;
      return false;
    }
    ::close(fd);
    ::madvise(m, static_cast<size_t>(st.st_size), MADV_SEQUENTIAL);
    map = m;
    map_size = static_cast<size_t>(st.st_size);
    data = static_cast<char*>(m);
    cap = end = map_size;
    eof = true;
    return true;
  }

  // Drops the mapped pages before `pos` (already parsed) from this process.
  void release_parsed() {
    if (!map) return;
    const size_t page = 4096;
    const size_t upto = pos / page * page;
    if (upto < released + (size_t{32} << 20)) return;
    ::madvise(data + released, upto - released, MADV_DONTNEED);
    released = upto;
  }
  int64_t line_no = 1;  // 1-based line number of the line starting at `pos`
  std::unique_ptr<LineParser> parser;

  // The current chunk's lines: [first, second) offsets into buf, newline and '\r' excluded.
  std::vector<std::pair<size_t, size_t>> lines;
  bool last_unterminated = false;
  std::vector<RawChunk> parts;
  std::vector<LineParser::Scratch> scratch;
  std::vector<TaskResult> results;

  // Mapped files are parsed ahead in pieces: byte ranges of about chunk_rows lines cut at line
  // ends, each parsed into its own chunk (no serial line scan, no concatenation), then handed
  // out one by one by next() in input order. Errors, skipped rows and max_rows are settled in
  // order at delivery, so what next() returns (and throws) is what parsing line by line would
  // give.
  //
  // No join per batch: num_threads() - 1 parse threads of the reader's own (not the shared
  // pool's workers, which the caller's own parallel work needs meanwhile) claim the next piece
  // whenever fewer than `window` pieces are claimed and not yet delivered, parse it into the
  // slot of its sequence number (seq % window) and go on to the next; next() waits for the
  // oldest piece only, and parses a piece itself when none is ready and one may be claimed (so
  // with one thread it parses each piece in turn, as before). The cut is the one a parallel
  // parse of groups of num_threads() pieces would make (group g starts where g - 1 ended,
  // piece t of it at the first line start after from + t * piece_bytes): the chunks, and all
  // that follows from them, do not depend on when a piece was parsed.
  struct Piece {
    RawChunk chunk;
    LineParser::Scratch scratch;
    size_t begin = 0, end = 0;   // byte range [begin, end) of the mapped file
    int64_t lines = 0;           // lines in the range, blank ones included
    int64_t first_local = -1;    // line index (in the range) of the chunk's first row
    int64_t skipped = 0;         // bad lines skipped (OnError::Skip)
    std::vector<int64_t> skip_rows;  // good rows before each skipped line
    int64_t error_line = -1;     // line index of the first bad line, -1 if none
    int64_t error_rows = 0;      // good rows before it
    LineError error;
    bool error_unterminated = false;  // the bad line is the file's last, without newline
    std::exception_ptr crash;    // what parsing threw (out of memory), rethrown at delivery
    int64_t guess = 0;           // rows guessed at the cut (by the average line length)
  };
  enum class Slot : unsigned char { Free, Parsing, Ready };
  std::vector<Piece> pieces;     // piece `seq` in pieces[seq % window]
  std::vector<Slot> slot_state;
  size_t window = 0;
  uint64_t claimed = 0;    // pieces of this file cut (claimed) so far
  uint64_t delivered = 0;  // pieces of this file handed out (or dropped) by next()
  int parsing = 0;         // pieces being parsed now
  bool active = false;     // a mapped file is being cut
  bool no_more = true;     // no further piece of this file will be cut
  // The cut: the next group starts at `cut`; the current one is [g_from, g_stop), g_k pieces
  // of g_pb bytes, g_t of them cut.
  size_t cut = 0, g_from = 0, g_stop = 0, g_pb = 0, g_k = 0, g_t = 0;
  int64_t rows_cut = 0;    // rows delivered plus the rows of the pieces since (or guesses)
  std::mutex mu;
  std::condition_variable work_cv;   // parse threads: a piece may be claimed, or quit
  std::condition_variable ready_cv;  // next(): a piece was parsed, or the cut ended
  std::vector<std::thread> workers;
  bool quit = false;
  size_t piece_bytes = 0;  // bytes per piece: about chunk_rows lines (0: not estimated yet)
  size_t avg_line = 0;     // average line length in the first MB (bytes, newline included)

  bool done = false;

  // Offset of the first line starting at or after `a` (a > pos), or `limit` if none.
  size_t line_start(size_t a, size_t limit) const {
    if (a >= limit) return limit;
    const void* nl = std::memchr(data + a - 1, '\n', limit - (a - 1));
    return nl ? static_cast<size_t>(static_cast<const char*>(nl) - data) + 1 : limit;
  }

  void parse_piece(Piece& P, size_t b, size_t e) const {
    P.chunk.reset(schema.num_dense(), schema.num_cat());
    P.begin = b;
    P.end = e;
    P.lines = 0;
    P.first_local = -1;
    P.skipped = 0;
    P.skip_rows.clear();
    P.error_line = -1;
    P.error_rows = 0;
    P.error_unterminated = false;
    P.crash = nullptr;
    try {
      reserve_rows(P.chunk, e - b);
      const char* base = data;
      LineError err;
      size_t p = b;
      while (p < e) {
        const char* nl = static_cast<const char*>(std::memchr(base + p, '\n', e - p));
        const size_t lb = p;
        size_t le = nl ? static_cast<size_t>(nl - base) : e;
        p = nl ? le + 1 : e;
        if (le > lb && base[le - 1] == '\r') --le;
        const int64_t idx = P.lines++;
        if (le == lb || comment_line(base + lb, base + le)) continue;  // not a row
        const int64_t before = P.chunk.rows;
        if (parser->parse(base + lb, base + le, P.chunk, P.scratch, err)) {
          if (before == 0) P.first_local = idx;
          continue;
        }
        if (P.error_line < 0) {
          P.error_line = idx;
          P.error_rows = P.chunk.rows;
          P.error = err;
          P.error_unterminated = nl == nullptr;
        }
        if (opt.on_error == OnError::Fail) break;
        ++P.skipped;
        P.skip_rows.push_back(P.chunk.rows);
      }
      parser->finish(P.chunk, P.scratch);
    } catch (...) {
      P.scratch.pending.clear();  // the chunk is dropped with the error
      P.crash = std::current_exception();
    }
  }

  // Room for the rows of `bytes` of text (by the average line length, 6 % over), so that the
  // chunk's vectors are not regrown (copied, their new pages faulted in) row after row; one
  // value per categorical column and row (multi-hot lists may still grow theirs). Nothing to do
  // for a chunk whose vectors already have the room (a reused chunk).
  void reserve_rows(RawChunk& c, size_t bytes) const {
    if (avg_line == 0) return;
    const size_t rows = bytes / avg_line + bytes / avg_line / 16 + 16;
    c.label.reserve(rows);
    c.dense.reserve(rows * static_cast<size_t>(c.num_dense));
    for (int k = 0; k < c.num_cat; ++k) {
      c.cat_values[k].reserve(rows);
      c.cat_offsets[k].reserve(rows + 1);
    }
  }

  // Starts cutting the mapped file from `pos` (at a line start): the window, the piece size
  // (once per reader, from the average line length of the first MB) and the parse threads
  // (once per reader).
  void start_pieces() {
    const size_t rem = end - pos;
    if (piece_bytes == 0) {
      const size_t sample = std::min<size_t>(rem, size_t{1} << 20);
      size_t lines = 0;
      for (const char* p = data + pos; p < data + pos + sample;) {
        const void* nl = std::memchr(p, '\n', data + pos + sample - p);
        if (!nl) break;
        ++lines;
        p = static_cast<const char*>(nl) + 1;
      }
      const size_t avg = std::max<size_t>(1, sample / std::max<size_t>(lines, 1));
      avg_line = avg;
      const size_t rows = static_cast<size_t>(std::max<int64_t>(opt.chunk_rows, 1));
      piece_bytes = rows > rem / avg ? rem + 1 : rows * avg;
    }
    const int threads = std::max(1, num_threads());
    if (window == 0) {
      window = opt.parse_ahead > 0 ? static_cast<size_t>(opt.parse_ahead)
                                   : static_cast<size_t>(2 * threads);
      pieces.resize(window);
      slot_state.assign(window, Slot::Free);
      for (int t = 1; t < std::min<int>(threads, static_cast<int>(window)); ++t)
        workers.emplace_back([this] { parse_loop(); });
    }
    std::lock_guard<std::mutex> g(mu);
    claimed = delivered = 0;
    cut = pos;
    g_k = g_t = 0;
    rows_cut = stats.rows;
    no_more = false;
    active = true;
    work_cv.notify_all();
  }

  // Whether a piece may be claimed now (under mu): the file not fully cut, room in the window,
  // and, with max_rows, fewer rows cut (parsed, or guessed for pieces being parsed) than wanted.
  bool can_claim() const {
    return active && !no_more && claimed < delivered + window &&
           (opt.max_rows < 0 || rows_cut < opt.max_rows);
  }

  // Cuts the next piece (under mu, can_claim() true) into its slot, marked Parsing; false
  // when the file is fully cut (then no_more is set).
  bool claim(uint64_t& seq, size_t& b, size_t& e) {
    if (g_t == g_k) {  // a new group from `cut`
      if (cut >= end) {
        no_more = true;
        ready_cv.notify_all();
        return false;
      }
      const size_t rem = end - cut;
      g_pb = std::min(piece_bytes, rem);
      g_k = std::min<size_t>(std::max(1, num_threads()), (rem + g_pb - 1) / g_pb);
      g_from = cut;
      g_t = 0;
      g_stop = g_k * g_pb >= rem ? end : line_start(cut + g_k * g_pb, end);
      cut = g_stop;
    }
    const size_t t = g_t++;
    b = t == 0 ? g_from : line_start(g_from + t * g_pb, g_stop);
    e = t + 1 == g_k ? g_stop : line_start(g_from + (t + 1) * g_pb, g_stop);
    e = std::max(b, e);
    seq = claimed++;
    Piece& P = pieces[seq % window];
    P.guess = static_cast<int64_t>((e - b) / std::max<size_t>(avg_line, 1));
    rows_cut += P.guess;
    slot_state[seq % window] = Slot::Parsing;
    ++parsing;
    return true;
  }

  // Parses a claimed piece without the lock, then marks it Ready (`l` holds mu on entry and
  // on return). After a bad line that stops the reader (OnError::Fail) no later piece can be
  // delivered: the cut ends there.
  void parse_claimed(std::unique_lock<std::mutex>& l, uint64_t seq, size_t b, size_t e) {
    Piece& P = pieces[seq % window];
    l.unlock();
    parse_piece(P, b, e);
    l.lock();
    rows_cut += P.chunk.rows - P.guess;
    if (P.crash || (P.error_line >= 0 && opt.on_error == OnError::Fail)) no_more = true;
    slot_state[seq % window] = Slot::Ready;
    --parsing;
    ready_cv.notify_all();
    if (opt.max_rows >= 0) work_cv.notify_all();  // the guess replaced by the count
  }

  // A parse thread: claims and parses pieces until the reader goes away.
  void parse_loop() {
    ::pthread_setname_np(::pthread_self(), "dlrec-parse");  // for per-thread CPU samples
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      work_cv.wait(l, [&] { return quit || can_claim(); });
      if (quit) return;
      uint64_t seq;
      size_t b, e;
      if (claim(seq, b, e)) parse_claimed(l, seq, b, e);
    }
  }

  // The next piece of the file in order, parsed (parsing one itself while it waits, if one may
  // be claimed); nullptr when the file has no more.
  Piece* wait_piece() {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      const size_t s = delivered % window;
      if (delivered < claimed && slot_state[s] == Slot::Ready) return &pieces[s];
      if (no_more && delivered == claimed) return nullptr;
      uint64_t seq;
      size_t b, e;
      if (can_claim()) {
        if (claim(seq, b, e)) parse_claimed(l, seq, b, e);
        continue;
      }
      ready_cv.wait(l);
    }
  }

  // The piece handed out by deliver_piece: its slot is free for the piece `window` later.
  void release_piece() {
    {
      std::lock_guard<std::mutex> g(mu);
      slot_state[delivered % window] = Slot::Free;
      ++delivered;
    }
    work_cv.notify_all();
  }

  // No more pieces of this file: waits for the ones being parsed (they read the mapping).
  void stop_pieces() {
    std::unique_lock<std::mutex> l(mu);
    no_more = true;
    active = false;
    ready_cv.wait(l, [&] { return parsing == 0; });
  }

  // Hands out the parsed piece P (false when it holds no row); settles its errors, skipped rows
  // and the max_rows cut in input order.
  bool deliver_piece(Piece& P, RawChunk& out) {
    if (P.crash) {
      done = true;
      std::rethrow_exception(P.crash);
    }
    const int64_t remaining =
        opt.max_rows < 0 ? std::numeric_limits<int64_t>::max() : opt.max_rows - stats.rows;
    auto piece_message = [&] {
      std::string m = name + ":" + std::to_string(line_no + P.error_line) + ": " +
                      parser->field_prefix(P.error.field) + P.error.msg;
      if (P.error_unterminated) m += " (the last line is truncated: no newline at end of file)";
      return m;
    };
    // With OnError::Fail parsing stopped at the bad line; it matters only before the cut.
    if (P.error_line >= 0 && opt.on_error == OnError::Fail && P.error_rows < remaining) {
      done = true;
      fail(piece_message());
    }
    if (P.chunk.rows > remaining) truncate_chunk(P.chunk, remaining);
    // Bad lines after the last row wanted are never reached.
    const int64_t skipped = std::count_if(P.skip_rows.begin(), P.skip_rows.end(),
                                          [&](int64_t r) { return r < remaining; });
    const bool cut_here = opt.max_rows >= 0 && P.chunk.rows >= remaining;
    if (skipped > 0 && stats.first_skip_reason.empty()) stats.first_skip_reason = piece_message();
    stats.skipped_rows += skipped;
    stats.bytes += static_cast<int64_t>(P.end - P.begin);  // the whole range, even when cut
    if (P.first_local >= 0) P.chunk.first_line = line_no + P.first_local;
    line_no += P.lines;
    stats.rows += P.chunk.rows;
    pos = P.end;
    if (cut_here) done = true;  // max_rows reached: the pieces after this one are dropped
    if (P.chunk.rows == 0) return false;
    std::swap(out, P.chunk);
    return true;
  }

  static void truncate_chunk(RawChunk& c, int64_t rows) {
    c.rows = rows;
    c.label.resize(static_cast<size_t>(rows));
    c.dense.resize(static_cast<size_t>(rows * c.num_dense));
    for (int k = 0; k < c.num_cat; ++k) {
      c.cat_offsets[k].resize(static_cast<size_t>(rows + 1));
      c.cat_values[k].resize(static_cast<size_t>(c.cat_offsets[k][rows]));
    }
  }

  void read_block() {
    size_t want = std::max<size_t>(opt.block_bytes, 1);
    if (cap - end < want) {
      if (pos > 0) {  // drop consumed bytes first
        std::memmove(data, data + pos, end - pos);
        for (auto& l : lines) l.first -= pos, l.second -= pos;
        end -= pos;
        pos = 0;
      }
      if (cap - end < want) {
        size_t ncap = std::max(cap * 2, end + want);
        std::unique_ptr<char[]> nb(new char[ncap]);
        if (end) std::memcpy(nb.get(), data, end);
        buf = std::move(nb);
        data = buf.get();
        cap = ncap;
      }
    }
    size_t got = std::fread(data + end, 1, want, file.get());
    if (got < want) {
      if (std::ferror(file.get())) fail(name, ": read error: ", std::strerror(errno));
      eof = true;
    }
    end += got;
  }

  // Offset of the scanned line's end ('\n'), reading more input as needed; npos at EOF.
  size_t find_newline(size_t& scan) {
    for (;;) {
      const void* nl = scan < end ? std::memchr(data + scan, '\n', end - scan) : nullptr;
      if (nl) return static_cast<size_t>(static_cast<const char*>(nl) - data);
      if (eof) return std::string::npos;
      size_t before = pos;
      read_block();
      scan -= before - pos;  // read_block may have moved the data
    }
  }

  // Whether [b, e) is a comment line (Schema::comment): not a row.
  bool comment_line(const char* b, const char* e) const {
    const size_t n = schema.comment.size();
    return n != 0 && static_cast<size_t>(e - b) >= n &&
           std::memcmp(b, schema.comment.data(), n) == 0;
  }

  // Consumes what comes before the header (or the first row) of a newly opened file: a UTF-8
  // byte order mark, the schema's skip_lines lines, then (with a comment prefix) comment and
  // blank lines, so that a header may follow comments.
  void skip_preamble() {
    size_t scan = pos;
    find_newline(scan);  // reads the first line in (a stream)
    if (end - pos >= 3 && std::memcmp(data + pos, "\xEF\xBB\xBF", 3) == 0) {
      pos += 3;
      stats.bytes += 3;
    }
    auto consume_line = [&] {  // false at the end of the file
      size_t s = pos;
      const size_t nl = find_newline(s);
      const size_t consumed = nl == std::string::npos ? end - pos : nl + 1 - pos;
      if (consumed == 0) return false;
      stats.bytes += static_cast<int64_t>(consumed);
      pos += consumed;
      ++line_no;
      return true;
    };
    for (int64_t i = 0; i < schema.skip_lines; ++i)
      if (!consume_line()) return;
    if (schema.comment.empty() || !schema.header) return;  // comments among rows: parse loops
    for (;;) {
      size_t s = pos;
      const size_t nl = find_newline(s);
      size_t le = nl == std::string::npos ? end : nl;
      if (le > pos && data[le - 1] == '\r') --le;
      if (le != pos && !comment_line(data + pos, data + le)) return;
      if (!consume_line()) return;
    }
  }

  bool open_next() {
    close_current();
    if (next_file >= files.size()) return false;
    name = files[next_file++];
    pos = end = 0;
    eof = false;
    if (!map_file()) {
      if (stream_fd >= 0) {
        file.reset(::fdopen(stream_fd, "rb"));
        if (!file) ::close(stream_fd);
        stream_fd = -1;
      } else {
        file.reset(std::fopen(name.c_str(), "rb"));
      }
      if (!file) fail("cannot open '", name, "': ", std::strerror(errno));
      data = buf.get();
      end = 0;
    }
    is_open = true;
    line_no = 1;
    skip_preamble();
    std::string header;
    if (schema.header) {
      size_t scan = pos;
      size_t nl = find_newline(scan);
      size_t stop = nl == std::string::npos ? end : nl;
      header.assign(data + pos, stop - pos);
      size_t consumed = nl == std::string::npos ? end - pos : nl + 1 - pos;
      stats.bytes += static_cast<int64_t>(consumed);
      pos += consumed;
      ++line_no;
      if (header.empty() && nl == std::string::npos) {
        parser.reset(new LineParser(schema, {}));  // an empty file: zero rows
        return true;
      }
    }
    parser.reset(new LineParser(schema, field_mapping(schema, header, name)));
    return true;
  }

  // Collects up to `want` lines starting at `pos` into `lines`; returns the offset after them.
  size_t gather(int64_t want) {
    lines.clear();
    last_unterminated = false;
    size_t scan = pos;
    while (static_cast<int64_t>(lines.size()) < want) {
      size_t nl = find_newline(scan);
      size_t lb = scan, le;
      if (nl == std::string::npos) {
        if (scan >= end) break;
        le = end;
        scan = end;
        last_unterminated = true;
      } else {
        le = nl;
        scan = nl + 1;
      }
      if (le > lb && data[le - 1] == '\r') --le;
      lines.emplace_back(lb, le);
    }
    return scan;
  }

  std::string where(int64_t line_index) const {
    return name + ":" + std::to_string(line_no + line_index);
  }

  std::string message(int64_t line_index, const LineError& err) const {
    std::string m = where(line_index) + ": " + parser->field_prefix(err.field) + err.msg;
    if (last_unterminated && line_index + 1 == static_cast<int64_t>(lines.size()))
      m += " (the last line is truncated: no newline at end of file)";
    return m;
  }

  void parse_task(int64_t lo, int64_t hi, RawChunk& out, LineParser::Scratch& s,
                  TaskResult& res) {
    res = TaskResult();
    const char* base = data;
    LineError err;
    for (int64_t i = lo; i < hi; ++i) {
      const auto& l = lines[i];
      // Blank and comment lines carry no row.
      if (l.first == l.second || comment_line(base + l.first, base + l.second)) continue;
      const int64_t before = out.rows;
      if (parser->parse(base + l.first, base + l.second, out, s, err)) {
        if (before == 0) out.first_line = line_no + i;
        continue;
      }
      if (res.error_line < 0) {
        res.error_line = i;
        res.error = err;
      }
      if (opt.on_error == OnError::Fail) break;
      ++res.skipped;
    }
    parser->finish(out, s);
  }

  // Appends parts[1..tasks) to `out` (which holds part 0), copying the parts in parallel.
  void concat_parts(RawChunk& out, int tasks) {
    const int nd = out.num_dense, nc = out.num_cat;
    std::vector<int64_t> row0(tasks + 1, out.rows);
    for (int t = 1; t < tasks; ++t) row0[t + 1] = row0[t] + parts[t].rows;
    std::vector<std::vector<int64_t>> val0(nc, std::vector<int64_t>(tasks + 1));
    for (int c = 0; c < nc; ++c) {
      val0[c][1] = static_cast<int64_t>(out.cat_values[c].size());
      for (int t = 1; t < tasks; ++t)
        val0[c][t + 1] = val0[c][t] + static_cast<int64_t>(parts[t].cat_values[c].size());
    }
    const int64_t rows = row0[tasks];
    if (out.rows == 0) {
      for (int t = 1; t < tasks; ++t)
        if (parts[t].rows > 0) {
          out.first_line = parts[t].first_line;
          break;
        }
    }
    out.label.resize(rows);
    out.dense.resize(static_cast<size_t>(rows * nd));
    for (int c = 0; c < nc; ++c) {
      out.cat_values[c].resize(static_cast<size_t>(val0[c][tasks]));
      out.cat_offsets[c].resize(static_cast<size_t>(rows + 1));
    }
    parallel_for(1, tasks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const RawChunk& p = parts[t];
        if (p.rows == 0) continue;
        const int64_t r0 = row0[t];
        std::copy(p.label.begin(), p.label.end(), out.label.begin() + r0);
        std::copy(p.dense.begin(), p.dense.end(), out.dense.begin() + r0 * nd);
        for (int c = 0; c < nc; ++c) {
          const int64_t base = val0[c][t];
          std::copy(p.cat_values[c].begin(), p.cat_values[c].end(),
                    out.cat_values[c].begin() + base);
          const int64_t* src = p.cat_offsets[c].data();
          int64_t* dst = out.cat_offsets[c].data() + r0;
          for (int64_t r = 1; r <= p.rows; ++r) dst[r] = base + src[r];
        }
      }
    });
    out.rows = rows;
  }

  bool next(RawChunk& out) {
    const int nd = schema.num_dense(), nc = schema.num_cat();
    out.reset(nd, nc);
    while (!done) {
      int64_t want = std::max<int64_t>(opt.chunk_rows, 1);
      if (opt.max_rows >= 0) want = std::min(want, opt.max_rows - stats.rows);
      if (want <= 0) break;
      if (!is_open && !open_next()) break;
      if (map) {
        if (!active) start_pieces();
        Piece* P = wait_piece();
        if (P == nullptr) {  // the file is done
          close_current();
          continue;
        }
        bool got = false;
        try {
          got = deliver_piece(*P, out);
        } catch (...) {
          release_piece();
          throw;
        }
        release_piece();
        release_parsed();
        if (got) return true;
        continue;
      }
      if (!map && pos > 0 && pos == end) pos = end = 0;
      const size_t stop = gather(want);
      if (lines.empty()) {
        close_current();
        continue;
      }
      const int64_t n = static_cast<int64_t>(lines.size());
      const int tasks = static_cast<int>(
          std::max<int64_t>(1, std::min<int64_t>(num_threads(), n / kMinLinesPerTask)));
      if (static_cast<int>(parts.size()) < tasks) parts.resize(tasks);
      scratch.resize(std::max<size_t>(scratch.size(), tasks));
      results.assign(tasks, TaskResult());
      for (int t = 1; t < tasks; ++t) parts[t].reset(nd, nc);
      parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          RawChunk& dst = t == 0 ? out : parts[t];
          parse_task(n * t / tasks, n * (t + 1) / tasks, dst, scratch[t], results[t]);
        }
      });
      // The earliest bad line decides, whichever thread found it.
      for (int t = 0; t < tasks; ++t) {
        const TaskResult& r = results[t];
        if (r.error_line < 0) continue;
        if (opt.on_error == OnError::Fail) {
          done = true;
          fail(message(r.error_line, r.error));
        }
        if (stats.first_skip_reason.empty()) stats.first_skip_reason = message(r.error_line, r.error);
        stats.skipped_rows += r.skipped;
      }
      if (tasks > 1) concat_parts(out, tasks);
      stats.bytes += static_cast<int64_t>(stop - pos);
      line_no += n;
      pos = stop;
      release_parsed();
      if (out.rows > 0) {
        stats.rows += out.rows;
        return true;
      }
    }
    done = true;
    close_current();
    return false;
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> g(mu);
      quit = true;
    }
    work_cv.notify_all();
    for (auto& w : workers) w.join();
    close_current();
  }
};

TextReader::TextReader(std::vector<std::string> files, Schema schema, ReadOptions options)
    : impl_(new Impl) {
  DLREC_CHECK(!schema.columns.empty(), "TextReader: the schema has no columns");
  DLREC_CHECK(options.parse_ahead >= 0, "TextReader: parse_ahead must be >= 0 (0: the default), "
              "got ", options.parse_ahead);
  impl_->files = std::move(files);
  impl_->schema = std::move(schema);
  impl_->opt = options;
}

TextReader::~TextReader() = default;

bool TextReader::next(RawChunk& out) { return impl_->next(out); }
const ReadStats& TextReader::stats() const { return impl_->stats; }
const Schema& TextReader::schema() const { return impl_->schema; }

}  // namespace dlrec::io
