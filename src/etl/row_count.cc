// The row count of the split: count_rows (all cores, before the fit), RowCountAhead (on a
// thread of its own beside the fit) and the estimate from the first MB (run_etl's cache
// decisions while counting ahead).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/parquet.h"
#include "etl/run_input.h"

namespace dlrec::etl {

namespace {

// '\n' bytes of [p, e) whose line has at least one byte (the byte before is not a '\n'; `prev`
// is the byte before p). 64 bytes at a time where SSE2 is there (four 16-byte compares into one
// 64-bit mask: a Criteo line is ~260 bytes, so most masks hold no line end; one memchr call
// per line, then one mask per 16 bytes, were the count's cost).
int64_t count_line_ends(const char* p, const char* e, char prev) {
  int64_t n = 0;
#if defined(__SSE2__)
  const __m128i nl = _mm_set1_epi8('\n');
  auto mask16 = [&](const char* q) {
    return static_cast<uint64_t>(static_cast<unsigned>(_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), nl))));
  };
  uint64_t carry = prev == '\n';  // the byte before the block is a '\n'
  for (; e - p >= 64; p += 64) {
    const uint64_t m =
        mask16(p) | mask16(p + 16) << 16 | mask16(p + 32) << 32 | mask16(p + 48) << 48;
    // Bit by bit, not __builtin_popcountll: without -mpopcnt that is a libgcc call (a line end
    // is in about one block of 64 bytes in 4 here).
    for (uint64_t ends = m & ~((m << 1) | carry); ends != 0; ends &= ends - 1) ++n;
    carry = m >> 63;
  }
  prev = carry ? '\n' : ' ';  // only whether it is a '\n' matters below
#endif
  for (; p < e; prev = *p++) n += *p == '\n' && prev != '\n';
  return n;
}

// Reads n bytes of `path` at `at` (all there: the size is known).
void read_fully_at(int fd, char* dst, size_t n, uint64_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail("reading '", path, "' failed: ", got < 0 ? std::strerror(errno) : "file shrank");
    dst += got;
    n -= static_cast<size_t>(got);
    at += static_cast<uint64_t>(got);
  }
}

// The rows of a file of `size` bytes holding `ends` line ends of non-empty lines: plus an
// unterminated last line, less the header line.
int64_t rows_of_line_ends(int fd, uint64_t size, bool header, const std::string& path,
                          int64_t ends) {
  if (size == 0) return 0;
  char last;
  read_fully_at(fd, &last, 1, size - 1, path);
  if (last != '\n') ++ends;  // an unterminated last line
  if (header) {  // the first line is the header, whatever it holds
    char first;
    read_fully_at(fd, &first, 1, 0, path);
    if (first != '\n') --ends;  // a non-empty first line was counted
  }
  return ends;
}

constexpr size_t kCountBuf = size_t{1} << 20;  // bytes per read of the count

// Line ends of non-empty lines in bytes [from, to) of `path` (`prev`: the byte before `from`),
// read kCountBuf at a time into `buf`; after each read, keep_going(ends so far) may stop the
// count (returns -1 then).
template <class F>
int64_t count_line_ends_in(int fd, uint64_t from, uint64_t to, char prev, std::vector<char>& buf,
                           const std::string& path, F&& keep_going) {
  if (buf.size() < kCountBuf) buf.resize(kCountBuf);
  int64_t n = 0;
  for (uint64_t at = from; at < to;) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kCountBuf, to - at));
    read_fully_at(fd, buf.data(), len, at, path);
    n += count_line_ends(buf.data(), buf.data() + len, prev);
    prev = buf[len - 1];
    at += len;
    if (!keep_going(n)) return -1;
  }
  return n;
}

