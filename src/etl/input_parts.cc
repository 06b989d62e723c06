// The input cut into parts for several processes (include/dlrec/etl/input_parts.h): the cut,
// the parse of one part with the text reader's line parser, the parts' bytes, the replay.
#include "dlrec/etl/input_parts.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "io/text_line_parser.h"

namespace dlrec::etl {
namespace {

// A read-only mapping of one input file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) fail("cannot open '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("etl: input '", path,
           "' is not a regular file: a job of several processes cuts "
           "its inputs into byte ranges (read a pipe with one process)");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) {
        ::close(fd);
        fail("cannot map '", path, "': ", std::strerror(errno));
      }
      data_ = static_cast<const char*>(m);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

  // The offset after the line starting at `pos` (its newline included; the end without one).
  size_t line_end(size_t pos) const {
    if (pos >= size_) return size_;
    const void* nl = std::memchr(data_ + pos, '\n', size_ - pos);
    return nl ? static_cast<size_t>(static_cast<const char*>(nl) - data_) + 1 : size_;
  }
  // The first line start at or after `pos` (>= `floor`, itself a line start).
  size_t next_line_start(size_t pos, size_t floor) const {
    if (pos <= floor) return floor;
    if (pos >= size_) return size_;
    if (data_[pos - 1] == '\n') return pos;
    return line_end(pos);
  }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

bool comment_line(const io::Schema& schema, const char* b, const char* e) {
  const size_t n = schema.comment.size();
  return n != 0 && static_cast<size_t>(e - b) >= n && std::memcmp(b, schema.comment.data(), n) == 0;
}

// What comes before a file's rows, as the text reader consumes it: a UTF-8 byte order mark, the
// schema's skip_lines lines, comment and blank lines before a header, the header.
struct Preamble {
  size_t end = 0;     // offset of the first line that may hold a row
  int64_t lines = 0;  // lines before it
  std::string header;
};

Preamble read_preamble(const MappedFile& f, const io::Schema& schema) {
  Preamble p;
  const char* d = f.data();
  if (f.size() >= 3 && std::memcmp(d, "\xEF\xBB\xBF", 3) == 0) p.end = 3;
  auto consume_line = [&] {
    const size_t e = f.line_end(p.end);
    if (e == p.end) return false;
    p.end = e;
    ++p.lines;
    return true;
  };
  for (int64_t i = 0; i < schema.skip_lines; ++i)
    if (!consume_line()) return p;
  if (!schema.comment.empty() && schema.header) {
    for (;;) {
      const size_t e = f.line_end(p.end);
      size_t le = e > p.end && d[e - 1] == '\n' ? e - 1 : e;
      if (le > p.end && d[le - 1] == '\r') --le;
      if (le != p.end && !comment_line(schema, d + p.end, d + le)) break;
      if (!consume_line()) return p;
    }
  }
  if (schema.header) {
    const size_t e = f.line_end(p.end);
    const size_t stop = e > p.end && d[e - 1] == '\n' ? e - 1 : e;
    if (stop > p.end) p.header.assign(d + p.end, stop - p.end);
    consume_line();
  }
  return p;
}

// Empties `c` for the schema's columns.
void start_chunk(io::RawChunk& c, const io::Schema& schema) {
  c = io::RawChunk{};
  c.reset(schema.num_dense(), schema.num_cat());
}

