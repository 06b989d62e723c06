// Private to the text reader files (text_line.cc, text_reader.cc): splitting a line into
// fields, number and hex parsing, and LineParser, which turns one line of a schema's format into
// a row of a RawChunk. Inline here so that both files compile the same fast paths.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/io/raw_chunk.h"
#include "dlrec/io/schema.h"
#include "text_digits.h"

namespace dlrec::io::text_detail {

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
inline const HexTable kHex;

inline std::string quote_text(const char* b, const char* e) {
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

// RFC 4180 quoting errors (the same text from every path).
constexpr const char* kUnterminatedQuote =
    "unterminated quoted field (a quoted field that spans lines is not supported)";
constexpr const char* kAfterClosingQuote =
    "unexpected character after the closing quote (a '\"' inside a quoted field is written "
    "'\"\"')";
constexpr const char* kQuoteInUnquoted =
    "a '\"' inside an unquoted field (RFC 4180: quote the whole field and double the quote, "
    "e.g. \"5'10\"\"\")";

// Whether [b, e) holds a '"'.
inline bool has_quote(const char* b, const char* e) {
  return b < e && std::memchr(b, '"', static_cast<size_t>(e - b)) != nullptr;
}

// Splits a line into fields. A field that starts with '"' is quoted: it ends at the next '"'
// not doubled, and "" inside stands for one '"'. Quoted fields cannot span lines.
inline bool split_fields(const char* b, const char* e, char delim, std::vector<Field>& out,
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
          err.msg = kUnterminatedQuote;
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
        err.msg = kAfterClosingQuote;
        return false;
      }
    } else {
      const char* q = p;
      while (q < e && *q != delim) ++q;
      if (has_quote(p, q)) {
        err.field = static_cast<int>(out.size());
        err.msg = kQuoteInUnquoted;
        return false;
      }
      out.push_back({p, q, false});
      p = q;
    }
    if (p >= e) return true;
    ++p;  // the delimiter; a delimiter at the very end opens one more (empty) field
  }
}

// Replaces "" by " in a quoted field, using `scratch` as storage.
inline Field unescape(const Field& f, std::string& scratch) {
  scratch.clear();
  for (const char* p = f.b; p < f.e; ++p) {
    scratch.push_back(*p);
    if (*p == '"' && p + 1 < f.e && p[1] == '"') ++p;
  }
  return {scratch.data(), scratch.data() + scratch.size(), false};
}

