// Parquet reader/writer: round trips for every type, encoding and codec (nulls, lists, several
// row groups and pages), the RawChunk conversion, and corrupt files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

#include "../src/io/thrift_compact.h"
#include "dlrec/core/error.h"
#include "dlrec/io/parquet.h"

namespace dlrec::io {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/pq_" + std::to_string(::getpid()) + "_" + name;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const std::string& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A column of `rows` rows with ~1/5 nulls (when nullable) and, for lists, 0..4 elements with
// some null elements and some null lists.
ParquetColumnData make_column(const ParquetField& f, int64_t rows, std::mt19937_64& rng) {
  ParquetColumnData c;
  c.rows = rows;
  auto put = [&](bool present) {
    c.valid.push_back(present);
    const uint64_t x = rng();
    switch (f.type) {
      case ParquetType::Boolean: c.ints.push_back(present ? x & 1 : 0); break;
      case ParquetType::Int32:
        c.ints.push_back(present ? static_cast<int32_t>(x % 2001) - 1000 : 0);
        break;
      case ParquetType::Int64:
        c.ints.push_back(present ? static_cast<int64_t>(x % 50) * 1000000007LL - 7 : 0);
        break;
      case ParquetType::Float: c.reals.push_back(present ? static_cast<float>(x % 97) / 8.f : 0); break;
      case ParquetType::Double: c.reals.push_back(present ? static_cast<double>(x % 1000) / 3.0 : 0); break;
      case ParquetType::ByteArray:
        c.strings.push_back(present ? "v" + std::to_string(x % 30) + std::string(x % 3, 'z') : "");
        break;
    }
  };
  if (!f.list) {
    for (int64_t r = 0; r < rows; ++r) put(!f.nullable || rng() % 5 != 0);
    return c;
  }
  c.offsets.push_back(0);
  for (int64_t r = 0; r < rows; ++r) {
    const bool null_list = f.nullable && rng() % 7 == 0;
    c.row_valid.push_back(!null_list);
    if (!null_list) {
      const int n = static_cast<int>(rng() % 5);
      for (int k = 0; k < n; ++k) put(rng() % 9 != 0);
    }
    c.offsets.push_back(static_cast<int64_t>(c.valid.size()));
  }
  return c;
}

// Appends b's rows to a (for concatenating row groups read back).
void append(ParquetColumnData& a, const ParquetColumnData& b, bool list) {
  if (list) {
    if (a.offsets.empty()) a.offsets.push_back(0);
    const int64_t base = a.offsets.back();
    for (int64_t r = 1; r <= b.rows; ++r) a.offsets.push_back(base + b.offsets[r]);
    a.row_valid.insert(a.row_valid.end(), b.row_valid.begin(), b.row_valid.end());
  }
  a.rows += b.rows;
  a.ints.insert(a.ints.end(), b.ints.begin(), b.ints.end());
  a.reals.insert(a.reals.end(), b.reals.begin(), b.reals.end());
  a.strings.insert(a.strings.end(), b.strings.begin(), b.strings.end());
  a.valid.insert(a.valid.end(), b.valid.begin(), b.valid.end());
}

void expect_same(const ParquetColumnData& want, const ParquetColumnData& got, const std::string& what) {
  ASSERT_EQ(want.rows, got.rows) << what;
  ASSERT_EQ(want.slots(), got.slots()) << what;
  EXPECT_EQ(want.offsets, got.offsets) << what;
  for (int64_t r = 0; r < want.rows && !want.offsets.empty(); ++r)
    ASSERT_EQ(want.row_present(r), got.row_present(r)) << what << " row " << r;
  for (int64_t s = 0; s < want.slots(); ++s) {
    ASSERT_EQ(want.present(s), got.present(s)) << what << " slot " << s;
    if (!want.present(s)) continue;
    if (!want.ints.empty()) {
      ASSERT_EQ(want.ints[s], got.ints[s]) << what << " slot " << s;
    }
    if (!want.reals.empty()) {
      ASSERT_EQ(want.reals[s], got.reals[s]) << what << " slot " << s;
    }
    if (!want.strings.empty()) {
      ASSERT_EQ(want.strings[s], got.strings[s]) << what << " slot " << s;
    }
  }
}

std::vector<ParquetField> all_fields() {
  std::vector<ParquetField> f;
  const ParquetType types[] = {ParquetType::Boolean, ParquetType::Int32, ParquetType::Int64,
                               ParquetType::Float, ParquetType::Double, ParquetType::ByteArray};
  for (ParquetType t : types) {
    const std::string n = parquet_type_name(t);
    f.push_back({n + "_opt", t, true, false});
    f.push_back({n + "_req", t, false, false});
    f.push_back({n + "_list", t, true, true});
  }
  f.push_back({"INT64_list_req", ParquetType::Int64, false, true});
  return f;
}

class ParquetRoundTrip
    : public ::testing::TestWithParam<std::tuple<ParquetCodec, bool /*dictionary*/>> {};

TEST_P(ParquetRoundTrip, EveryTypeNullsListsRowGroupsPages) {
  const auto [codec, dict] = GetParam();
  const auto fields = all_fields();
  std::mt19937_64 rng(7);
  const int64_t rows = 1000;
  std::vector<ParquetColumnData> cols;
  for (const auto& f : fields) cols.push_back(make_column(f, rows, rng));
  ParquetWriteOptions o;
  o.codec = codec;
  o.dictionary = dict;
  o.row_group_rows = 300;  // 4 row groups, the last one short
  o.page_rows = 64;        // several pages per chunk
  const std::string path = temp_path("rt.parquet");
  write_parquet(path, fields, cols, o);

  ParquetFile file(path);
  EXPECT_EQ(file.num_rows(), rows);
  EXPECT_EQ(file.num_row_groups(), 4);
  EXPECT_EQ(file.row_group_rows(3), 100);
  ASSERT_EQ(file.fields().size(), fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    const ParquetField& f = file.fields()[i];
    EXPECT_EQ(f.name, fields[i].name);
    EXPECT_EQ(f.type, fields[i].type) << f.name;
    EXPECT_EQ(f.nullable, fields[i].nullable) << f.name;
    EXPECT_EQ(f.list, fields[i].list) << f.name;
    EXPECT_TRUE(file.unsupported_reason(static_cast<int>(i)).empty());
    ParquetColumnData got;
    for (int g = 0; g < file.num_row_groups(); ++g)
      append(got, file.read_column(g, static_cast<int>(i)), f.list);
    expect_same(cols[i], got, f.name);
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    ParquetCodecsAndEncodings, ParquetRoundTrip,
    ::testing::Combine(::testing::Values(ParquetCodec::Uncompressed, ParquetCodec::Snappy,
                                         ParquetCodec::Zstd),
                       ::testing::Bool()));

TEST(Parquet, DictionaryFallsBackToPlainWhenLarge) {
  ParquetField f{"s", ParquetType::ByteArray, false, false};
  ParquetColumnData c;
  c.rows = 5000;
  for (int i = 0; i < c.rows; ++i) c.strings.push_back("distinct-value-" + std::to_string(i));
  ParquetWriteOptions o;
  o.dictionary_max_bytes = 1000;
  const std::string path = temp_path("fallback.parquet");
  write_parquet(path, {f}, {c}, o);
  ParquetFile file(path);
  expect_same(c, file.read_column(0, 0), "s");
  std::remove(path.c_str());
}

TEST(Parquet, WriterRejectsBadColumns) {
  const std::string path = temp_path("bad.parquet");
  ParquetField f{"x", ParquetType::Int32, false, false};
  ParquetColumnData c;
  c.rows = 2;
  c.ints = {1, 1LL << 40};
  EXPECT_NE(error_of([&] { write_parquet(path, {f}, {c}); }).find("does not fit INT32"),
            std::string::npos);
  c.ints = {1, 2};
  c.valid = {1, 0};
  EXPECT_NE(error_of([&] { write_parquet(path, {f}, {c}); }).find("not nullable"),
            std::string::npos);
  EXPECT_FALSE(std::ifstream(path).good()) << "a failed write leaves no file";
}

// ---- RawChunk conversion

struct Sample {
  std::vector<ParquetField> fields;
  std::vector<ParquetColumnData> cols;
};

Sample sample(int64_t rows) {
  Sample s;
  s.fields = {{"label", ParquetType::Int32, false, false},
              {"i1", ParquetType::Int64, true, false},
              {"f1", ParquetType::Float, true, false},
              {"c_int", ParquetType::Int64, true, false},
              {"c_str", ParquetType::ByteArray, true, false},
              {"c_list", ParquetType::ByteArray, true, true},
              {"unused", ParquetType::Double, true, false}};
  s.cols.resize(s.fields.size());
  for (auto& c : s.cols) c.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    s.cols[0].ints.push_back(r % 3 == 0);
    s.cols[1].ints.push_back(r * 10);
    s.cols[1].valid.push_back(r % 4 != 1);
    s.cols[2].reals.push_back(0.5 * static_cast<double>(r));
    s.cols[2].valid.push_back(r % 5 != 2);
    s.cols[3].ints.push_back(r % 11);
    s.cols[3].valid.push_back(r % 6 != 3);
    s.cols[4].strings.push_back(r % 7 == 0 ? "" : "s" + std::to_string(r % 13));
    s.cols[4].valid.push_back(r % 8 != 5);
    auto& l = s.cols[5];
    if (l.offsets.empty()) l.offsets.push_back(0);
    l.row_valid.push_back(r % 9 != 4);
    if (r % 9 != 4)
      for (int k = 0; k < r % 3; ++k) {
        l.strings.push_back("t" + std::to_string((r + k) % 5));
        l.valid.push_back(k != 1 || r % 2);
      }
    l.offsets.push_back(static_cast<int64_t>(l.strings.size()));
    s.cols[6].reals.push_back(1.0);
  }
  return s;
}

Schema sample_schema() {
  json j = {{"format", "csv"},
            {"columns",
             {{{"name", "label"}, {"kind", "label"}},
              {{"name", "i1"}, {"kind", "dense"}},
              {{"name", "c_list"}, {"kind", "categorical"}, {"multi_hot", true}},
              {{"name", "f1"}, {"kind", "dense"}},
              {{"name", "c_int"}, {"kind", "categorical"}},
              {{"name", "c_str"}, {"kind", "categorical"}}}}};
  return Schema::from_json(j);
}

TEST(Parquet, ReaderYieldsRawChunksMatchedByName) {
  const int64_t rows = 777;
  Sample s = sample(rows);
  ParquetWriteOptions o;
  o.row_group_rows = 200;
  o.page_rows = 50;
  const std::string path = temp_path("chunks.parquet");
  write_parquet(path, s.fields, s.cols, o);

  ReadOptions ro;
  ro.chunk_rows = 64;
  ParquetReader reader({path, path}, sample_schema(), ro);  // the file twice
  RawChunk c, all;
  all.reset(2, 3);
  while (reader.next(c)) {
    EXPECT_LE(c.rows, 64);
    all.append(c);
  }
  ASSERT_EQ(all.rows, 2 * rows);
  EXPECT_EQ(reader.stats().rows, 2 * rows);
  EXPECT_GT(reader.stats().bytes, 0);
  for (int64_t rr = 0; rr < all.rows; ++rr) {
    const int64_t r = rr % rows;
    ASSERT_EQ(all.label[rr], r % 3 == 0 ? 1.f : 0.f);
    // dense: i1, f1 in schema order
    if (r % 4 != 1)
      ASSERT_EQ(all.dense[rr * 2], static_cast<float>(r * 10));
    else
      ASSERT_TRUE(std::isnan(all.dense[rr * 2]));
    if (r % 5 != 2)
      ASSERT_EQ(all.dense[rr * 2 + 1], 0.5f * static_cast<float>(r));
    else
      ASSERT_TRUE(std::isnan(all.dense[rr * 2 + 1]));
    // categorical: c_list (multi-hot, null elements dropped), c_int, c_str
    std::vector<uint64_t> want_list;
    if (r % 9 != 4)
      for (int k = 0; k < r % 3; ++k)
        if (k != 1 || r % 2) want_list.push_back(hash_category("t" + std::to_string((r + k) % 5)));
    std::vector<uint64_t> got_list(all.cat_values[0].begin() + all.cat_offsets[0][rr],
                                   all.cat_values[0].begin() + all.cat_offsets[0][rr + 1]);
    ASSERT_EQ(got_list, want_list) << "row " << rr;
    const int64_t n_int = all.cat_offsets[1][rr + 1] - all.cat_offsets[1][rr];
    if (r % 6 != 3) {
      ASSERT_EQ(n_int, 1);
      ASSERT_EQ(all.cat_values[1][all.cat_offsets[1][rr]], static_cast<uint64_t>(r % 11));
    } else {
      ASSERT_EQ(n_int, 0);
    }
    const int64_t n_str = all.cat_offsets[2][rr + 1] - all.cat_offsets[2][rr];
    const bool str_present = r % 8 != 5 && r % 7 != 0;  // empty strings are missing
    ASSERT_EQ(n_str, str_present ? 1 : 0) << "row " << rr;
    if (str_present) {
      ASSERT_EQ(all.cat_values[2][all.cat_offsets[2][rr]],
                hash_category("s" + std::to_string(r % 13)));
    }
  }
  std::remove(path.c_str());
}

TEST(Parquet, ReaderMaxRowsAndHexCategories) {
  ParquetField f{"c", ParquetType::ByteArray, true, false};
  ParquetField l{"label", ParquetType::Double, false, false};
  ParquetColumnData c, lab;
  c.rows = lab.rows = 3;
  c.strings = {"68fd1e64", "", "ff"};
  c.valid = {1, 1, 1};
  lab.reals = {0, 1, 0};
  const std::string path = temp_path("hex.parquet");
  write_parquet(path, {l, f}, {lab, c});
  Schema s = Schema::criteo(0, 0);
  s.columns.push_back({"c", ColumnKind::Categorical, false});
  ReadOptions ro;
  ro.max_rows = 2;
  ParquetReader reader({path}, s, ro);
  RawChunk chunk;
  ASSERT_TRUE(reader.next(chunk));
  ASSERT_EQ(chunk.rows, 2);
  EXPECT_EQ(chunk.label[1], 1.f);
  ASSERT_EQ(chunk.cat_values[0].size(), 1u);
  EXPECT_EQ(chunk.cat_values[0][0], 0x68fd1e64u);
  EXPECT_FALSE(reader.next(chunk));
  std::remove(path.c_str());
}

TEST(Parquet, ReaderErrorsNameFileAndColumn) {
  Sample s = sample(20);
  const std::string path = temp_path("errs.parquet");
  write_parquet(path, s.fields, s.cols);
  RawChunk c;
  Schema missing = sample_schema();
  missing.columns.push_back({"nope", ColumnKind::Dense, false});
  std::string e = error_of([&] { ParquetReader(std::vector<std::string>{path}, missing).next(c); });
  EXPECT_NE(e.find(path + ": the schema's dense column 'nope' is not in the file"),
            std::string::npos) << e;
  Schema one_hot_list = sample_schema();
  for (auto& col : one_hot_list.columns) col.multi_hot = false;
  e = error_of([&] { ParquetReader(std::vector<std::string>{path}, one_hot_list).next(c); });
  EXPECT_NE(e.find("column 'c_list': a LIST column; mark it \"multi_hot\""), std::string::npos)
      << e;
  Schema float_cat = sample_schema();
  float_cat.columns[3].kind = ColumnKind::Categorical;  // f1
  e = error_of([&] { ParquetReader(std::vector<std::string>{path}, float_cat).next(c); });
  EXPECT_NE(e.find("column 'f1': FLOAT cannot be a categorical column"), std::string::npos) << e;

  // A bad label: fail names the row; skip drops it.
  s.cols[0].ints[5] = 2;
  write_parquet(path, s.fields, s.cols);
  e = error_of([&] { ParquetReader(std::vector<std::string>{path}, sample_schema()).next(c); });
  EXPECT_NE(e.find(path + ": row group 0, column 'label': row 5: label must be 0 or 1"),
            std::string::npos) << e;
  ReadOptions skip;
  skip.on_error = OnError::Skip;
  ParquetReader r({path}, sample_schema(), skip);
  ASSERT_TRUE(r.next(c));
  EXPECT_EQ(c.rows, 19);
  EXPECT_EQ(r.stats().skipped_rows, 1);
  std::remove(path.c_str());
}

TEST(Parquet, OpenReaderPicksByExtension) {
  EXPECT_TRUE(is_parquet_path("a/b.PARQUET"));
  EXPECT_TRUE(is_parquet_path("x.parq"));
  EXPECT_FALSE(is_parquet_path("x.tsv"));
  std::string e = error_of([&] { open_reader({"a.parquet", "b.tsv"}, Schema::criteo(), {}); });
  EXPECT_NE(e.find("mix Parquet and text"), std::string::npos) << e;
  Sample s = sample(10);
  const std::string path = temp_path("open.parquet");
  write_parquet(path, s.fields, s.cols);
  auto r = open_reader({path}, sample_schema(), {});
  RawChunk c;
  ASSERT_TRUE(r->next(c));
  EXPECT_EQ(c.rows, 10);
  EXPECT_EQ(parquet_num_rows(path), 10);
  std::remove(path.c_str());
}

// ---- corrupt files

// A single INT64 column "x", PLAIN, uncompressed: its first page header starts at byte 4.
std::string plain_file(int64_t rows, int row_groups = 1) {
  ParquetField f{"x", ParquetType::Int64, false, false};
  ParquetColumnData c;
  c.rows = rows;
  for (int64_t i = 0; i < rows; ++i) c.ints.push_back(i);
  ParquetWriteOptions o;
  o.codec = ParquetCodec::Uncompressed;
  o.dictionary = false;
  o.row_group_rows = rows / row_groups;
  const std::string path = temp_path("plain.parquet");
  write_parquet(path, {f}, {c}, o);
  return path;
}

size_t skip_varint(const std::string& d, size_t p) {
  while (static_cast<unsigned char>(d[p]) & 0x80) ++p;
  return p + 1;
}

TEST(ParquetCorrupt, BadMagic) {
  const std::string path = plain_file(10);
  std::string d = slurp(path);
  d[0] = 'X';
  spit(path, d);
  std::string e = error_of([&] { ParquetFile f(path); });
  EXPECT_NE(e.find(path + ": bad magic"), std::string::npos) << e;
  spit(path, "hello");
  e = error_of([&] { ParquetFile f(path); });
  EXPECT_NE(e.find("bad magic"), std::string::npos) << e;
  std::remove(path.c_str());
}

TEST(ParquetCorrupt, TruncatedFooter) {
  const std::string path = plain_file(10);
  const std::string good = slurp(path);
  // The file cut short: no end marker.
  spit(path, good.substr(0, good.size() - 5));
  std::string e = error_of([&] { ParquetFile f(path); });
  EXPECT_NE(e.find("does not end with 'PAR1' (truncated"), std::string::npos) << e;
  // A footer length past the start of the file.
  std::string d = good;
  const uint32_t big = static_cast<uint32_t>(d.size());
  std::memcpy(&d[d.size() - 8], &big, 4);
  spit(path, d);
  e = error_of([&] { ParquetFile f(path); });
  EXPECT_NE(e.find(path + ": truncated footer"), std::string::npos) << e;
  // A footer whose Thrift data ends early (its tail bytes removed, the length adjusted).
  uint32_t len;
  std::memcpy(&len, &good[good.size() - 8], 4);
  d = good.substr(0, good.size() - 8 - 6);
  len -= 6;
  d.append(reinterpret_cast<const char*>(&len), 4);
  d += "PAR1";
  spit(path, d);
  e = error_of([&] { ParquetFile f(path); });
  EXPECT_NE(e.find("truncated or corrupt footer"), std::string::npos) << e;
  EXPECT_NE(e.find(path + ": footer"), std::string::npos) << e;
  std::remove(path.c_str());
}

// Offsets inside the first data page header (compact protocol): type, sizes, then the
// DataPageHeader struct with num_values and encoding.
struct PageHeaderBytes {
  size_t compressed_size, encoding;
};
PageHeaderBytes locate_header(const std::string& d, size_t at) {
  size_t p = at;
  EXPECT_EQ(d[p], 0x15);  // field 1 (type), i32
  p = skip_varint(d, p + 1);
  EXPECT_EQ(d[p], 0x15);  // field 2 (uncompressed size)
  p = skip_varint(d, p + 1);
  EXPECT_EQ(d[p], 0x15);  // field 3 (compressed size)
  PageHeaderBytes h;
  h.compressed_size = p + 1;
  p = skip_varint(d, p + 1);
  EXPECT_EQ(d[p], 0x2C);  // field 5, struct (DataPageHeader)
  EXPECT_EQ(d[p + 1], 0x15);  // num_values
  p = skip_varint(d, p + 2);
  EXPECT_EQ(d[p], 0x15);  // encoding
  h.encoding = p + 1;
  return h;
}

TEST(ParquetCorrupt, PageSizePastTheEndOfTheChunk) {
  const std::string path = plain_file(3000);  // a 24000-byte page: a 3-byte size varint
  std::string d = slurp(path);
  const PageHeaderBytes h = locate_header(d, 4);
  ASSERT_EQ(skip_varint(d, h.compressed_size) - h.compressed_size, 3u);
  d[h.compressed_size] = '\xFE';  // zigzag 2097150 -> 1048575 bytes, still 3 varint bytes
  d[h.compressed_size + 1] = '\xFF';
  d[h.compressed_size + 2] = '\x7F';
  spit(path, d);
  ParquetFile f(path);
  std::string e = error_of([&] { f.read_column(0, 0); });
  EXPECT_NE(e.find(path + ": row group 0, column 'x': page of 1048575 bytes"), std::string::npos)
      << e;
  EXPECT_NE(e.find("runs past the end of the column chunk"), std::string::npos) << e;
  std::remove(path.c_str());
}

TEST(ParquetCorrupt, UnsupportedEncoding) {
  const std::string path = plain_file(10);
  std::string d = slurp(path);
  const PageHeaderBytes h = locate_header(d, 4);
  ASSERT_EQ(d[h.encoding], 0);  // PLAIN
  d[h.encoding] = 8;            // zigzag(4): BIT_PACKED (deprecated, levels only)
  spit(path, d);
  ParquetFile f(path);
  std::string e = error_of([&] { f.read_column(0, 0); });
  EXPECT_NE(e.find(path + ": row group 0, column 'x': unsupported encoding BIT_PACKED"),
            std::string::npos)
      << e;
  RawChunk c;
  Schema s;
  s.columns = {{"x", ColumnKind::Dense, false}};
  e = error_of([&] { ParquetReader({path}, s).next(c); });
  EXPECT_NE(e.find("row group 0, column 'x': unsupported encoding BIT_PACKED"), std::string::npos)
      << e;
  std::remove(path.c_str());
}

TEST(ParquetCorrupt, RandomByteDamageIsAnErrorNeverACrash) {
  const auto fields = all_fields();
  std::mt19937_64 rng(11);
  std::vector<ParquetColumnData> cols;
  for (const auto& f : fields) cols.push_back(make_column(f, 200, rng));
  for (ParquetCodec codec : {ParquetCodec::Uncompressed, ParquetCodec::Snappy, ParquetCodec::Zstd}) {
    ParquetWriteOptions o;
    o.codec = codec;
    o.row_group_rows = 80;
    o.page_rows = 30;
    const std::string path = temp_path("fuzz.parquet");
    write_parquet(path, fields, cols, o);
    const std::string good = slurp(path);
    int errors = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::string d = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) d[rng() % d.size()] = static_cast<char>(rng());
      spit(path, d);
      try {
        ParquetFile file(path);
        for (int g = 0; g < file.num_row_groups(); ++g)
          for (size_t i = 0; i < file.fields().size(); ++i)
            file.read_column(g, static_cast<int>(i));
      } catch (const Error&) {
        ++errors;
      }
    }
    EXPECT_GT(errors, 0);
    std::remove(path.c_str());
  }
}