// Parses the lines of [lo, hi) of file `fi` into `part` (new chunks of at most chunk_rows rows).
// `line` is the local number of the line at lo.
void parse_range(const MappedFile& f, int fi, size_t lo, size_t hi, int64_t line,
                 const io::text_detail::LineParser& parser, const io::Schema& schema,
                 const io::ReadOptions& read, InputPart& part) {
  io::text_detail::LineParser::Scratch scratch;
  io::text_detail::LineError err;
  const char* d = f.data();
  io::RawChunk chunk;
  start_chunk(chunk, schema);
  auto hand_on = [&] {
    parser.finish(chunk, scratch);
    if (chunk.rows == 0) return;
    part.parsed.stats.rows += chunk.rows;
    part.parsed.chunks.push_back(std::move(chunk));
    part.chunk_file.push_back(fi);
    start_chunk(chunk, schema);
  };
  size_t p = lo;
  for (; p < hi; ++line) {
    const void* nl = std::memchr(d + p, '\n', hi - p);
    const size_t lb = p;
    size_t le = nl ? static_cast<size_t>(static_cast<const char*>(nl) - d) : hi;
    p = nl ? le + 1 : hi;
    if (le > lb && d[le - 1] == '\r') --le;
    if (le == lb || comment_line(schema, d + lb, d + le)) continue;  // not a row
    const int64_t before = chunk.rows;
    if (parser.parse(d + lb, d + le, chunk, scratch, err)) {
      if (before == 0) chunk.first_line = line;
      if (chunk.rows >= read.chunk_rows) hand_on();
      continue;
    }
    if (part.error_file < 0) {
      part.error_file = fi;
      part.error_line = line;
      part.error_message = parser.field_prefix(err.field) + err.msg;
      if (!nl) part.error_message += " (the last line is truncated: no newline at end of file)";
    }
    if (read.on_error == io::OnError::Fail) {
      part.failed = true;
      hand_on();
      return;
    }
    ++part.parsed.stats.skipped_rows;
  }
  hand_on();
}

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <class T>
void put_vec(std::string& out, const std::vector<T>& v) {
  put<uint64_t>(out, v.size());
  if (!v.empty()) out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Reads the serialized bytes in order, checking that they hold what is read.
struct ByteReader {
  const char* p;
  const char* end;
  template <class T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  template <class T>
  void get_vec(std::vector<T>& v) {
    const uint64_t n = get<uint64_t>();
    DLREC_CHECK(n <= static_cast<uint64_t>(end - p) / sizeof(T),
                "etl: a part's rows are cut short (", n, " values announced)");
    v.resize(n);
    if (n > 0) std::memcpy(v.data(), p, n * sizeof(T));  // (no null pointer to memcpy)
    p += n * sizeof(T);
  }
  void need(size_t n) const {
    DLREC_CHECK(static_cast<size_t>(end - p) >= n, "etl: a part's rows are cut short");
  }
};

constexpr uint64_t kPartMagic = 0x31545241504C5445ull;  // "ETLPART1"

void truncate_rows(io::RawChunk& c, int64_t rows) {
  if (rows >= c.rows) return;
  c.rows = rows;
  if (!c.label.empty()) c.label.resize(rows);
  c.dense.resize(rows * c.num_dense);
  for (int k = 0; k < c.num_cat; ++k) {
    c.cat_offsets[k].resize(rows + 1);
    c.cat_values[k].resize(c.cat_offsets[k][rows]);
  }
}

class ReplayReader final : public io::ChunkReader {
 public:
  ReplayReader(std::shared_ptr<const ParsedInput> in, int64_t max_rows)
      : in_(std::move(in)), max_rows_(max_rows) {
    // The skipped rows of the whole input, as a reader that read every line reports them.
    stats_.skipped_rows = in_->stats.skipped_rows;
    stats_.first_skip_reason = in_->stats.first_skip_reason;
  }
  bool next(io::RawChunk& out) override {
    if (next_ >= in_->chunks.size()) return false;
    if (max_rows_ >= 0 && stats_.rows >= max_rows_) return false;
    const io::RawChunk& c = in_->chunks[next_++];
    out.rows = c.rows;
    out.num_dense = c.num_dense;
    out.num_cat = c.num_cat;
    out.first_line = c.first_line;
    out.cat_facts = c.cat_facts;  // the copy's, as the copy is the chunk's
    out.label.assign(c.label.begin(), c.label.end());
    out.dense.assign(c.dense.begin(), c.dense.end());
    out.cat_values.resize(c.num_cat);
    out.cat_offsets.resize(c.num_cat);
    for (int k = 0; k < c.num_cat; ++k) {
      out.cat_values[k].assign(c.cat_values[k].begin(), c.cat_values[k].end());
      out.cat_offsets[k].assign(c.cat_offsets[k].begin(), c.cat_offsets[k].end());
    }
    if (max_rows_ >= 0) truncate_rows(out, max_rows_ - stats_.rows);
    stats_.rows += out.rows;
    return true;
  }
  const io::ReadStats& stats() const override { return stats_; }

 private:
  std::shared_ptr<const ParsedInput> in_;
  int64_t max_rows_;
  size_t next_ = 0;
  io::ReadStats stats_;
};

// parse_range on the pool's threads: [lo, hi) cut into pieces at line
// starts (min_piece bytes or more), each parsed into its own part, then appended in order with
// their line numbers moved on by the lines of the pieces before (with OnError::Fail, nothing after
// the first failed piece). Returns the lines (newlines) of [lo, hi).
int64_t parse_range_threaded(const MappedFile& f, int fi, size_t lo, size_t hi, int64_t line,
                             const io::text_detail::LineParser& parser, const io::Schema& schema,
                             const io::ReadOptions& read, size_t min_piece, InputPart& part) {
  const size_t pieces = std::max<size_t>(
      1, std::min<size_t>(static_cast<size_t>(num_threads()) * 2, (hi - lo) / min_piece));
  std::vector<size_t> cut(pieces + 1, hi);
  cut[0] = lo;
  for (size_t j = 1; j < pieces; ++j)
    cut[j] = std::max(cut[j - 1], f.next_line_start(lo + (hi - lo) / pieces * j, lo));
  std::vector<InputPart> got(pieces);
  std::vector<int64_t> newlines(pieces, 0);
  parallel_for(0, static_cast<int64_t>(pieces), 1, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      parse_range(f, fi, cut[j], cut[j + 1], 1, parser, schema, read, got[j]);
      newlines[j] = std::count(f.data() + cut[j], f.data() + cut[j + 1], '\n');
    }
  });
  int64_t before = line - 1;  // lines before piece j
  for (size_t j = 0; j < pieces && !part.failed; ++j) {
    InputPart& g = got[j];
    for (size_t c = 0; c < g.parsed.chunks.size(); ++c) {
      g.parsed.chunks[c].first_line += before;
      part.parsed.chunks.push_back(std::move(g.parsed.chunks[c]));
      part.chunk_file.push_back(fi);
    }
    part.parsed.stats.rows += g.parsed.stats.rows;
    part.parsed.stats.skipped_rows += g.parsed.stats.skipped_rows;
    if (g.error_file >= 0 && part.error_file < 0) {
      part.error_file = fi;
      part.error_line = before + g.error_line;
      part.error_message = g.error_message;
    }
    part.failed = g.failed;
    before += newlines[j];
  }
  return before - (line - 1);
}

}  // namespace

