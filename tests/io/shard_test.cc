#include "dlrec/io/shard.h"

#include <gtest/gtest.h>

#include "test_errors.h"
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"

namespace dlrec::io {
namespace {

std::string temp_dir() {
  static std::string dir = [] {
    std::string d = std::string(::testing::TempDir()) + "shard_test_" + std::to_string(::getpid());
    make_dirs(d);
    return d;
  }();
  return dir;
}

// Layout: 3 dense, feature 0 one-hot (card 50), feature 1 multi-hot (card 1000), feature 2
// one-hot with 64-bit ids (card 2^40).
ShardLayout test_layout() {
  ShardLayout l;
  l.num_dense = 3;
  l.cardinalities = {50, 1000, int64_t{1} << 40};
  l.multi_hot = {false, true, false};
  return l;
}

// Deterministic rows; row r's content depends only on r so any sub-range can be checked.
Batch make_rows(int64_t first, int64_t n, const ShardLayout& l) {
  Batch b;
  b.reset(l.num_dense, static_cast<int>(l.cardinalities.size()));
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = first + i;
    b.labels.push_back(static_cast<float>(r % 2));
    for (int d = 0; d < l.num_dense; ++d) b.dense.push_back(r * 0.5f + d);
    for (size_t t = 0; t < l.cardinalities.size(); ++t) {
      int hot = l.multi_hot[t] ? static_cast<int>(r % 4) : 1;  // multi-hot: 0..3 ids
      for (int k = 0; k < hot; ++k)
        b.cat_indices[t].push_back((r * 7 + k * 13 + static_cast<int64_t>(t) * (int64_t{1} << 33)) %
                                   l.cardinalities[t]);
      b.cat_offsets[t].push_back(static_cast<int64_t>(b.cat_indices[t].size()));
    }
    ++b.rows;
  }
  return b;
}

void expect_same(const Batch& a, const Batch& b) {
  ASSERT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.num_dense, b.num_dense);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.dense, b.dense);
  ASSERT_EQ(a.num_cat(), b.num_cat());
  for (int t = 0; t < a.num_cat(); ++t) {
    EXPECT_EQ(a.cat_offsets[t], b.cat_offsets[t]) << "feature " << t;
    EXPECT_EQ(a.cat_indices[t], b.cat_indices[t]) << "feature " << t;
  }
}

std::string write_shard(const std::string& name, int64_t rows, int64_t block_rows,
                        int64_t write_chunk = 37) {
  std::string path = temp_dir() + "/" + name;
  ShardLayout l = test_layout();
  ShardWriter w(path, l, block_rows);
  for (int64_t r = 0; r < rows; r += write_chunk)
    w.write(make_rows(r, std::min(write_chunk, rows - r), l));
  EXPECT_EQ(w.rows(), rows);
  w.close();
  return path;
}

using dlrec::testing::error_of;
using dlrec::testing::expect_error;

