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

namespace dlrec::io {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Lines per parsing task below which a chunk is not split further among threads.
constexpr int64_t kMinLinesPerTask = 256;
// Longest field text quoted back in an error message.
constexpr size_t kMaxQuoted = 40;

// Hex digit values; 0xFF marks a character that is not a hex digit.
struct HexTable {
  unsigned char v[256];
  HexTable() {
    std::memset(v, 0xFF, sizeof(v));
    for (int i = 0; i < 10; ++i) v['0' + i] = static_cast<unsigned char>(i);
    for (int i = 0; i < 6; ++i) {
      v['a' + i] = static_cast<unsigned char>(10 + i);
      v['A' + i] = static_cast<unsigned char>(10 + i);
    }
  }
};
const HexTable kHex;

std::string quote_text(const char* b, const char* e) {
  size_t n = static_cast<size_t>(e - b);
  std::string s = "'";
  if (n > kMaxQuoted) {
    s.append(b, kMaxQuoted);
    s += "...";
  } else {
    s.append(b, n);
  }
  s += "'";
  return s;
}

// SWAR helpers on 8 bytes (little-endian): high bit of each byte set iff lo < byte < hi
// (bytes below 128; lo, hi <= 128), without carries between bytes.
constexpr uint64_t kOnes = ~uint64_t{0} / 255;
inline uint64_t bytes_between(uint64_t x, uint64_t lo, uint64_t hi) {
  const uint64_t low7 = x & kOnes * 127;
  return (kOnes * (127 + hi) - low7) & ~x & (low7 + kOnes * (127 - lo)) & kOnes * 128;
}

// Parses exactly 8 hexadecimal digits at p (the first is the most significant) into v;
// false when one of them is not a hex digit. Same value as the digit-by-digit loop.
inline bool hex8(const char* p, uint64_t& v) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  const uint64_t ok = bytes_between(x, 0x2F, 0x3A) | bytes_between(x, 0x60, 0x67) |
                      bytes_between(x, 0x40, 0x47);
  if (ok != kOnes * 128) return false;
  // Digit values: low nibble, plus 9 for letters (bit 6 set).
  const uint64_t d = (x & kOnes * 0x0F) + ((x >> 6) & kOnes) * 9;
  // Byte i holds digit i; pack pairs, then quads, then the halves (first digit highest).
  const uint64_t a = ((d & 0x000F000F000F000FULL) << 4) | ((d >> 8) & 0x000F000F000F000FULL);
  const uint64_t b = ((a & 0x000000FF000000FFULL) << 8) | ((a >> 16) & 0x000000FF000000FFULL);
  v = ((b & 0xFFFF) << 16) | ((b >> 32) & 0xFFFF);
  return true;
}

// One field of a line: [b, e). `escaped` marks a quoted field holding "" pairs.
struct Field {
  const char* b;
  const char* e;
  bool escaped;
};

// Why a line was rejected: `field` is the 0-based file field (-1: the whole line).
struct LineError {
  int field = -1;
  std::string msg;
};

// Splits a line into fields. A field that starts with '"' is quoted: it ends at the next '"'
// not doubled, and "" inside stands for one '"'. Quoted fields cannot span lines.
bool split_fields(const char* b, const char* e, char delim, std::vector<Field>& out,
                  LineError& err) {
  out.clear();
  const char* p = b;
  for (;;) {
    if (p < e && *p == '"') {
      const char* q = p + 1;
      bool escaped = false;
      for (;;) {
        q = static_cast<const char*>(std::memchr(q, '"', static_cast<size_t>(e - q)));
        if (q == nullptr) {
          err.field = static_cast<int>(out.size());
          err.msg = "unterminated quoted field";
          return false;
        }
        if (q + 1 < e && q[1] == '"') {
          escaped = true;
          q += 2;
          continue;
        }
        break;
      }
      out.push_back({p + 1, q, escaped});
      p = q + 1;
      if (p < e && *p != delim) {
        err.field = static_cast<int>(out.size()) - 1;
        err.msg = "unexpected character after the closing quote";
        return false;
      }
    } else {
      const char* q = p;
      while (q < e && *q != delim) ++q;
      out.push_back({p, q, false});
      p = q;
    }
    if (p >= e) return true;
    ++p;  // the delimiter; a delimiter at the very end opens one more (empty) field
  }
}

// Replaces "" by " in a quoted field, using `scratch` as storage.
Field unescape(const Field& f, std::string& scratch) {
  scratch.clear();
  for (const char* p = f.b; p < f.e; ++p) {
    scratch.push_back(*p);
    if (*p == '"' && p + 1 < f.e && p[1] == '"') ++p;
  }
  return {scratch.data(), scratch.data() + scratch.size(), false};
}