InputPart parse_input_part(const std::vector<std::string>& files, const io::Schema& schema,
                           const io::ReadOptions& read, int part, int parts,
                           size_t min_piece_bytes) {
  DLREC_CHECK(parts >= 1 && part >= 0 && part < parts, "etl: part ", part, " of ", parts);
  DLREC_CHECK(read.chunk_rows >= 1, "etl: chunk_rows must be >= 1");
  const int n = static_cast<int>(files.size());
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<Preamble> pre;
  std::vector<uint64_t> start(n + 1, 0);  // each file's data in the concatenated data bytes
  for (int f = 0; f < n; ++f) {
    const std::string& s = files[f];
    auto ends_with = [&](const std::string& tail) {
      return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with(".parquet") || ends_with(".parq"))
      fail("etl: '", s, "' is Parquet: a job of several processes cuts text inputs only");
    maps.push_back(std::make_unique<MappedFile>(s));
    pre.push_back(read_preamble(*maps.back(), schema));
    start[f + 1] = start[f] + (maps[f]->size() - pre[f].end);
  }
  // A cut point k in data bytes, moved to the next line start (the same on every part).
  auto cut = [&](int k) -> uint64_t {
    const uint64_t total = start[n];
    const uint64_t g =
        static_cast<uint64_t>(static_cast<unsigned __int128>(total) * static_cast<unsigned>(k) /
                              static_cast<unsigned>(parts));
    if (g >= total) return total;
    int f = static_cast<int>(std::upper_bound(start.begin(), start.end(), g) - start.begin()) - 1;
    const size_t pos = maps[f]->next_line_start(pre[f].end + (g - start[f]), pre[f].end);
    return start[f] + (pos - pre[f].end);
  };
  const uint64_t lo = cut(part), hi = cut(part + 1);
  InputPart out;
  out.file_lines.assign(n, 0);
  for (int f = 0; f < n && !out.failed; ++f) {
    const uint64_t a = std::max(lo, start[f]), b = std::min(hi, start[f + 1]);
    // The preamble's lines belong to the part holding the file's first data byte (or to the
    // first part, for a file without data).
    const bool owns_preamble =
        (lo <= start[f] && start[f] < hi) || (start[f] == start[f + 1] && part == 0);
    const int64_t pre_lines = owns_preamble ? pre[f].lines : 0;
    out.file_lines[f] = pre_lines;
    if (a >= b) continue;
    const MappedFile& m = *maps[f];
    const size_t from = pre[f].end + (a - start[f]), to = pre[f].end + (b - start[f]);
    io::text_detail::LineParser parser(schema, io::field_mapping(schema, pre[f].header, files[f]));
    out.file_lines[f] += parse_range_threaded(m, f, from, to, pre_lines + 1, parser, schema, read,
                                              min_piece_bytes, out);
  }
  return out;
}