// A little-endian field of a file's bytes at any offset (a cast would be a misaligned load).
template <class T>
T field_at(const std::string& bytes, uint64_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

TEST(ShardTest, RoundTripOneHotAndMultiHot) {
  std::string path = write_shard("rt.shard", 1000, 128);
  ShardReader r(path);
  EXPECT_EQ(r.rows(), 1000);
  EXPECT_EQ(r.layout(), test_layout());
  Batch b;
  r.read(0, 1000, b);
  expect_same(b, make_rows(0, 1000, test_layout()));
}

TEST(ShardTest, LargeWriteBypassesPendingBuffer) {
  std::string path = write_shard("big.shard", 1000, 64, 500);
  ShardReader r(path);
  Batch b;
  r.read(0, 1000, b);
  expect_same(b, make_rows(0, 1000, test_layout()));
}

TEST(ShardTest, ReadAtArbitraryPositionsAcrossBlocks) {
  std::string path = write_shard("pos.shard", 777, 100);
  ShardReader r(path);
  std::mt19937 rng(3);
  Batch b;
  for (int k = 0; k < 200; ++k) {
    int64_t begin = rng() % 778;
    int64_t count = rng() % (778 - begin);
    r.read(begin, count, b);
    expect_same(b, make_rows(begin, count, test_layout()));
  }
  r.read(99, 2, b);  // straddles a block boundary
  expect_same(b, make_rows(99, 2, test_layout()));
  EXPECT_NE(error_of([&] { r.read(700, 100, b); }).find("outside"), std::string::npos);
}

TEST(ShardTest, EmptyShard) {
  std::string path = write_shard("empty.shard", 0, 100);
  ShardReader r(path);
  EXPECT_EQ(r.rows(), 0);
  Batch b;
  r.read(0, 0, b);
  EXPECT_EQ(b.rows, 0);
}

TEST(ShardTest, Int32IdsAreSmallerThanInt64) {
  ShardLayout narrow;
  narrow.num_dense = 0;
  narrow.cardinalities = {int64_t{1} << 31};
  narrow.multi_hot = {false};
  ShardLayout wide = narrow;
  wide.cardinalities = {(int64_t{1} << 31) + 1};
  auto size_of = [&](const ShardLayout& l, const std::string& name) {
    std::string path = temp_dir() + "/" + name;
    ShardWriter w(path, l);
    Batch b;
    b.reset(0, 1);
    for (int i = 0; i < 1000; ++i) {
      b.labels.push_back(0);
      b.cat_indices[0].push_back((int64_t{1} << 31) - 1 - i);
      b.cat_offsets[0].push_back(i + 1);
    }
    b.rows = 1000;
    w.write(b);
    w.close();
    Batch back;
    ShardReader(path).read(0, 1000, back);
    EXPECT_EQ(back.cat_indices[0], b.cat_indices[0]);
    return file_size(path);
  };
  EXPECT_EQ(size_of(wide, "wide.shard") - size_of(narrow, "narrow.shard"), 4000u);
}

// Format version 2: each feature's ids take the narrowest of u8/u16/i32/i64 that holds ids up
// to its cardinality (docs/FORMATS.md), by write(), write_parts() and write_at() alike, and
// read back unchanged (the largest id too).
TEST(ShardTest, IdWidthFollowsTheCardinality) {
  const int64_t cards[] = {1, 256, 257, 65536, 65537, int64_t{1} << 31, (int64_t{1} << 31) + 1};
  const size_t widths[] = {1, 1, 2, 2, 4, 4, 8};
  const int n = 1000;
  uint64_t size1 = 0;
  for (int i = 0; i < 7; ++i) {
    SCOPED_TRACE(cards[i]);
    ShardLayout l;
    l.num_dense = 1;
    l.cardinalities = {cards[i]};
    l.multi_hot = {false};
    Batch b;
    b.reset(1, 1);
    for (int r = 0; r < n; ++r) {
      b.labels.push_back(r % 2);
      b.dense.push_back(r);
      b.cat_indices[0].push_back(r % 3 == 0 ? cards[i] - 1 : (r * 7919) % cards[i]);
      b.cat_offsets[0].push_back(r + 1);
    }
    b.rows = n;
    const std::string path = temp_dir() + "/width" + std::to_string(i) + ".shard";
    {
      ShardWriter w(path, l, 300);
      w.write(b);
      w.close();
    }
    Batch back;
    ShardReader(path).read(0, n, back);
    EXPECT_EQ(back.cat_indices[0], b.cat_indices[0]);
    const std::string bytes = read_file(path);  // less the header JSON (its digits differ)
    const uint64_t size = bytes.size() - field_at<uint32_t>(bytes, 12);
    if (i == 0) size1 = size;
    EXPECT_EQ(size - size1, n * (widths[i] - 1));
    // The same bytes written row by row at reserved places from two threads.
    const std::string path2 = temp_dir() + "/width_at" + std::to_string(i) + ".shard";
    {
      ShardWriter w(path2, l, 300);
      w.reserve(n);
      std::thread t([&] { w.write_at(b, 500, n, 500); });
      w.write_at(b, 0, 500, 0);
      t.join();
      w.close();
    }
    EXPECT_EQ(read_file(path2), read_file(path));
  }
}

// Files of format version 1 (i32 ids up to 2^31, written by earlier builds) are still read:
// one built byte by byte from docs/FORMATS.md (a one-hot feature of cardinality 10 and a
// multi-hot one of 70000, both i32 there).
TEST(ShardTest, ReadsVersion1Files) {
  auto put32 = [](std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); };
  auto put64 = [](std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); };
  auto putf = [](std::string& s, float v) { s.append(reinterpret_cast<const char*>(&v), 4); };
  std::string f = "DLRSHARD";
  const std::string js = "{\"format\":\"dlrec-shard\",\"block_rows\":4,\"layout\":{\"num_dense\":1,"
                         "\"cardinalities\":[10,70000],\"multi_hot\":[false,true]}}";
  put32(f, 1);
  put32(f, static_cast<uint32_t>(js.size()));
  f += js;
  put32(f, crc32c(f.data() + 8, 8 + js.size()));
  const uint64_t block_at = f.size();
  // 3 rows: labels, dense, feature 0 ids, feature 1 row ends then ids.
  std::string payload;
  for (float v : {1.f, 0.f, 1.f}) putf(payload, v);
  for (float v : {0.5f, -2.f, 7.f}) putf(payload, v);
  for (uint32_t v : {9u, 0u, 3u}) put32(payload, v);
  for (uint32_t v : {2u, 2u, 3u}) put32(payload, v);         // row ends: 2, 0, 1 ids
  for (uint32_t v : {69999u, 5u, 70u}) put32(payload, v);
  std::string block;
  put64(block, 3);
  put64(block, payload.size());
  uint32_t crc = crc32c(block.data(), 16);
  crc = crc32c(payload.data(), payload.size(), crc);
  put32(block, crc);
  put32(block, 0);
  f += block + payload;
  const uint64_t footer_at = f.size();
  std::string footer;
  put64(footer, 1);
  put64(footer, 3);
  put64(footer, 0);
  put64(footer, block_at);
  f += footer;
  put64(f, footer_at);
  put32(f, crc32c(footer.data(), footer.size()));
  put32(f, 0);
  f.append("DLRSEND\0", 8);
  const std::string path = temp_dir() + "/v1.shard";
  write_file_atomic(path, f);
  ShardReader r(path);
  ASSERT_EQ(r.rows(), 3);
  Batch b;
  r.read(0, 3, b);
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(b.dense, (std::vector<float>{0.5f, -2, 7}));
  EXPECT_EQ(b.cat_indices[0], (std::vector<int64_t>{9, 0, 3}));
  EXPECT_EQ(b.cat_offsets[1], (std::vector<int64_t>{0, 2, 2, 3}));
  EXPECT_EQ(b.cat_indices[1], (std::vector<int64_t>{69999, 5, 70}));
}