// count_rows of one regular file of `size` bytes: '\n' bytes whose line is not empty, counted on
// all cores, each task reading its parts of the file with pread into a buffer of its own (no
// mapping of the file: no page tables to fill and drop again).
int64_t count_read(int fd, uint64_t size, bool header, const std::string& path) {
  // Parts of at least 8 MB, several per thread (they differ in speed).
  const int64_t parts = std::clamp<int64_t>(static_cast<int64_t>(size >> 23), 1,
                                            4 * std::max(1, num_threads()));
  std::vector<int64_t> counts(parts, 0);
  std::vector<std::exception_ptr> errors(parts);
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<char> buf;
    for (int64_t t = lo; t < hi; ++t) {
      try {
        const uint64_t from = size * t / parts, to = size * (t + 1) / parts;
        // The byte before the part: a '\n' right after another one ends a blank line. Before
        // the file's first byte counts as a '\n' (a '\n' there ends an empty first line).
        char prev = '\n';
        if (from > 0) read_fully_at(fd, &prev, 1, from - 1, path);
        counts[t] = count_line_ends_in(fd, from, to, prev, buf, path, [](int64_t) { return true; });
      } catch (...) {
        errors[t] = std::current_exception();
      }
    }
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  int64_t ends = 0;
  for (int64_t c : counts) ends += c;
  return rows_of_line_ends(fd, size, header, path, ends);
}

constexpr uint64_t kCountWindow = uint64_t{32} << 20;  // bytes per mapping of the count ahead

// Line ends of non-empty lines in bytes [0, size) of `path`, mapped kCountWindow at a time
// (MAP_POPULATE: the page-cache pages are mapped in one call per window, not faulted in page by
// page) and unmapped after; keep_going(ends so far) after each window may stop the count (-1
// then). No copy of the text, unlike the pread count (whose copy into the buffer was ~2 % of a
// Criteo ETL's CPU on the 2-core build machine). Falls back to pread where mmap fails.
template <class F>
int64_t count_line_ends_mapped(int fd, uint64_t size, std::vector<char>& buf,
                               const std::string& path, F&& keep_going) {
  int64_t n = 0;
  char prev = '\n';
  for (uint64_t at = 0; at < size;) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kCountWindow, size - at));
    void* m =
        ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, static_cast<off_t>(at));
    if (m == MAP_FAILED) {
      const int64_t rest = count_line_ends_in(fd, at, size, prev, buf, path,
                                              [&](int64_t k) { return keep_going(n + k); });
      return rest < 0 ? -1 : n + rest;
    }
    const char* p = static_cast<const char*>(m);
    n += count_line_ends(p, p + len, prev);
    prev = p[len - 1];
    ::munmap(m, len);
    at += len;
    if (!keep_going(n)) return -1;
  }
  return n;
}

}  // namespace

namespace run_detail {

// Whether every input is a regular file or Parquet (it can be read twice).
bool inputs_rereadable(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    if (io::is_parquet_path(f)) continue;
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  }
  return true;
}

// The rows of the inputs estimated from the average line of the first MB of the first text
// file (Parquet: the footer's count); -1 when there is no text to estimate from.
int64_t estimate_rows(const std::vector<std::string>& files) {
  int64_t rows = 0, text_bytes = 0;
  double line = 0;  // bytes per line
  for (const auto& f : files) {
    if (io::is_parquet_path(f)) {
      rows += io::parquet_num_rows(f);
      continue;
    }
    const uint64_t size = file_size(f);
    text_bytes += static_cast<int64_t>(size);
    if (line > 0 || size == 0) continue;
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open '", f, "': ", std::strerror(errno));
    std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(size, kCountBuf)));
    try {
      read_fully_at(fd, buf.data(), buf.size(), 0, f);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    const int64_t ends = count_line_ends(buf.data(), buf.data() + buf.size(), '\n');
    line = static_cast<double>(buf.size()) / static_cast<double>(std::max<int64_t>(ends, 1));
  }
  if (text_bytes > 0 && line <= 0) return -1;
  return rows + (text_bytes > 0 ? static_cast<int64_t>(static_cast<double>(text_bytes) / line) : 0);
}

}  // namespace run_detail

int64_t train_rows_of(int64_t rows, double valid_ratio) {
  return rows - static_cast<int64_t>(std::floor(static_cast<double>(rows) * valid_ratio));
}

RowCountAhead::RowCountAhead(std::vector<std::string> files, io::Schema schema,
                             double valid_ratio)
    : files_(std::move(files)), schema_(std::move(schema)), valid_ratio_(valid_ratio) {
  thread_ = std::thread([this] { run(); });
}

RowCountAhead::~RowCountAhead() {
  stop_ = true;
  thread_.join();
}

