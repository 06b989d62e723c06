// The tensor file reader against damaged and hostile files: every length and offset from the
// file is checked against the bytes present before it is used, the checksum before the header
// is parsed, and a checksum-valid header whose tensors overlap or leave the payload is refused.
#include "dlrec/io/tensor_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dlrec/core/file_util.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::io {
namespace {

using dlrec::testing::expect_error;
using dlrec::testing::read_all;
using dlrec::testing::TempDir;
using dlrec::testing::write_file;

// A tensor file built by hand: `header` as the header JSON, `payload` as the payload bytes,
// with a correct checksum and end marker (as a writer would produce for that header).
std::string craft(const std::string& header, const std::string& payload) {
  std::string f("DLRECTF1", 8);
  const uint32_t version = 1, zero = 0;
  const uint64_t hlen = header.size();
  f.append(reinterpret_cast<const char*>(&version), 4);
  f.append(reinterpret_cast<const char*>(&zero), 4);
  f.append(reinterpret_cast<const char*>(&hlen), 8);
  f += header;
  f.append((64 - f.size() % 64) % 64, '\0');
  f += payload;
  const uint32_t crc = crc32c(f.data(), f.size());
  f.append(reinterpret_cast<const char*>(&crc), 4);
  f.append("DLRECEND", 8);
  return f;
}

std::string entry(const std::string& name, int64_t n, int64_t offset) {
  return R"({"name": ")" + name + R"(", "dtype": "f32", "shape": [)" + std::to_string(n) +
         R"(], "offset": )" + std::to_string(offset) + R"(, "bytes": )" + std::to_string(n * 4) +
         "}";
}

std::string header(const std::vector<std::string>& entries, int64_t payload_bytes) {
  std::string t;
  for (const auto& e : entries) t += (t.empty() ? "" : ",") + e;
  return R"({"meta": {"kind": "test"}, "tensors": [)" + t + R"(], "payload_bytes": )" +
         std::to_string(payload_bytes) + "}";
}

std::vector<NamedTensor> targets(int64_t n) {
  return {{"a", Tensor::zeros({n}, DType::F32)}, {"b", Tensor::zeros({n}, DType::F32)}};
}

TEST(TensorFile, RoundTripAndCraftedTwinAgree) {
  TempDir dir("tf_roundtrip");
  std::vector<float> a(16), b(16);
  for (int i = 0; i < 16; ++i) a[i] = i, b[i] = -i;
  const std::string path = dir.path + "/w.dlrec";
  save_tensors(path, {{"a", Tensor::from_vector(a, {16})}, {"b", Tensor::from_vector(b, {16})}},
               {{"kind", "test"}});
  auto t = targets(16);
  EXPECT_EQ(load_tensors(path, t).at("kind"), "test");
  EXPECT_EQ(t[0].second.to_vector<float>(), a);
  EXPECT_EQ(t[1].second.to_vector<float>(), b);
  // The hand-built file of the same header loads the same way (the crafting below is sound).
  std::string payload(128, '\0');
  std::memcpy(&payload[0], a.data(), 64);
  std::memcpy(&payload[64], b.data(), 64);
  const std::string twin = write_file(
      dir.path, "twin.dlrec", craft(header({entry("a", 16, 0), entry("b", 16, 64)}, 128), payload));
  auto u = targets(16);
  load_tensors(twin, u);
  EXPECT_EQ(u[1].second.to_vector<float>(), b);
}

TEST(TensorFile, OutOfRangeOrOverlappingOffsetsAreRefused) {
  TempDir dir("tf_offsets");
  const std::string payload(128, '\0');
  // Checksum-valid files whose index points outside the payload, or two tensors at one place.
  struct Case {
    std::vector<std::string> entries;
    std::vector<std::string> expect;
  } cases[] = {
      {{entry("a", 16, 0), entry("b", 16, 128)},
       {"tensors[1]", "'b'", "outside the 128-byte payload"}},
      {{entry("a", 16, 0), entry("b", 16, 1ll << 62)}, {"tensors[1]", "outside"}},
      {{entry("a", 16, 0), entry("b", 16, 0)}, {"overlaps", "'a'"}},
      {{entry("a", 32, 0), entry("b", 16, 64)}, {"overlaps"}},
      {{entry("a", 16, 0), entry("a", 16, 64)}, {"'a' appears twice"}},
      {{entry("a", 16, 3), entry("b", 16, 64)}, {"offset 3 is not a multiple of 64"}},
      {{entry("a", 16, 0),
        R"({"name": "b", "dtype": "f32", "shape": [16], "offset": 64, "bytes": 4})"},
       {"4 bytes for f32[16]"}},
      {{entry("a", 16, 0),
        R"({"name": "b", "dtype": "f32", "shape": [4611686018427387904, 4], )"
        R"("offset": 64, "bytes": 64})"},
       {"larger than the 128-byte payload"}},
      {{entry("a", 16, 0),
        R"({"name": "b", "dtype": "f32", "shape": [-16], "offset": 64, "bytes": 64})"},
       {"negative dimension"}},
  };
  for (const Case& c : cases) {
    const std::string path =
        write_file(dir.path, "bad.dlrec", craft(header(c.entries, 128), payload));
    auto t = targets(16);
    expect_error([&] { load_tensors(path, t); }, c.expect);
    expect_error([&] { read_tensor_meta(path); }, c.expect);
  }
}

TEST(TensorFile, HugeLengthsAreRefusedBeforeAllocation) {
  TempDir dir("tf_lengths");
  std::string good =
      craft(header({entry("a", 16, 0), entry("b", 16, 64)}, 128), std::string(128, '\0'));
  // Header length 2^62 (offset 16): an error naming it, not an allocation of 4 EiB.
  std::string f = good;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(&f[16], &huge, 8);
  const std::string path = write_file(dir.path, "hlen.dlrec", f);
  expect_error([&] { read_tensor_meta(path); }, {"header length 4611686018427387904", "offset 16"});
  // payload_bytes that would wrap the size arithmetic.
  const std::string wrap = write_file(
      dir.path, "wrap.dlrec",
      craft(header({entry("a", 16, 0)}, -1ll /* as u64: 2^64 - 1 */), std::string(128, '\0')));
  expect_error([&] { read_tensor_meta(wrap); }, {"header"});
  const std::string big =
      write_file(dir.path, "big.dlrec",
                 craft(R"({"meta": {}, "tensors": [], "payload_bytes": 18446744073709551552})",
                       std::string(64, '\0')));
  expect_error([&] { read_tensor_meta(big); }, {"payload_bytes 18446744073709551552"});
}

TEST(TensorFile, ChecksumIsVerifiedBeforeTheHeaderIsParsed) {
  TempDir dir("tf_crc");
  std::string f =
      craft(header({entry("a", 16, 0), entry("b", 16, 64)}, 128), std::string(128, '\0'));
  f[24] = '[';  // the header's first byte: now invalid JSON, and the checksum no longer matches
  const std::string path = write_file(dir.path, "crc.dlrec", f);
  expect_error([&] { read_tensor_meta(path); }, {"crc.dlrec", "checksum mismatch"});
  // Truncated: no end marker, named with its offset.
  const std::string cut = write_file(dir.path, "cut.dlrec", f.substr(0, f.size() - 5));
  expect_error([&] { read_tensor_meta(cut); }, {"cut.dlrec", "truncated"});
}

TEST(TensorFile, DeeplyNestedHeaderIsAClearError) {
  TempDir dir("tf_deep");
  const std::string deep = R"({"meta": )" + std::string(100000, '[') + std::string(100000, ']') +
                           R"(, "tensors": [], "payload_bytes": 0})";
  const std::string path = write_file(dir.path, "deep.dlrec", craft(deep, ""));
  expect_error([&] { read_tensor_meta(path); }, {"deep.dlrec", "nesting deeper than 64"});
}

TEST(TensorFile, RequireFiniteRefusesNaNAndInfinity) {
  TempDir dir("tf_finite");
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> a(16, 1.f);
    a[5] = bad;
    const std::string path = dir.path + "/w.dlrec";
    save_tensors(path,
                 {{"a", Tensor::from_vector(a, {16})}, {"b", Tensor::zeros({16}, DType::F32)}},
                 json::object());
    auto t = targets(16);
    load_tensors(path, t);  // allowed unless asked for (a checkpoint may be inspected)
    TensorLoadOptions strict;
    strict.require_finite = true;
    expect_error([&] { load_tensors(path, t, strict); }, {"w.dlrec", "tensor 'a'", "element 5"});
  }
}

}  // namespace
}  // namespace dlrec::io