// A narrow (u8) id past its feature's cardinality, under a correct checksum: the read names the
// block and feature.
TEST(ShardTest, NarrowIdOutOfRangeIsAnError) {
  ShardLayout l;
  l.num_dense = 0;
  l.cardinalities = {5};
  l.multi_hot = {false};
  Batch b;
  b.reset(0, 1);
  for (int r = 0; r < 10; ++r) {
    b.labels.push_back(0);
    b.cat_indices[0].push_back(r % 5);
    b.cat_offsets[0].push_back(r + 1);
  }
  b.rows = 10;
  const std::string path = temp_dir() + "/u8.shard";
  {
    ShardWriter w(path, l);
    w.write(b);
    w.close();
  }
  std::string data = read_file(path);
  const uint64_t block_at = 16 + field_at<uint32_t>(data, 12) + 4;
  const uint64_t payload = field_at<uint64_t>(data, block_at + 8);
  ASSERT_EQ(payload, 10u * 4 + 10u);  // labels, then one byte per id
  data[block_at + 24 + 40 + 6] = 9;   // row 6's id
  uint32_t crc = crc32c(data.data() + block_at, 16);
  crc = crc32c(data.data() + block_at + 24, payload, crc);
  std::memcpy(&data[block_at + 16], &crc, 4);
  const std::string bad = temp_dir() + "/u8bad.shard";
  write_file_atomic(bad, data);
  ShardReader r(bad);
  Batch out;
  const std::string msg = error_of([&] { r.read(0, 10, out); });
  EXPECT_NE(msg.find("shard 'u8bad.shard' block 0: id out of range in feature 0"),
            std::string::npos) << msg;
}