// Parses a decimal number: [+-]digits[.digits][(e|E)[+-]digits], at least one mantissa digit.
// Text such as "nan", "inf", "0x10" or " 1" is rejected. Returns nullptr on success, else why.
const char* parse_number(const char* b, const char* e, float& out) {
  const char* p = b;
  bool neg = false;
  if (p < e && (*p == '+' || *p == '-')) {
    neg = *p == '-';
    ++p;
  }
  // Fast path: a plain integer of at most 18 digits.
  const char* digits = p;
  uint64_t v = 0;
  while (p < e && static_cast<unsigned>(*p - '0') < 10u && p - digits < 18) {
    v = v * 10 + static_cast<unsigned>(*p - '0');
    ++p;
  }
  if (p == e && p > digits) {
    double d = static_cast<double>(v);
    out = static_cast<float>(neg ? -d : d);
    return nullptr;
  }
  // General syntax check, then the standard conversion (locale independent).
  p = digits;
  int mant = 0;
  while (p < e && static_cast<unsigned>(*p - '0') < 10u) ++p, ++mant;
  if (p < e && *p == '.') {
    ++p;
    while (p < e && static_cast<unsigned>(*p - '0') < 10u) ++p, ++mant;
  }
  if (mant == 0) {
    std::string low;
    for (const char* q = digits; q < e && low.size() < 9; ++q)
      low.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(*q))));
    if (low == "nan" || low == "inf" || low == "infinity") return "is not a finite number";
    return "is not a number";
  }
  if (p < e && (*p == 'e' || *p == 'E')) {
    ++p;
    if (p < e && (*p == '+' || *p == '-')) ++p;
    int exp_digits = 0;
    while (p < e && static_cast<unsigned>(*p - '0') < 10u) ++p, ++exp_digits;
    if (exp_digits == 0) return "is not a number";
  }
  if (p != e) return "is not a number";
  double d = 0;
  auto res = std::from_chars(digits, e, d);
  if (res.ec == std::errc::result_out_of_range) return "is out of range";
  if (res.ec != std::errc() || res.ptr != e) return "is not a number";
  float f = static_cast<float>(neg ? -d : d);
  if (!std::isfinite(f)) return "is out of range";
  out = f;
  return nullptr;
}

// What a file field becomes in a RawChunk.
struct Target {
  ColumnKind kind = ColumnKind::Skip;
  int index = 0;  // dense or categorical ordinal
  bool multi_hot = false;
  int column = -1;  // schema column, -1 when the field is ignored
};

// Parses lines of one file layout into RawChunk rows. Immutable after construction, so one
// parser serves all threads; per-thread scratch lives in Scratch.
class LineParser {
 public:
  struct Scratch {
    std::vector<Field> fields;
    std::string unescaped;
  };

  LineParser(const Schema& schema, const std::vector<int>& field_to_column)
      : schema_(schema),
        num_dense_(schema.num_dense()),
        num_cat_(schema.num_cat()),
        hex_(schema.cat_encoding == CatEncoding::Hex) {
    std::vector<int> ordinal(schema.columns.size());
    int nd = 0, nc = 0;
    for (size_t i = 0; i < schema.columns.size(); ++i) {
      const auto& c = schema.columns[i];
      ordinal[i] = c.kind == ColumnKind::Dense ? nd++ : c.kind == ColumnKind::Categorical ? nc++ : 0;
    }
    for (int col : field_to_column) {
      Target t;
      if (col >= 0) {
        DLREC_CHECK(col < static_cast<int>(schema.columns.size()), "field mapping names column ",
                    col, " but the schema has ", schema.columns.size());
        const auto& c = schema.columns[col];
        t.kind = c.kind;
        t.index = ordinal[col];
        t.multi_hot = c.multi_hot;
        t.column = col;
      }
      targets_.push_back(t);
    }
  }

  int num_fields() const { return static_cast<int>(targets_.size()); }

  // Appends the line as row `out.rows`; on failure leaves `out` unchanged and fills `err`.
  // One pass over the line: fields are cut and parsed as they come. A wrong field count is
  // reported in preference to a bad value (a missing tab shifts every later field).
  bool parse(const char* b, const char* e, RawChunk& out, Scratch& s, LineError& err) const {
    if (parse_fast(b, e, out)) return true;
    return parse_general(b, e, out, s, err);
  }

