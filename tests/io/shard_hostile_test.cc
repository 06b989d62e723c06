// The shard reader against crafted files: checksum-valid headers and footers whose sizes,
// counts and offsets do not fit the file are refused at open with an error naming the file and
// the place, before anything is allocated from them (a footer's block count or row total once
// made the reader or the evaluation allocate 0x3fffffffc or 0x4000000000000004 bytes).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::io {
namespace {

using dlrec::testing::error_of;
using dlrec::testing::expect_error;
using dlrec::testing::read_all;
using dlrec::testing::TempDir;
using dlrec::testing::write_file;

// 1 dense, feature 0 one-hot (card 50), feature 1 multi-hot (card 1000).
ShardLayout layout() {
  ShardLayout l;
  l.num_dense = 1;
  l.cardinalities = {50, 1000};
  l.multi_hot = {false, true};
  return l;
}

std::string write_shard(const std::string& path, int64_t rows, int64_t block_rows) {
  Batch b;
  b.reset(1, 2);
  for (int64_t r = 0; r < rows; ++r) {
    b.labels.push_back(r % 2);
    b.dense.push_back(0.5f * r);
    b.cat_indices[0].push_back(r % 50);
    b.cat_offsets[0].push_back(r + 1);
    for (int k = 0; k < r % 3; ++k) b.cat_indices[1].push_back((r * 7 + k) % 1000);
    b.cat_offsets[1].push_back(static_cast<int64_t>(b.cat_indices[1].size()));
    ++b.rows;
  }
  ShardWriter w(path, layout(), block_rows);
  w.write(b);
  w.close();
  return path;
}

template <class T>
T get(const std::string& s, uint64_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}
template <class T>
void set(std::string& s, uint64_t at, T v) {
  std::memcpy(&s[at], &v, sizeof(T));
}

// The footer as u64 words (num_blocks, total_rows, then first_row/offset pairs), edited by
// `edit` and written back with a correct checksum (the trailer's offset is kept).
std::string with_footer(std::string f, const std::function<void(std::vector<uint64_t>&)>& edit) {
  const uint64_t trailer = f.size() - 24;
  const uint64_t footer_at = get<uint64_t>(f, trailer);
  std::vector<uint64_t> w((trailer - footer_at) / 8);
  std::memcpy(w.data(), f.data() + footer_at, w.size() * 8);
  edit(w);
  std::string foot(reinterpret_cast<const char*>(w.data()), w.size() * 8);
  std::string tail = f.substr(trailer);
  set<uint64_t>(tail, 0, footer_at);
  set<uint32_t>(tail, 8, crc32c(foot.data(), foot.size()));
  return f.substr(0, footer_at) + foot + tail;
}

struct Fixture {
  TempDir dir{"shard_hostile"};
  std::string good;
  Fixture() { good = read_all(write_shard(dir.path + "/good.shard", 100, 40)); }  // 3 blocks
  std::string put(const std::string& bytes) { return write_file(dir.path, "bad.shard", bytes); }
};

TEST(ShardHostile, FooterBlockCountThatWrapsIsRefusedAtOpen) {
  Fixture fx;
  // 2^60 + 3 blocks: 16 * count wraps to the 48 bytes the three entries take.
  const std::string path = fx.put(with_footer(fx.good, [](auto& w) { w[0] += uint64_t{1} << 60; }));
  expect_error([&] { ShardReader r(path); }, {"bad.shard' footer", "1152921504606846979 blocks"});
}

TEST(ShardHostile, RowTotalBeyondTheBytesIsRefusedAtOpen) {
  Fixture fx;
  for (uint64_t total : {uint64_t{0xffffffff}, (uint64_t{1} << 60) + 1}) {
    const std::string path = fx.put(with_footer(fx.good, [&](auto& w) { w[1] = total; }));
    expect_error([&] { ShardReader r(path); }, {"bad.shard' footer", "block 2", "inconsistent"});
    expect_error([&] { ShardLoader l({path}, 16); }, {"bad.shard", "block 2"});
  }
  // A block index entry claiming more rows than its bytes hold.
  const std::string path =
      fx.put(with_footer(fx.good, [](auto& w) { w[4] = 39, w[6] = 1u << 30; }));
  expect_error([&] { ShardReader r(path); }, {"bad.shard' footer", "block 1"});
}

TEST(ShardHostile, BlockOffsetsOutsideTheBlocksAreRefusedAtOpen) {
  Fixture fx;
  // The last block's offset past the footer: its length would wrap to ~2^64.
  std::string path = fx.put(with_footer(fx.good, [](auto& w) { w[7] = w[7] + (1u << 20); }));
  expect_error([&] { ShardReader r(path); }, {"bad.shard' footer", "block 2", "bytes ["});
  // Offsets that do not increase.
  path = fx.put(with_footer(fx.good, [](auto& w) { w[7] = w[5]; }));
  expect_error([&] { ShardReader r(path); }, {"block 1", "inconsistent index entry"});
  // A footer offset before the blocks, and one that leaves a footer bigger than the blocks could
  // ever need (checked before the footer is read into memory).
  std::string f = fx.good;
  set<uint64_t>(f, f.size() - 24, 5);
  expect_error([&] { ShardReader r(fx.put(f)); }, {"footer: bad offset 5"});
  const uint64_t header_end = 16 + get<uint32_t>(fx.good, 12) + 4;
  f = fx.good;
  set<uint64_t>(f, f.size() - 24, header_end + 24);
  expect_error([&] { ShardReader r(fx.put(f)); }, {"footer at offset", "cannot index"});
}

TEST(ShardHostile, HeaderLengthBeyondTheFileIsRefused) {
  Fixture fx;
  std::string f = fx.good;
  set<uint32_t>(f, 12, 0xfffffff0u);
  expect_error([&] { ShardReader r(fx.put(f)); }, {"header length 4294967280", "offset 12"});
}

TEST(ShardHostile, DeeplyNestedHeaderJsonIsAClearError) {
  Fixture fx;
  const std::string js = std::string(50000, '[') + std::string(50000, ']');
  std::string f = "DLRSHARD";
  f.append("\x02\0\0\0", 4);
  const uint32_t len = static_cast<uint32_t>(js.size());
  f.append(reinterpret_cast<const char*>(&len), 4);
  f += js;
  const uint32_t crc = crc32c(f.data() + 8, 8 + js.size());
  f.append(reinterpret_cast<const char*>(&crc), 4);
  f += std::string(64, '\0');
  expect_error([&] { ShardReader r(fx.put(f)); },
               {"bad.shard' header (JSON at offset 16)", "nesting deeper than 64"});
}

TEST(ShardHostile, DecreasingMultiHotRowEndsAreRefused) {
  Fixture fx;
  std::string f = fx.good;
  const uint64_t block = 16 + get<uint32_t>(f, 12) + 4;
  const uint64_t rows = get<uint64_t>(f, block);
  const uint64_t payload = get<uint64_t>(f, block + 8);
  // Feature 1's row ends follow labels, dense values and feature 0's one-byte ids.
  const uint64_t ends = block + 24 + rows * 4 + rows * 4 + rows;
  const uint32_t e5 = get<uint32_t>(f, ends + 5 * 4);
  ASSERT_GT(e5, 0u);
  set<uint32_t>(f, ends + 6 * 4, e5 - 1);  // row 6 ends before row 5
  uint32_t crc = crc32c(f.data() + block, 16);
  crc = crc32c(f.data() + block + 24, payload, crc);
  set<uint32_t>(f, block + 16, crc);
  const std::string path = fx.put(f);
  ShardReader r(path);
  Batch out;
  expect_error([&] { r.read(0, 10, out); }, {"bad.shard' block 0", "feature 1 row 6"});
}

}  // namespace
}  // namespace dlrec::io