TEST(ShardTest, NoFileBeforeCloseAndNoneWithoutClose) {
  std::string path = temp_dir() + "/unclosed.shard";
  {
    ShardWriter w(path, test_layout());
    w.write(make_rows(0, 10, test_layout()));
    EXPECT_FALSE(file_exists(path));
  }
  EXPECT_FALSE(file_exists(path));
}

TEST(ShardTest, FlippedByteGivesChecksumErrorNamingBlock) {
  std::string path = write_shard("flip.shard", 1000, 100);
  // Find block 3's offset by reading the footer: simpler, flip a byte in the middle of the
  // file's block area and check that the message names a block and the stored/computed CRCs.
  std::string data = read_file(path);
  ShardReader clean(path);
  // Block b starts after the header; blocks have equal row counts here but varying size
  // (multi-hot). Flip a byte in each block's payload in turn and check the named block.
  uint64_t header_end = 16 + field_at<uint32_t>(data, 12) + 4;
  uint64_t pos = header_end;
  for (int b = 0; b < 10; ++b) {
    uint64_t payload = field_at<uint64_t>(data, pos + 8);
    if (b == 3) {
      std::string bad = data;
      bad[pos + 24 + payload / 2] ^= 0x10;
      std::string bad_path = temp_dir() + "/flipped.shard";
      write_file_atomic(bad_path, bad);
      ShardReader r(bad_path);  // header and footer are intact
      Batch out;
      r.read(0, 300, out);      // blocks 0..2 read fine
      std::string msg = error_of([&] { r.read(250, 100, out); });
      EXPECT_NE(msg.find("shard 'flipped.shard' block 3: checksum mismatch (stored 0x"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("computed 0x"), std::string::npos) << msg;
    }
    pos += 24 + payload;
  }
}

TEST(ShardTest, CorruptHeaderOrFooterDetectedAtOpen) {
  std::string path = write_shard("hf.shard", 300, 100);
  std::string data = read_file(path);
  std::string bad = data;
  bad[20] ^= 1;  // inside the header JSON
  write_file_atomic(temp_dir() + "/badhdr.shard", bad);
  EXPECT_NE(error_of([&] { ShardReader r(temp_dir() + "/badhdr.shard"); }).find("checksum"),
            std::string::npos);
  bad = data;
  bad[data.size() - 30] ^= 1;  // inside the footer's block index
  write_file_atomic(temp_dir() + "/badftr.shard", bad);
  std::string msg = error_of([&] { ShardReader r(temp_dir() + "/badftr.shard"); });
  EXPECT_NE(msg.find("footer: checksum mismatch"), std::string::npos) << msg;
}

TEST(ShardTest, TruncatedFileDetectedAtOpen) {
  std::string path = write_shard("trunc.shard", 300, 100);
  std::string data = read_file(path);
  for (size_t keep : {data.size() - 1, data.size() / 2, size_t{20}, size_t{5}, size_t{0}}) {
    std::string p = temp_dir() + "/truncated.shard";
    write_file_atomic(p, data.substr(0, keep));
    std::string msg = error_of([&] { ShardReader r(p); });
    EXPECT_NE(msg.find("truncated"), std::string::npos) << keep << ": " << msg;
    EXPECT_NE(msg.find("truncated.shard"), std::string::npos) << msg;
  }
}

TEST(ShardTest, BadMagicAndWrongVersion) {
  std::string path = write_shard("magic.shard", 10, 100);
  std::string data = read_file(path);
  std::string bad = data;
  bad[0] = 'X';
  write_file_atomic(temp_dir() + "/bad_magic.shard", bad);
  std::string msg = error_of([&] { ShardReader r(temp_dir() + "/bad_magic.shard"); });
  EXPECT_NE(msg.find("'bad_magic.shard': bad magic"), std::string::npos) << msg;

  bad = data;
  bad[8] = 7;  // version 7
  write_file_atomic(temp_dir() + "/v7.shard", bad);
  msg = error_of([&] { ShardReader r(temp_dir() + "/v7.shard"); });
  EXPECT_NE(msg.find("unsupported format version 7"), std::string::npos) << msg;

  write_file_atomic(temp_dir() + "/text.shard", "label\tI1\n1\t2\n");
  msg = error_of([&] { ShardReader r(temp_dir() + "/text.shard"); });
  EXPECT_NE(msg.find("bad magic"), std::string::npos) << msg;
}

TEST(ShardTest, WriteValidatesIds) {
  ShardLayout l = test_layout();
  std::string path = temp_dir() + "/invalid.shard";
  {
    ShardWriter w(path, l);
    w.write(make_rows(0, 5, l));
    Batch b = make_rows(5, 3, l);
    b.cat_indices[0][1] = 50;  // row 6 of the shard, cardinality 50
    std::string msg = error_of([&] { w.write(b); });
    EXPECT_NE(msg.find("'invalid.shard': categorical feature 0 row 6: id 50 is out of range "
                       "[0, 50)"),
              std::string::npos)
        << msg;
    b = make_rows(5, 3, l);
    b.cat_indices[1].assign(b.cat_indices[1].size(), -1);
    if (!b.cat_indices[1].empty()) {
      msg = error_of([&] { w.write(b); });
      EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
    }
    // One-hot feature with two ids in a row.
    b = make_rows(5, 3, l);
    b.cat_indices[0].insert(b.cat_indices[0].begin(), 1);
    for (size_t r = 1; r < b.cat_offsets[0].size(); ++r) b.cat_offsets[0][r] += 1;
    msg = error_of([&] { w.write(b); });
    EXPECT_NE(msg.find("one-hot categorical feature 0 row 5 has 2 ids"), std::string::npos)
        << msg;
  }
  EXPECT_FALSE(file_exists(path));
}

TEST(ShardTest, LayoutJsonRoundTrip) {
  ShardLayout l = test_layout();
  EXPECT_EQ(ShardLayout::from_json(l.to_json()), l);
  json j = l.to_json();
  j["cardinalites"] = j["cardinalities"];
  std::string msg = error_of([&] { ShardLayout::from_json(j); });
  EXPECT_NE(msg.find("did you mean 'cardinalities'"), std::string::npos) << msg;
}

TEST(ShardTest, DatasetInfoSaveLoad) {
  DatasetInfo d;
  d.layout = test_layout();
  d.train_shards = {"train_00000.shard", "train_00001.shard"};
  d.valid_shards = {"valid_00000.shard"};
  d.train_rows = 10;
  d.valid_rows = 3;
  d.dense_names = {"a", "b", "c"};
  d.cat_names = {"x", "y", "z"};
  std::string dir = temp_dir() + "/ds";
  make_dirs(dir);
  d.save(dir);
  DatasetInfo e = DatasetInfo::load(dir);
  EXPECT_EQ(e.layout, d.layout);
  EXPECT_EQ(e.train_shards, d.train_shards);
  EXPECT_EQ(e.valid_shards, d.valid_shards);
  EXPECT_EQ(e.train_rows, 10);
  EXPECT_EQ(e.valid_rows, 3);
  EXPECT_EQ(e.cat_names, d.cat_names);
}

std::vector<std::string> three_shards() {
  return {write_shard("l0.shard", 250, 64), write_shard("l1.shard", 0, 64),
          write_shard("l2.shard", 133, 50)};
}

// Row r of the concatenation of three_shards().
Batch loader_rows(int64_t first, int64_t n) {
  Batch out;
  out.reset(test_layout().num_dense, 3);
  for (int64_t r = first; r < first + n; ++r)
    out.append(r < 250 ? make_rows(r, 1, test_layout()) : make_rows(r - 250, 1, test_layout()));
  return out;
}

TEST(ShardLoaderTest, BatchesAcrossShards) {
  ShardLoader loader(three_shards(), 100);
  EXPECT_EQ(loader.total_rows(), 383);
  EXPECT_EQ(loader.layout(), test_layout());
  Batch b;
  std::vector<int64_t> sizes;
  int64_t pos = 0;
  while (loader.next(b)) {
    sizes.push_back(b.rows);
    expect_same(b, loader_rows(pos, b.rows));
    pos += b.rows;
    EXPECT_EQ(loader.position(), pos);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{100, 100, 100, 83}));
  EXPECT_FALSE(loader.next(b));
}

