// TensorBoard event files (include/dlrec/train/tensorboard.h): the TFRecord framing byte by
// byte, the writer's file and its errors. tests/python/test_tensorboard_events.py reads real
// runs' files with tensorboard's own reader.
#include "dlrec/train/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "dlrec/core/file_util.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::train {
namespace {

using dlrec::testing::expect_error;
using dlrec::testing::list_dir;
using dlrec::testing::TempDir;

uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(TensorBoard, MaskedCrcOfTheCheckValue) {
  // CRC-32C("123456789") = 0xe3069283 (the standard check value), rotated right by 15 bits
  // plus 0xa282ead8.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(tfrecord_masked_crc("123456789", 9), 0xc78ab0e5u);
}

TEST(TensorBoard, RecordFraming) {
  const std::string data = "some event bytes";
  const std::string rec = tfrecord_frame(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(static_cast<uint8_t>(rec[i])) << (8 * i);
  EXPECT_EQ(len, data.size());
  EXPECT_EQ(u32_at(rec, 8), tfrecord_masked_crc(rec.data(), 8));
  EXPECT_EQ(rec.substr(12, data.size()), data);
  EXPECT_EQ(u32_at(rec, 12 + data.size()), tfrecord_masked_crc(data.data(), data.size()));
  // An empty record still has its CRCs.
  EXPECT_EQ(tfrecord_frame("").size(), 16u);
}

TEST(TensorBoard, WriterAppendsRecordsAsTheyCome) {
  TempDir dir("tb_writer");
  EventFileWriter w(dir.path);
  const std::string name = w.path().substr(dir.path.size() + 1);
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  // The first record: file_version, on disk at once.
  std::string bytes = slurp(w.path());
  ASSERT_GE(bytes.size(), 16u);
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  const size_t first = bytes.size();
  w.scalar("train/loss", 7, 0.25);
  bytes = slurp(w.path());  // before the writer is closed: appended and flushed
  ASSERT_GT(bytes.size(), first + 16);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i)
    len |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[first + i])) << (8 * i);
  EXPECT_EQ(first + 16 + len, bytes.size());
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  float v = 0.25f;  // simple_value (field 2, fixed32) follows the tag
  EXPECT_NE(bytes.find(std::string("\x15", 1) + std::string(reinterpret_cast<char*>(&v), 4)),
            std::string::npos);
}

TEST(TensorBoard, TwoWritersInOneDirectoryGetTwoFiles) {
  TempDir dir("tb_two");
  EventFileWriter a(dir.path), b(dir.path);
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(list_dir(dir.path).size(), 2u);
}

TEST(TensorBoard, MissingDirectoryIsAClearError) {
  TempDir dir("tb_missing");
  const std::string missing = dir.path + "/no/such/dir";
  expect_error([&] { EventFileWriter w(missing); },
               {"cannot create the TensorBoard event file", missing, "No such file"});
}

}  // namespace
}  // namespace dlrec::train