std::string settle_part(InputPart& p, const std::vector<std::string>& files,
                        const std::vector<int64_t>& lines_before) {
  DLREC_CHECK(lines_before.size() == files.size(), "etl: settle_part: ", lines_before.size(),
              " line counts for ", files.size(), " files");
  for (size_t i = 0; i < p.parsed.chunks.size(); ++i)
    p.parsed.chunks[i].first_line += lines_before[p.chunk_file[i]];
  if (p.error_file < 0) return "";
  const std::string m = files[p.error_file] + ":" +
                        std::to_string(lines_before[p.error_file] + p.error_line) + ": " +
                        p.error_message;
  if (!p.failed) p.parsed.stats.first_skip_reason = m;
  return m;
}

std::string serialize_parsed(const ParsedInput& in) {
  std::string out;
  put(out, kPartMagic);
  put<int64_t>(out, in.stats.rows);
  put<int64_t>(out, in.stats.skipped_rows);
  put_vec(out,
          std::vector<char>(in.stats.first_skip_reason.begin(), in.stats.first_skip_reason.end()));
  put<uint64_t>(out, in.chunks.size());
  for (const io::RawChunk& c : in.chunks) {
    put<int64_t>(out, c.rows);
    put<int32_t>(out, c.num_dense);
    put<int32_t>(out, c.num_cat);
    put<int64_t>(out, c.first_line);
    put_vec(out, c.label);
    put_vec(out, c.dense);
    for (int k = 0; k < c.num_cat; ++k) {
      put_vec(out, c.cat_offsets[k]);
      put_vec(out, c.cat_values[k]);
    }
  }
  return out;
}

void append_serialized(const char* data, size_t size, ParsedInput& into) {
  ByteReader r{data, data + size};
  DLREC_CHECK(r.get<uint64_t>() == kPartMagic, "etl: a part's rows do not start as they must");
  into.stats.rows += r.get<int64_t>();
  into.stats.skipped_rows += r.get<int64_t>();
  std::vector<char> reason;
  r.get_vec(reason);
  if (into.stats.first_skip_reason.empty())
    into.stats.first_skip_reason.assign(reason.begin(), reason.end());
  const uint64_t chunks = r.get<uint64_t>();
  for (uint64_t i = 0; i < chunks; ++i) {
    io::RawChunk c;
    c.rows = r.get<int64_t>();
    c.num_dense = r.get<int32_t>();
    c.num_cat = r.get<int32_t>();
    DLREC_CHECK(c.rows >= 0 && c.num_dense >= 0 && c.num_cat >= 0, "etl: a part's chunk ", i,
                " has negative sizes");
    c.first_line = r.get<int64_t>();
    r.get_vec(c.label);
    r.get_vec(c.dense);
    c.cat_offsets.resize(c.num_cat);
    c.cat_values.resize(c.num_cat);
    for (int k = 0; k < c.num_cat; ++k) {
      r.get_vec(c.cat_offsets[k]);
      r.get_vec(c.cat_values[k]);
      DLREC_CHECK(static_cast<int64_t>(c.cat_offsets[k].size()) == c.rows + 1,
                  "etl: a part's chunk ", i, " has ", c.cat_offsets[k].size(), " offsets for ",
                  c.rows, " rows");
    }
    DLREC_CHECK(static_cast<int64_t>(c.dense.size()) == c.rows * c.num_dense,
                "etl: a part's chunk ", i, " has ", c.dense.size(), " dense values for ", c.rows,
                " rows");
    into.chunks.push_back(std::move(c));
  }
  DLREC_CHECK(r.p == r.end, "etl: a part's rows are followed by ", r.end - r.p, " extra bytes");
}

std::unique_ptr<io::ChunkReader> replay_reader(std::shared_ptr<const ParsedInput> input,
                                               const io::ReadOptions& read) {
  DLREC_CHECK(input, "etl: replay_reader without rows");
  return std::make_unique<ReplayReader>(std::move(input), read.max_rows);
}

}  // namespace dlrec::etl