TEST(ShardLoaderTest, StartRowResumesMidEpoch) {
  for (int64_t start : {0, 1, 249, 250, 251, 300, 382, 383}) {
    ShardLoader loader(three_shards(), 64, start);
    EXPECT_EQ(loader.position(), start);
    Batch b;
    int64_t pos = start;
    while (loader.next(b)) {
      EXPECT_EQ(b.rows, std::min<int64_t>(64, 383 - pos));
      expect_same(b, loader_rows(pos, b.rows));
      pos += b.rows;
    }
    EXPECT_EQ(pos, 383);
  }
  EXPECT_THROW(ShardLoader(three_shards(), 64, 384), Error);
}

TEST(ShardLoaderTest, DestroyWithoutDraining) {
  for (int i = 0; i < 20; ++i) {
    ShardLoader loader(three_shards(), 7);
    Batch b;
    ASSERT_TRUE(loader.next(b));
  }
}

TEST(ShardLoaderTest, ErrorInPrefetchThreadIsRethrownInNext) {
  std::string good = write_shard("lg.shard", 200, 50);
  std::string data = read_file(good);
  uint64_t header_end = 16 + field_at<uint32_t>(data, 12) + 4;
  uint64_t payload0 = field_at<uint64_t>(data, header_end + 8);
  data[header_end + 24 + payload0 + 24 + 3] ^= 0x44;  // block 1's payload
  std::string bad = temp_dir() + "/lbad.shard";
  write_file_atomic(bad, data);
  ShardLoader loader({good, bad}, 50);
  Batch b;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(loader.next(b));  // the 5th: bad block 0, fine
  std::string msg = error_of([&] { loader.next(b); });
  EXPECT_NE(msg.find("shard 'lbad.shard' block 1: checksum mismatch"), std::string::npos) << msg;
}