  // The common case in one tight pass: no quoted field, plain integers (at most 18 digits) or
  // empty fields in dense columns, 0/1 labels, hexadecimal or hashed categories. Whatever else
  // (a quote, a decimal point, a bad value, a wrong field count) rolls the row back and returns
  // false, and parse_general() decides, so both paths give the same values and errors.
  // Flattened: every call in it inlined (the vectors' push_back were calls, 26 per row for the
  // offsets; -6 % user CPU of a 1-thread `bench etl` on the 2-core build machine).
  [[gnu::flatten]] bool parse_fast(const char* b, const char* e, RawChunk& out) const {
    const int64_t r = out.rows;
    const int nf = num_fields();
    const char delim = schema_.delimiter;
    float label = 0;
    out.dense.resize(static_cast<size_t>((r + 1) * num_dense_), kNaN);
    float* dense = out.dense.data() + r * num_dense_;
    const char* p = b;
    for (int i = 0; i < nf; ++i) {
      const Target& t = targets_[i];
      if (p < e && *p == '"') return rollback(out);
      const char* q = p;
      switch (t.kind) {
        case ColumnKind::Label:
          if (q < e && (*q == '0' || *q == '1') && (q + 1 == e || q[1] == delim)) {
            label = *q == '1' ? 1.f : 0.f;
            ++q;
          } else {
            return rollback(out);
          }
          break;
        case ColumnKind::Dense: {
          if (q == e || *q == delim) break;  // missing
          bool neg = false;
          if (*q == '-' || *q == '+') {
            neg = *q == '-';
            ++q;
          }
          const char* d0 = q;
          uint64_t v = 0;
          while (q < e && static_cast<unsigned>(*q - '0') < 10u) {
            v = v * 10 + static_cast<unsigned>(*q - '0');
            ++q;
          }
          if (q == d0 || q - d0 > 18 || (q < e && *q != delim)) return rollback(out);
          const double d = static_cast<double>(v);
          dense[t.index] = static_cast<float>(neg ? -d : d);
          break;
        }
        case ColumnKind::Categorical: {
          if (q == e || *q == delim) break;  // missing
          if (hex_ && !t.multi_hot) {
            if (e - q >= 8 && (e - q == 8 || q[8] == delim)) {  // 8 digits: Criteo's keys
              uint64_t v8;
              if (hex8(q, v8)) {
                out.cat_values[t.index].push_back(v8);
                q += 8;
                break;
              }
            }
            uint64_t v = 0;
            while (q < e) {
              const unsigned d = kHex.v[static_cast<unsigned char>(*q)];
              if (d == 0xFF) break;
              v = (v << 4) | d;
              ++q;
            }
            if (q - p > 16 || (q < e && *q != delim)) return rollback(out);
            out.cat_values[t.index].push_back(v);
            break;
          }
          while (q < e && *q != delim) ++q;
          if (parse_cat({p, q, false}, t.multi_hot, out.cat_values[t.index]) != nullptr)
            return rollback(out);
          break;
        }
        case ColumnKind::Skip:
          while (q < e && *q != delim) ++q;
          break;
      }
      p = q;
      if (i + 1 < nf) {
        if (p >= e) return rollback(out);  // too few fields
        ++p;                               // the delimiter
      }
    }
    if (p != e) return rollback(out);  // more fields (or a trailing delimiter)
    out.label.push_back(label);
    for (int c = 0; c < num_cat_; ++c)
      out.cat_offsets[c].push_back(static_cast<int64_t>(out.cat_values[c].size()));
    ++out.rows;
    return true;
  }

  bool parse_general(const char* b, const char* e, RawChunk& out, Scratch& s,
                     LineError& err) const {
    const int64_t r = out.rows;
    const int nf = num_fields();
    const char delim = schema_.delimiter;
    float label = 0;
    out.dense.resize(static_cast<size_t>((r + 1) * num_dense_), kNaN);
    float* dense = out.dense.data() + r * num_dense_;
    bool bad = false;
    int i = 0;
    for (const char* p = b;; ++p, ++i) {
      Field f;
      if (p < e && *p == '"') {
        const char* q = p + 1;
        bool escaped = false;
        for (;;) {
          q = static_cast<const char*>(std::memchr(q, '"', static_cast<size_t>(e - q)));
          if (q == nullptr || (q + 1 < e && q[1] != '"' && q[1] != delim)) {
            err.field = i;
            err.msg = q ? "unexpected character after the closing quote"
                        : "unterminated quoted field";
            return rollback(out);
          }
          if (q + 1 < e && q[1] == '"') {
            escaped = true;
            q += 2;
            continue;
          }
          break;
        }
        f = escaped ? unescape({p + 1, q, true}, s.unescaped) : Field{p + 1, q, false};
        p = q + 1;
      } else {
        const char* q = p;
        while (q < e && *q != delim) ++q;
        f = {p, q, false};
        p = q;
      }
      if (i < nf && !bad && targets_[i].kind != ColumnKind::Skip) {
        const char* why = parse_field(targets_[i], f, dense, label, out);
        if (why != nullptr) {
          bad = true;
          err.field = i;
          if (why == kBadLabel)
            err.msg = "label must be 0 or 1, got " + quote_text(f.b, f.e);
          else if (f.b == f.e)
            err.msg = why;
          else
            err.msg = quote_text(f.b, f.e) + " " + why;
        }
      }
      if (p >= e) break;
    }
    if (i + 1 != nf) {
      err.field = -1;
      err.msg = "expected " + std::to_string(nf) + " fields, got " + std::to_string(i + 1);
      return rollback(out);
    }
    if (bad) return rollback(out);
    out.label.push_back(label);
    for (int c = 0; c < num_cat_; ++c)
      out.cat_offsets[c].push_back(static_cast<int64_t>(out.cat_values[c].size()));
    ++out.rows;
    return true;
  }