// ---- Thrift compact protocol

TEST(ParquetThriftCompact, SkipsUnknownFieldsOfEveryType) {
  using thrift::CType;
  thrift::CompactWriter w;
  w.field_i32(1, -5);
  w.field_bool(2, true);
  w.field_binary(3, "abc");
  w.field_struct_begin(40);  // a long id jump (id in a varint)
  w.field_i64(1, int64_t{1} << 40);
  w.field_list_begin(2, CType::Binary, 20);
  for (int i = 0; i < 20; ++i) w.elem_binary("x");
  w.end_struct();
  w.field_i16(41, -3);
  w.field_i64(42, -123456789012LL);
  w.end_struct();
  const std::string& b = w.bytes();
  thrift::CompactReader r(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "test");
  r.begin_struct();
  int16_t id;
  CType t;
  ASSERT_TRUE(r.next_field(id, t));
  EXPECT_EQ(id, 1);
  EXPECT_EQ(r.read_i32(), -5);
  ASSERT_TRUE(r.next_field(id, t));
  EXPECT_EQ(id, 2);
  EXPECT_TRUE(r.read_bool(t));
  ASSERT_TRUE(r.next_field(id, t));
  r.skip(t);
  ASSERT_TRUE(r.next_field(id, t));
  EXPECT_EQ(id, 40);
  r.skip(t);
  ASSERT_TRUE(r.next_field(id, t));
  EXPECT_EQ(id, 41);
  EXPECT_EQ(r.read_i16(), -3);
  ASSERT_TRUE(r.next_field(id, t));
  EXPECT_EQ(id, 42);
  EXPECT_EQ(r.read_i64(), -123456789012LL);
  EXPECT_FALSE(r.next_field(id, t));
  r.end_struct();
  EXPECT_EQ(r.position(), b.size());
  // Truncated input fails with the context instead of reading past the end.
  thrift::CompactReader cut(reinterpret_cast<const uint8_t*>(b.data()), b.size() - 4, "cut");
  std::string e = error_of([&] { cut.skip(CType::Struct); });
  EXPECT_NE(e.find("cut: corrupt Thrift metadata"), std::string::npos) << e;
}

}  // namespace
}  // namespace dlrec::io