// Parses a decimal number: [+-]digits[.digits][(e|E)[+-]digits], at least one mantissa digit.
// Text such as "nan", "inf", "0x10" or " 1" is rejected. Returns nullptr on success, else why.
inline const char* parse_number(const char* b, const char* e, float& out) {
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

// v[b][j]: the set bits among bits 0..j of byte b.
struct PrefixCounts {
  uint8_t v[256][8];
  constexpr PrefixCounts() : v() {
    for (int b = 0; b < 256; ++b)
      for (int j = 0, n = 0; j < 8; ++j) v[b][j] = static_cast<uint8_t>(n += (b >> j) & 1);
  }
};
inline constexpr PrefixCounts kPrefixCounts;

// Transposes a 64 x 64 bit matrix in place: bit c of a[r] becomes bit r of a[c]. Six rounds
// of block swaps (32 x 32 blocks, then 16 x 16, ...), each swap a few word operations.
inline void transpose64(uint64_t* a) {
  uint64_t m = 0x00000000FFFFFFFFull;
  for (int j = 32; j != 0; j >>= 1, m ^= m << j)
    for (int k = 0; k < 64; k = (k + j + 1) & ~j) {
      const uint64_t t = ((a[k] >> j) ^ a[k + j]) & m;
      a[k + j] ^= t;
      a[k] ^= t << j;
    }
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
    // Deferred offsets (Criteo-shaped layouts, deferred_offsets()): the rows parse_fast
    // appended to `pending_chunk` whose categorical offsets are not written yet, one word per
    // row (bit c: column c got a value). finish() writes them.
    std::vector<uint64_t> pending;
    const RawChunk* pending_chunk = nullptr;
    // Bit c: a pending row (or a row rolled back since) gave column c a value of 2^32 or more.
    uint64_t wide = 0;
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
    // Deferred offsets when every categorical field is a one-hot hex key and each column is
    // fed by one field at most: a row then adds at most one value per column, which one bit
    // per column records.
    std::vector<int> fields_of(static_cast<size_t>(num_cat_), 0);
    bool one_each = true;
    for (const Target& t : targets_)
      if (t.kind == ColumnKind::Categorical) {
        one_each = one_each && !t.multi_hot && fields_of[t.index] == 0;
        ++fields_of[t.index];
      }
    deferred_ = hex_ && one_each && num_cat_ > 0 && num_cat_ <= 64;
    // The plain layout (Criteo's): [label,] the dense columns in order, the categorical ones
    // in order, every field read, nothing else.
    const int label = !targets_.empty() && targets_[0].kind == ColumnKind::Label ? 1 : 0;
    plain_ = deferred_ && num_fields() == label + num_dense_ + num_cat_;
    for (int i = label; plain_ && i < num_fields(); ++i) {
      const Target& t = targets_[i];
      plain_ = i < label + num_dense_
                   ? t.kind == ColumnKind::Dense && t.index == i - label
                   : t.kind == ColumnKind::Categorical && t.index == i - label - num_dense_;
    }
    plain_label_ = label == 1;
  }

  // Whether parse() defers the categorical offsets of the rows it appends (until finish()).
  bool deferred_offsets() const { return deferred_; }

  int num_fields() const { return static_cast<int>(targets_.size()); }

  // Appends the line as row `out.rows`; on failure leaves `out` unchanged and fills `err`.
  // One pass over the line: fields are cut and parsed as they come. A wrong field count is
  // reported in preference to a bad value (a missing tab shifts every later field).
  // With deferred_offsets(), the rows that take the fast path get their categorical offsets
  // only at finish(out, s): call it once the chunk is complete (before anything reads it, and
  // before `out` is reset or `s` parses into another chunk). Until then out.rows and every
  // other part of the chunk are up to date.
  bool parse(const char* b, const char* e, RawChunk& out, Scratch& s, LineError& err) const {
    if (deferred_) {
      if (!s.pending.empty() && s.pending_chunk != &out)
        fail("LineParser: rows of another chunk wait for finish()");
      if (plain_ ? parse_plain(b, e, out, s) : parse_fast<true>(b, e, out, &s)) return true;
      finish(out, s);  // the general parser appends offsets itself
    } else if (parse_fast<false>(b, e, out, nullptr)) {
      return true;
    }
    return parse_general(b, e, out, s, err);
  }

  // Writes the deferred offsets of the rows parse() appended to `out` (nothing to do without
  // deferred_offsets() or pending rows). 64 rows at a time: their words are transposed into
  // one 64-bit mask per column, and each column's offsets are written from its mask eight rows
  // per step (a table of the byte's prefix counts), one stream per column instead of 26
  // interleaved streams per row.
  // When the pending rows are all of the chunk's rows, it also records out.cat_facts (the
  // transposed words are the presence bitmaps); else it clears them.
  void finish(RawChunk& out, Scratch& s) const {
    if (s.pending.empty()) {
      s.wide = 0;
      return;
    }
    if (s.pending_chunk != &out) fail("LineParser::finish: the pending rows are another chunk's");
    const int64_t n = static_cast<int64_t>(s.pending.size());
    int64_t* o[64];
    int64_t v[64];
    RawChunk::CatFacts& facts = out.cat_facts;
    const bool whole = out.cat_offsets[0].size() == 1;  // no row before the pending ones
    const int64_t words = (n + 63) / 64;
    if (whole) {
      const uint64_t all = num_cat_ == 64 ? ~uint64_t{0} : (uint64_t{1} << num_cat_) - 1;
      facts.rows = n;
      facts.narrow = all & ~s.wide;
      facts.counts.resize(static_cast<size_t>(num_cat_));
      facts.present.resize(static_cast<size_t>(num_cat_ * words));
    } else {
      facts.clear();
    }
    s.wide = 0;
    for (int c = 0; c < num_cat_; ++c) {
      auto& off = out.cat_offsets[c];
      const size_t base = off.size();
      if (base == 0 || static_cast<int64_t>(base) + n != out.rows + 1)
        fail("LineParser::finish: ", base, " offsets and ", n, " pending rows for a chunk of ",
             out.rows, " rows");
      off.resize(base + static_cast<size_t>(n));
      o[c] = off.data() + base;
      v[c] = o[c][-1];
    }
    const uint64_t* w = s.pending.data();
    uint64_t block[64];
    for (int64_t r0 = 0; r0 < n; r0 += 64) {
      const int m = static_cast<int>(std::min<int64_t>(64, n - r0));
      std::copy(w + r0, w + r0 + m, block);
      std::fill(block + m, block + 64, uint64_t{0});
      transpose64(block);  // block[c]: bit r = row r0 + r has a value in column c
      if (whole)
        for (int c = 0; c < num_cat_; ++c) facts.present[c * words + r0 / 64] = block[c];
      for (int c = 0; c < num_cat_; ++c) {
        int64_t* dst = o[c] + r0;
        int64_t at = v[c];
        int r = 0;
        for (; r + 8 <= m; r += 8) {
          const uint8_t* before = kPrefixCounts.v[(block[c] >> r) & 0xFF];
          for (int j = 0; j < 8; ++j) dst[r + j] = at + before[j];
          at += before[7];
        }
        for (; r < m; ++r) dst[r] = at += static_cast<int64_t>((block[c] >> r) & 1);
        v[c] = at;
      }
    }
    if (whole)
      for (int c = 0; c < num_cat_; ++c) facts.counts[c] = v[c];  // the offsets start at 0
    s.pending.clear();
    s.pending_chunk = nullptr;
  }

  // The common case in one tight pass: no quoted field, plain integers (at most 18 digits) or
  // empty fields in dense columns, 0/1 labels, hexadecimal or hashed categories. Whatever else
  // (a quote, a decimal point, a bad value, a wrong field count) rolls the row back and returns
  // false, and parse_general() decides, so both paths give the same values and errors.
  // Flattened: every call in it inlined (the vectors' push_back were calls, 26 per row for the
  // offsets; -6 % user CPU of a 1-thread `bench etl` on the 2-core build machine).
  // kDeferred: the row's categorical offsets go to s->pending as one word (deferred_offsets()).
  template <bool kDeferred>
  [[gnu::flatten]] bool parse_fast(const char* b, const char* e, RawChunk& out, Scratch* s) const {
    const int64_t r = out.rows;
    uint64_t got = 0;  // kDeferred: bit c = column c got a value in this row
    // Rolls the row back: its values are the last of the columns whose bit is set in `got`.
    auto rollback = [&](RawChunk& o) {
      if constexpr (!kDeferred) return this->rollback(o);
      o.dense.resize(static_cast<size_t>(o.rows * num_dense_));
      for (uint64_t m = got; m != 0; m &= m - 1) o.cat_values[__builtin_ctzll(m)].pop_back();
      return false;
    };
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
          // Up to 8 digits at once where 8 bytes are left in the line; then (more digits, or
          // the line's last bytes) one by one.
          if (e - q >= 8) {
            const int k = digits8(q, v);
            q += k;
            if (k < 8 && k > 0 && *q == delim) {
              const double d = static_cast<double>(v);
              dense[t.index] = static_cast<float>(neg ? -d : d);
              break;
            }
          }
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
          if (kDeferred || (hex_ && !t.multi_hot)) {  // deferred: every one is
            if (e - q >= 8 && (e - q == 8 || q[8] == delim)) {  // 8 digits: Criteo's keys
              uint64_t v8;
              if (hex8(q, v8)) {
                out.cat_values[t.index].push_back(v8);
                if constexpr (kDeferred) got |= uint64_t{1} << t.index;
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
            if constexpr (kDeferred) {
              got |= uint64_t{1} << t.index;
              if (v >> 32) s->wide |= uint64_t{1} << t.index;
            }
            break;
          }
          if constexpr (kDeferred) return rollback(out);  // not a deferred layout: never here
          // A '"' inside the field: the general parser reports it (RFC 4180).
          while (q < e && *q != delim && *q != '"') ++q;
          if ((q < e && *q == '"') ||
              parse_cat({p, q, false}, t.multi_hot, out.cat_values[t.index]) != nullptr)
            return rollback(out);
          break;
        }
        case ColumnKind::Skip:
          while (q < e && *q != delim && *q != '"') ++q;
          if (q < e && *q == '"') return rollback(out);
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
    if constexpr (kDeferred) {
      s->pending.push_back(got);
      s->pending_chunk = &out;
    } else {
      for (int c = 0; c < num_cat_; ++c)
        out.cat_offsets[c].push_back(static_cast<int64_t>(out.cat_values[c].size()));
    }
    ++out.rows;
    return true;
  }

  // parse_fast<true> for the plain layout (plain_: [label,] dense, categorical, in order):
  // the same rows accepted and the same values, with no per-field dispatch: a loop per kind
  // of column, the dense values 8 digits at a time, each categorical field's end known from
  // its 8 digits (Criteo's keys) before any other test.
  [[gnu::flatten]] bool parse_plain(const char* b, const char* e, RawChunk& out,
                                    Scratch& s) const {
    const int64_t r = out.rows;
    const char delim = schema_.delimiter;
    const int nd = num_dense_, nc = num_cat_;
    std::vector<uint64_t>* vals = out.cat_values.data();
    uint64_t got = 0;  // bit c: column c got a value in this row
    auto rollback = [&] {
      out.dense.resize(static_cast<size_t>(r * nd));
      for (uint64_t m = got; m != 0; m &= m - 1) vals[__builtin_ctzll(m)].pop_back();
      return false;
    };
    const char* p = b;
    float label = 0;
    if (plain_label_) {  // "0" or "1", then a delimiter (more fields follow: nc > 0)
      if (e - p < 2 || (*p != '0' && *p != '1') || p[1] != delim) return false;
      label = *p == '1' ? 1.f : 0.f;
      p += 2;
    }
    out.dense.resize(static_cast<size_t>((r + 1) * nd), kNaN);
    float* dense = out.dense.data() + r * nd;
    for (int j = 0; j < nd; ++j) {  // each followed by a delimiter (nc > 0)
      if (p == e) return rollback();
      if (*p == delim) {  // missing
        ++p;
        continue;
      }
      bool neg = false;
      if (*p == '-' || *p == '+') {
        neg = *p == '-';
        ++p;
      }
      const char* d0 = p;
      uint64_t v = 0;
      if (e - p >= 8) p += digits8(p, v);
      if (p - d0 == 8 || e - d0 < 8)
        while (p < e && static_cast<unsigned>(*p - '0') < 10u) {
          v = v * 10 + static_cast<unsigned>(*p - '0');
          ++p;
        }
      if (p == d0 || p - d0 > 18 || p == e || *p != delim) return rollback();
      const double d = static_cast<double>(v);
      dense[j] = static_cast<float>(neg ? -d : d);
      ++p;
    }
    for (int c = 0; c < nc; ++c) {
      const bool last = c + 1 == nc;
      // The field's end: the line's end for the last column, else a delimiter.
      if (last ? e - p == 8 : e - p > 8 && p[8] == delim) {
        uint64_t v8;
        if (hex8(p, v8)) {
          vals[c].push_back(v8);
          got |= uint64_t{1} << c;
          p += 9;
          continue;
        }
      }
      const char* q = p;
      uint64_t v = 0;
      while (q < e) {
        const unsigned d = kHex.v[static_cast<unsigned char>(*q)];
        if (d == 0xFF) break;
        v = (v << 4) | d;
        ++q;
      }
      if (q - p > 16 || (last ? q != e : q == e || *q != delim)) return rollback();
      if (q > p) {  // else missing
        vals[c].push_back(v);
        got |= uint64_t{1} << c;
        if (v >> 32) s.wide |= uint64_t{1} << c;  // (kept if the row rolls back, as there)
      }
      p = q + 1;
    }
    out.label.push_back(label);
    s.pending.push_back(got);
    s.pending_chunk = &out;
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
            err.msg = q ? kAfterClosingQuote : kUnterminatedQuote;
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
        if (has_quote(p, q)) {
          err.field = i;
          err.msg = kQuoteInUnquoted;
          return rollback(out);
        }
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
  bool deferred_ = false;  // deferred_offsets()
  bool plain_ = false, plain_label_ = false;  // parse_plain() takes the rows; a label first
  std::vector<Target> targets_;
};


}  // namespace dlrec::io::text_detail