  // "column 15 (C1): " for a field error, "" for a line error.
  std::string field_prefix(int field) const {
    if (field < 0) return "";
    std::string s = "column " + std::to_string(field + 1);
    if (field < num_fields() && targets_[field].column >= 0)
      s += " (" + schema_.columns[targets_[field].column].name + ")";
    return s + ": ";
  }

 private:
  static constexpr const char* kBadLabel = "label must be 0 or 1";

  // Parses one field into the row; returns nullptr or why the field is bad.
  const char* parse_field(const Target& t, const Field& f, float* dense, float& label,
                          RawChunk& out) const {
    switch (t.kind) {
      case ColumnKind::Label: {
        if (f.b == f.e) return "the label is missing";
        float v = 0;
        if (parse_number(f.b, f.e, v) != nullptr || (v != 0.f && v != 1.f)) return kBadLabel;
        label = v;
        return nullptr;
      }
      case ColumnKind::Dense:
        return f.b == f.e ? nullptr : parse_number(f.b, f.e, dense[t.index]);
      case ColumnKind::Categorical:
        return parse_cat(f, t.multi_hot, out.cat_values[t.index]);
      case ColumnKind::Skip:
        break;
    }
    return nullptr;
  }

  bool rollback(RawChunk& out) const {
    out.dense.resize(static_cast<size_t>(out.rows * num_dense_));
    for (int c = 0; c < num_cat_; ++c)
      out.cat_values[c].resize(static_cast<size_t>(out.cat_offsets[c].back()));
    return false;
  }

  const char* parse_one(const char* b, const char* e, std::vector<uint64_t>& vals) const {
    if (!hex_) {
      vals.push_back(hash_category(std::string_view(b, static_cast<size_t>(e - b))));
      return nullptr;
    }
    if (e - b > 16) return "is not a hexadecimal category (more than 16 digits)";
    uint64_t v = 0;
    for (const char* p = b; p < e; ++p) {
      unsigned d = kHex.v[static_cast<unsigned char>(*p)];
      if (d == 0xFF) return "is not a hexadecimal category";
      v = (v << 4) | d;
    }
    vals.push_back(v);
    return nullptr;
  }

  const char* parse_cat(const Field& f, bool multi_hot, std::vector<uint64_t>& vals) const {
    if (f.b == f.e) return nullptr;  // missing: an empty list
    if (!multi_hot) return parse_one(f.b, f.e, vals);
    const char sep = schema_.list_sep;
    for (const char* p = f.b; p < f.e;) {
      const char* q = p;
      while (q < f.e && *q != sep) ++q;
      if (q > p) {  // empty items ("a,,b") are ignored
        if (const char* why = parse_one(p, q, vals)) return why;
      }
      p = q + 1;
    }
    return nullptr;
  }

  const Schema& schema_;
  int num_dense_, num_cat_;
  bool hex_;
  std::vector<Target> targets_;
};

}  // namespace

OnError parse_on_error(const std::string& s) {
  if (s == "fail") return OnError::Fail;
  if (s == "skip") return OnError::Skip;
  std::string near = nearest_name(s, {"fail", "skip"});
  fail("on_error must be 'fail' or 'skip', got '", s, "'",
       near.empty() ? "" : " (did you mean '" + near + "'?)");
}