TEST(ShardLoaderTest, MismatchedLayoutsRejected) {
  std::string a = write_shard("ma.shard", 10, 10);
  ShardLayout other = test_layout();
  other.cardinalities[0] = 51;
  std::string b = temp_dir() + "/mb.shard";
  ShardWriter w(b, other);
  w.close();
  std::string msg = error_of([&] { ShardLoader l({a, b}, 4); });
  EXPECT_NE(msg.find("different layout"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dlrec::io

namespace dlrec::io {
namespace {

// write_parts gives the bytes of write() called on each part in turn, for parts that start
// and end anywhere relative to the blocks, with rows pending from an earlier write().
TEST(ShardWriteParts, SameBytesAsWriteOfEachPart) {
  const ShardLayout l = test_layout();
  const Batch a = make_rows(0, 700, l), b = make_rows(700, 50, l), c = make_rows(750, 900, l);
  const std::vector<std::vector<BatchRows>> calls = {
      {{&a, 0, 10}},                                          // pending only
      {{&a, 10, 300}, {&a, 300, 300}, {&a, 300, 700}, {&b, 0, 50}},  // blocks across parts
      {{&c, 0, 64}},                                           // exactly one block
      {{&c, 64, 899}},
      {{&c, 899, 900}}};
  const std::string p1 = temp_dir() + "/parts_ref.shard", p2 = temp_dir() + "/parts.shard";
  ShardWriter ref(p1, l, 64), w(p2, l, 64);
  for (const auto& parts : calls) {
    for (const auto& p : parts) {
      Batch one;
      one.reset(l.num_dense, static_cast<int>(l.cardinalities.size()));
      one.append_rows(*p.batch, p.begin, p.end);
      ref.write(one);
    }
    w.write_parts(parts);
    EXPECT_EQ(w.rows(), ref.rows());
  }
  ref.close();
  w.close();
  std::ifstream f1(p1, std::ios::binary), f2(p2, std::ios::binary);
  const std::string s1((std::istreambuf_iterator<char>(f1)), {}), s2((std::istreambuf_iterator<char>(f2)), {});
  EXPECT_EQ(s1, s2);
  ShardReader r(p2);
  Batch all;
  r.read(0, r.rows(), all);
  expect_same(all, make_rows(0, 1650, l));
}

// A bad id in the second part: the error names the shard row, nothing of the call is written
// (the first part neither), and the writer still takes good rows afterwards.
TEST(ShardWriteParts, BadIdInALaterPartWritesNothing) {
  const ShardLayout l = test_layout();
  const std::string path = temp_dir() + "/parts_bad.shard";
  ShardWriter w(path, l, 16);
  const Batch good = make_rows(0, 40, l);
  w.write_parts({{&good, 0, 20}});
  Batch bad = make_rows(20, 40, l);
  bad.cat_indices[0][33] = 50;  // part 2 starts at row 30 of `bad`: shard row 20 + 10 + 3
  const std::string msg = error_of([&] { w.write_parts({{&good, 20, 30}, {&bad, 30, 40}}); });
  EXPECT_NE(msg.find("'parts_bad.shard': categorical feature 0 row 33: id 50 is out of range"),
            std::string::npos)
      << msg;
  EXPECT_EQ(w.rows(), 20);
  w.write_parts({{&good, 20, 40}});
  w.close();
  ShardReader r(path);
  Batch all;
  r.read(0, r.rows(), all);
  expect_same(all, make_rows(0, 40, l));
}

}  // namespace
}  // namespace dlrec::io

namespace dlrec::io {
namespace {

// A write that fails part-way through write_parts' blocks (here: the file size limit of the
// process, RLIMIT_FSIZE, reached by the blocks' writer thread) throws naming the temporary
// file and the cause (at the call or at close, whichever waits for the failed write); the
// writer destroyed afterwards leaves neither the shard nor its temporary file behind.
TEST(ShardWriteParts, FailingWriteNamesTheFileAndLeavesNothing) {
  const ShardLayout l = test_layout();
  const Batch rows = make_rows(0, 300000, l);  // ~11 MB of blocks
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < (rlim_t{64} << 20))
    GTEST_SKIP() << "the file size limit is already small";
  auto old_sig = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  const std::string path = temp_dir() + "/fsize.shard";
  std::string msg;
  {
    ShardWriter w(path, l, 4096);
    struct rlimit lim = old;
    lim.rlim_cur = rlim_t{4} << 20;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
    msg = error_of([&] {
      w.write_parts({{&rows, 0, rows.rows}});
      w.close();
    });
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
    EXPECT_NE(msg.find(path + ".tmp."), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
    EXPECT_TRUE(file_exists(path + ".tmp." + std::to_string(::getpid())));
  }
  EXPECT_FALSE(file_exists(path));
  EXPECT_FALSE(file_exists(path + ".tmp." + std::to_string(::getpid())));
  std::signal(SIGXFSZ, old_sig);
}

}  // namespace
}  // namespace dlrec::io

namespace dlrec::io {
namespace {

// One-hot only (reserve/write_at): 2 dense, a narrow and a wide (64-bit) feature.
ShardLayout one_hot_layout() {
  ShardLayout l;
  l.num_dense = 2;
  l.cardinalities = {50, int64_t{1} << 40};
  l.multi_hot = {false, false};
  return l;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// Rows reserved in uneven pieces and written from several threads in a shuffled order give
// the bytes of write() of the same rows: full blocks, blocks completed by several pieces, a
// piece spanning blocks and the last, partial block (packed at close).
TEST(ShardWriteAt, SameBytesAsWriteFromManyThreadsInAnyOrder) {
  const ShardLayout l = one_hot_layout();
  for (const int64_t total : {int64_t{0}, int64_t{5}, int64_t{64}, int64_t{1000}}) {
    SCOPED_TRACE("rows " + std::to_string(total));
    const Batch rows = make_rows(0, total, l);
    const std::string p1 = temp_dir() + "/at_ref.shard", p2 = temp_dir() + "/at.shard";
    {
      ShardWriter ref(p1, l, 64);
      ref.write(rows);
      ref.close();
    }
    ShardWriter w(p2, l, 64);
    ASSERT_TRUE(w.direct_ok());
    struct Piece {
      int64_t begin, end, at;
    };
    std::vector<Piece> pieces;
    std::mt19937 rng(static_cast<uint32_t>(total));
    for (int64_t r = 0; r < total;) {
      const int64_t n = std::min<int64_t>(total - r, 1 + rng() % 150);
      const int64_t at = w.reserve(n);
      EXPECT_EQ(at, r);
      pieces.push_back({r, r + n, at});
      r += n;
    }
    EXPECT_EQ(w.rows(), total);
    std::shuffle(pieces.begin(), pieces.end(), rng);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (size_t i = t; i < pieces.size(); i += 4)
          w.write_at(rows, pieces[i].begin, pieces[i].end, pieces[i].at);
      });
    for (auto& th : threads) th.join();
    w.close();
    EXPECT_EQ(file_bytes(p1), file_bytes(p2));
    ShardReader r(p2);
    Batch all;
    r.read(0, r.rows(), all);
    expect_same(all, rows);
  }
}

// Bad input and misuse: an out-of-range id names the row and writes nothing of the piece (the
// file then cannot be closed: its rows are missing); multi-hot layouts, write() after
// reserve(), rows not reserved or written twice, and close() with rows missing are errors.
TEST(ShardWriteAt, ErrorsNameTheRowAndMisuseIsRefused) {
  const ShardLayout l = one_hot_layout();
  const std::string path = temp_dir() + "/at_bad.shard";
  {
    ShardWriter w(path, l, 16);
    Batch bad = make_rows(0, 40, l);
    bad.cat_indices[0][27] = 50;
    w.reserve(40);
    w.write_at(bad, 0, 20, 0);
    expect_error([&] { w.write_at(bad, 20, 40, 20); },
                 {"'at_bad.shard': categorical feature 0 row 27: id 50 is out of range [0, 50)"});
    expect_error([&] { w.write(bad); }, {"'at_bad.shard': write after reserve/write_at"});
    expect_error([&] { w.write_at(bad, 0, 10, 35); }, {"write_at of rows [0, 10)", "at row 35 of 40"});
    expect_error([&] { w.write_at(bad, 0, 10, 0); }, {"row 0 was not reserved or is already written"});
    expect_error([&] { w.close(); }, {"closed with 20 reserved rows not written"});
  }
  EXPECT_FALSE(file_exists(path));
  EXPECT_FALSE(file_exists(path + ".tmp." + std::to_string(::getpid())));
  ShardWriter mh(temp_dir() + "/at_mh.shard", test_layout(), 16);
  EXPECT_FALSE(mh.direct_ok());
  expect_error([&] { mh.reserve(1); }, {"reserve/write_at need one-hot features only"});
  ShardWriter after(temp_dir() + "/at_after.shard", l, 16);
  after.write(make_rows(0, 3, l));
  expect_error([&] { after.reserve(1); }, {"reserve/write_at after write()/write_parts()"});
}

}  // namespace
}  // namespace dlrec::io