// The files one after the other, each read in order into one buffer: after every read, the
// rows of the files done plus the line ends so far (less a header) are a lower bound of the
// count, published for train_before().
void RowCountAhead::run() {
  try {
    std::vector<char> buf;
    int64_t done = 0;  // rows of the files counted
    auto publish = [&](int64_t lower) {
      std::lock_guard<std::mutex> g(mu_);
      lower_ = lower;
      cv_.notify_all();
    };
    for (const auto& path : files_) {
      if (stop_) return;
      if (io::is_parquet_path(path)) {
        done += io::parquet_num_rows(path);
        publish(done);
        continue;
      }
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail("cannot open '", path, "': ", std::strerror(errno));
      struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
      } closer{fd};
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        fail("etl: counting rows ahead needs a regular file, '", path, "' is not one");
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      const int64_t ends = count_line_ends_mapped(fd, size, buf, path, [&](int64_t n) {
        publish(done + std::max<int64_t>(0, n - (schema_.header ? 1 : 0)));
        return !stop_;
      });
      if (ends < 0) return;  // stopped
      done += rows_of_line_ends(fd, size, schema_.header, path, ends);
    }
    std::lock_guard<std::mutex> g(mu_);
    lower_ = total_ = done;
    cv_.notify_all();
  } catch (...) {
    std::lock_guard<std::mutex> g(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

int64_t RowCountAhead::train_before(int64_t upto) {
  std::unique_lock<std::mutex> lk(mu_);
  auto known = [&] {
    return error_ || total_ >= 0 || train_rows_of(lower_, valid_ratio_) >= upto;
  };
  if (!known()) {
    Timer t;
    cv_.wait(lk, known);
    waited_ += t.seconds();
  }
  if (error_) std::rethrow_exception(error_);
  return total_ >= 0 ? std::min(upto, train_rows_of(total_, valid_ratio_)) : upto;
}

int64_t RowCountAhead::rows() {
  std::unique_lock<std::mutex> lk(mu_);
  auto known = [&] { return error_ || total_ >= 0; };
  if (!known()) {
    Timer t;
    cv_.wait(lk, known);
    waited_ += t.seconds();
  }
  if (error_) std::rethrow_exception(error_);
  return total_;
}

int64_t count_parsed_rows(const std::vector<std::string>& files, const io::Schema& schema,
                          const io::ReadOptions& read) {
  io::ReadOptions ro = read;
  ro.max_rows = -1;
  std::unique_ptr<io::ChunkReader> reader = io::open_reader(files, schema, ro);
  io::RawChunk chunk;
  int64_t rows = 0;
  while (reader->next(chunk)) rows += chunk.rows;
  return rows;
}

int64_t count_rows(const std::vector<std::string>& files, const io::Schema& schema) {
  int64_t total = 0;
  std::vector<char> buf;
  for (const auto& path : files) {
    if (io::is_parquet_path(path)) {  // the footer has the count
      total += io::parquet_num_rows(path);
      continue;
    }
    {  // a regular file: read in parallel parts
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        int64_t lines = 0;
        try {
          lines = count_read(fd, static_cast<uint64_t>(st.st_size), schema.header, path);
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
        total += lines;
        continue;
      }
      if (fd >= 0) ::close(fd);
    }
    buf.resize(size_t{16} << 20);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open '", path, "': ", std::strerror(errno));
    int64_t lines = 0;       // non-blank lines
    int64_t line_len = 0;    // bytes of the current line so far
    bool first_line = true;  // the header, when the schema has one
    for (;;) {
      ssize_t got = ::read(fd, buf.data(), buf.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        fail("reading '", path, "' failed: ", std::strerror(err));
      }
      if (got == 0) break;
      const char* p = buf.data();
      const char* end = p + got;
      while (p < end) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
        if (!nl) {
          line_len += end - p;
          break;
        }
        line_len += nl - p;
        if (first_line && schema.header) {
          first_line = false;
        } else if (line_len > 0) {
          ++lines;
        }
        first_line = false;
        line_len = 0;
        p = nl + 1;
      }
    }
    ::close(fd);
    if (line_len > 0 && !(first_line && schema.header)) ++lines;
    total += lines;
  }
  return total;
}

}  // namespace dlrec::etl