std::vector<int> field_mapping(const Schema& schema, const std::string& header_line,
                               const std::string& file) {
  std::vector<int> map;
  if (!schema.header) {
    for (size_t i = 0; i < schema.columns.size(); ++i) map.push_back(static_cast<int>(i));
    return map;
  }
  const char* b = header_line.data();
  const char* e = b + header_line.size();
  if (e - b >= 3 && std::memcmp(b, "\xEF\xBB\xBF", 3) == 0) b += 3;  // UTF-8 byte order mark
  while (e > b && (e[-1] == '\r' || e[-1] == '\n')) --e;
  std::vector<Field> fields;
  LineError err;
  if (!split_fields(b, e, schema.delimiter, fields, err))
    fail(file, ":1: header column ", err.field + 1, ": ", err.msg);
  std::unordered_map<std::string, int> by_name;
  for (size_t i = 0; i < schema.columns.size(); ++i)
    by_name[schema.columns[i].name] = static_cast<int>(i);
  std::vector<int> seen(schema.columns.size(), -1);
  std::vector<std::string> header_names;
  std::string scratch;
  for (size_t i = 0; i < fields.size(); ++i) {
    Field f = fields[i].escaped ? unescape(fields[i], scratch) : fields[i];
    std::string name(f.b, f.e);
    // Surrounding blanks in a header name are not part of it.
    size_t s0 = name.find_first_not_of(" \t"), s1 = name.find_last_not_of(" \t");
    name = s0 == std::string::npos ? "" : name.substr(s0, s1 - s0 + 1);
    header_names.push_back(name);
    auto it = by_name.find(name);
    int col = it == by_name.end() ? -1 : it->second;
    if (col >= 0) {
      if (seen[col] >= 0)
        fail(file, ":1: column '", name, "' appears twice in the header (columns ", seen[col] + 1,
             " and ", i + 1, ")");
      seen[col] = static_cast<int>(i);
    }
    map.push_back(col);  // header columns the schema does not name are ignored
  }
  for (size_t c = 0; c < schema.columns.size(); ++c) {
    if (seen[c] >= 0 || schema.columns[c].kind == ColumnKind::Skip) continue;
    std::string near = nearest_name(schema.columns[c].name, header_names);
    fail(file, ":1: the header has no column '", schema.columns[c].name, "'",
         near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  return map;
}

void parse_line(const char* begin, const char* end, const Schema& schema,
                const std::vector<int>& field_to_column, RawChunk& out, const std::string& where) {
  const int nd = schema.num_dense(), nc = schema.num_cat();
  if (out.rows == 0 && (out.num_dense != nd || out.num_cat != nc ||
                        static_cast<int>(out.cat_offsets.size()) != nc))
    out.reset(nd, nc);
  DLREC_CHECK(out.num_dense == nd && out.num_cat == nc, where,
              ": parse_line: chunk column counts differ from the schema");
  while (end > begin && (end[-1] == '\n' || end[-1] == '\r')) --end;
  LineParser parser(schema, field_to_column);
  LineParser::Scratch scratch;
  LineError err;
  if (!parser.parse(begin, end, out, scratch, err))
    fail(where, ": ", parser.field_prefix(err.field), err.msg);
}

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

  // Maps a regular, non-empty file; false to read it in blocks instead.
  bool map_file() {
    int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st {};
    void* m = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
      m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return false;
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
        if (le == lb) continue;  // blank lines carry no row
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
        if (opt.on_error == OnError::Fail) return;
        ++P.skipped;
        P.skip_rows.push_back(P.chunk.rows);
      }
    } catch (...) {
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

  bool open_next() {
    close_current();
    if (next_file >= files.size()) return false;
    name = files[next_file++];
    pos = end = 0;
    eof = false;
    if (!map_file()) {
      file.reset(std::fopen(name.c_str(), "rb"));
      if (!file) fail("cannot open '", name, "': ", std::strerror(errno));
      data = buf.get();
      end = 0;
    }
    is_open = true;
    line_no = 1;
    std::string header;
    if (schema.header) {
      size_t scan = pos;
      size_t nl = find_newline(scan);
      size_t stop = nl == std::string::npos ? end : nl;
      header.assign(data + pos, stop - pos);
      size_t consumed = nl == std::string::npos ? end - pos : nl + 1 - pos;
      stats.bytes += static_cast<int64_t>(consumed);
      pos += consumed;
      line_no = 2;
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
      if (l.first == l.second) continue;  // blank lines carry no row
      const int64_t before = out.rows;
      if (parser->parse(base + l.first, base + l.second, out, s, err)) {
        if (before == 0) out.first_line = line_no + i;
        continue;
      }
      if (res.error_line < 0) {
        res.error_line = i;
        res.error = err;
      }
      if (opt.on_error == OnError::Fail) return;
      ++res.skipped;
    }
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
