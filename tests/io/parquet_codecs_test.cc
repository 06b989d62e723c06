// Parquet codecs: GZIP, LZ4_RAW, the legacy LZ4 in its Hadoop framing and as a bare block, and
// BROTLI. Files built page by page (parquet_pages.h), pages compressed here with zlib / liblz4 /
// libbrotlienc; read back, and with damaged streams each an error naming file, column, page and
// codec.
#include <brotli/encode.h>
#include <gtest/gtest.h>
#include <lz4.h>

#include "io/parquet_pages.h"

namespace dlrec::io {
namespace {

using namespace pqtest;  // NOLINT: the test's builders

std::string lz4_block(const std::string& in) {
  std::string out(static_cast<size_t>(LZ4_compressBound(static_cast<int>(in.size()))), '\0');
  const int n = LZ4_compress_default(in.data(), out.data(), static_cast<int>(in.size()),
                                     static_cast<int>(out.size()));
  EXPECT_GT(n, 0);
  out.resize(static_cast<size_t>(n));
  return out;
}

void put_be32(std::string& out, size_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xFF));
}

// Hadoop BlockCompressorStream framing: frames of `frame` raw bytes, each [raw length] then
// chunks of `chunk` raw bytes as [compressed length][LZ4 block] (lengths u32 big-endian).
std::string lz4_hadoop(const std::string& in, size_t frame, size_t chunk) {
  std::string out;
  for (size_t f = 0; f < in.size(); f += frame) {
    const std::string part = in.substr(f, frame);
    put_be32(out, part.size());
    for (size_t c = 0; c < part.size(); c += chunk) {
      const std::string z = lz4_block(part.substr(c, chunk));
      put_be32(out, z.size());
      out += z;
    }
  }
  return out;
}

std::string brotli(const std::string& in) {
  size_t n = BrotliEncoderMaxCompressedSize(in.size());
  std::string out(n, '\0');
  EXPECT_TRUE(BrotliEncoderCompress(5, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, in.size(),
                                    reinterpret_cast<const uint8_t*>(in.data()), &n,
                                    reinterpret_cast<uint8_t*>(out.data())));
  out.resize(n);
  return out;
}

struct Codec {
  const char* label;
  int32_t parquet;
  const char* name;  // as messages print it
  Packer pack;
};

std::vector<Codec> codecs() {
  return {
      {"gzip", pq::kGzip, "GZIP", gzip},
      {"gzip_two_members", pq::kGzip, "GZIP",
       [](const std::string& s) {
         return gzip(s.substr(0, s.size() / 2)) + gzip(s.substr(s.size() / 2));
       }},
      {"lz4_raw", pq::kLz4Raw, "LZ4_RAW", lz4_block},
      {"lz4_hadoop", pq::kLz4, "LZ4",
       [](const std::string& s) { return lz4_hadoop(s, s.size(), s.size()); }},
      {"lz4_hadoop_frames_of_chunks", pq::kLz4, "LZ4",
       [](const std::string& s) { return lz4_hadoop(s, 100, 40); }},
      {"lz4_bare_block", pq::kLz4, "LZ4", lz4_block},
      {"brotli", pq::kBrotli, "BROTLI", brotli},
  };
}

// ---- codecs

class ParquetCodecTest : public ::testing::TestWithParam<std::tuple<size_t, bool /*v2*/>> {
 protected:
  Codec cd = codecs()[std::get<0>(GetParam())];
  bool v2 = std::get<1>(GetParam());
  std::string path = temp_path(std::string(cd.label) + (v2 ? "_v2" : "_v1") + ".parquet");
  void TearDown() override { std::remove(path.c_str()); }
};

TEST_P(ParquetCodecTest, ReadsPagesWithNulls) {
  const ParquetColumnData c = int64_column(1000, 3);
  write_file(path, pq::kInt64, true, cd.parquet,
             pages_of(c, true, 300, v2, pq::kPlain, plain_int64, cd.pack), c.rows);
  expect_same(c, read_x(path), cd.label);
}

TEST_P(ParquetCodecTest, DamagedStreamsAreErrorsNamingFileColumnPageAndCodec) {
  const ParquetColumnData c = int64_column(400, 5);
  // The second page's stream is damaged by `damage`; its declared size is off by `size_delta`.
  auto error_with = [&](const Packer& damage, int32_t size_delta) {
    std::vector<Page> pages = pages_of(c, true, 200, v2, pq::kPlain, plain_int64, cd.pack);
    pages[1] = pages_of(c, true, 200, v2, pq::kPlain, plain_int64,
                        [&](const std::string& s) { return damage(cd.pack(s)); })[1];
    pages[1].h.uncompressed_size += size_delta;
    write_file(path, pq::kInt64, true, cd.parquet, pages, c.rows);
    return error_of([&] { read_x(path); });
  };
  const Packer same = [](const std::string& z) { return z; };
  const Packer cut = [](const std::string& z) { return z.substr(0, z.size() / 2); };
  const Packer garbage = [](const std::string& z) { return std::string(z.size(), '\xFF'); };
  const std::string where = path + ": row group 0, column 'x': data page 1: ";
  for (const auto& [what, e] :
       {std::pair<const char*, std::string>{"truncated", error_with(cut, 0)},
        {"garbage", error_with(garbage, 0)},
        {"size - 1", error_with(same, -1)},
        {"size + 1", error_with(same, +1)}}) {
    EXPECT_HAS(e, where) << what;
    EXPECT_HAS(e, std::string(" ") + cd.name + " data") << what;
  }
  if (cd.parquet == pq::kGzip || cd.parquet == pq::kBrotli) {
    EXPECT_HAS(error_with(cut, 0), std::string("truncated ") + cd.name + " data");
    EXPECT_HAS(error_with(same, -1), "data holds more than the page header's");
  }
  if (cd.parquet != pq::kLz4) {
    EXPECT_HAS(error_with(same, +1), "bytes, the page header says");
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, ParquetCodecTest,
                         ::testing::Combine(::testing::Range<size_t>(0, 7), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(codecs()[std::get<0>(info.param)].label) +
                                  (std::get<1>(info.param) ? "_v2" : "_v1");
                         });

// decompress() itself: every cut of a stream and random byte damage are errors (or, where a
// codec has no checksum, bytes of the declared size), never a crash.
TEST(ParquetCodecs, EveryCutAndRandomDamageIsAnErrorNeverACrash) {
  for (const Codec& cd : codecs()) {
    SCOPED_TRACE(cd.label);
    std::mt19937_64 rng(17);
    std::string raw;
    for (int i = 0; i < 3000; ++i) raw += std::to_string(rng() % 97) + (i % 7 ? "," : "\n");
    const std::string z = cd.pack(raw);
    std::string out;
    auto run = [&](const std::string& d) {
      pq::decompress(cd.parquet, reinterpret_cast<const uint8_t*>(d.data()), d.size(), raw.size(),
                     out, "test");
    };
    run(z);
    ASSERT_EQ(out, raw);
    for (size_t n = 0; n < z.size(); n += 1 + n / 64) {
      const std::string e = error_of([&] { run(z.substr(0, n)); });
      EXPECT_HAS(e, std::string("test: ")) << "cut at " << n << " of " << z.size();
    }
    int errors = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::string d = z;
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k)
        d[rng() % d.size()] ^= static_cast<char>(1 + rng() % 255);
      try {
        run(d);
        EXPECT_EQ(out.size(), raw.size());
      } catch (const Error& e) {
        ++errors;
        EXPECT_HAS(e.what(), "test: ");
      }
    }
    EXPECT_GT(errors, 0);
  }
}

// A page header that declares far more bytes than its data can hold (a fuzzed file asked for
// 1.43 GB from 3 KB) is an error before the buffer is allocated: at once for the codecs whose
// densest encoding bounds the size, after decoding what there is for BROTLI (whose buffer
// grows as it decodes).
TEST(ParquetCodecs, DeclaredSizesBeyondWhatTheDataHoldsAllocateNothing) {
  std::string raw;
  for (int i = 0; i < 200; ++i) raw += std::to_string(i * 7919 % 1000) + ",";
  std::vector<Codec> all = codecs();
  all.push_back({"snappy", pq::kSnappy, "SNAPPY", [](const std::string& s) {
                   std::string z;
                   pq::compress(pq::kSnappy, s.data(), s.size(), z);
                   return z;
                 }});
  all.push_back({"zstd", pq::kZstd, "ZSTD", [](const std::string& s) {
                   std::string z;
                   pq::compress(pq::kZstd, s.data(), s.size(), z);
                   return z;
                 }});
  const size_t huge = 1500000000;
  for (const Codec& cd : all) {
    SCOPED_TRACE(cd.label);
    const std::string z = cd.pack(raw);
    std::string out;
    const std::string e = error_of([&] {
      pq::decompress(cd.parquet, reinterpret_cast<const uint8_t*>(z.data()), z.size(), huge, out,
                     "test");
    });
    if (cd.parquet == pq::kBrotli)
      EXPECT_HAS(e, "test: BROTLI data holds " + std::to_string(raw.size()) +
                        " bytes, the page header says 1500000000");
    else
      EXPECT_HAS(e, "test: the page header declares 1500000000 bytes, more than " +
                        std::to_string(z.size()) + " bytes of " + cd.name + " data can hold");
    EXPECT_LT(out.capacity(), size_t{64} << 20);
  }
  std::string out;
  EXPECT_HAS(error_of([&] {
               pq::decompress(pq::kUncompressed, reinterpret_cast<const uint8_t*>(raw.data()),
                              raw.size(), huge, out, "test");
             }),
             "uncompressed page of " + std::to_string(raw.size()) + " bytes declares 1500000000");
  EXPECT_LT(out.capacity(), size_t{64} << 20);
}

TEST(ParquetCodecs, UnsupportedCodecIsNamed) {
  const ParquetColumnData c = int64_column(10, 1);
  const std::string path = temp_path("lzo.parquet");
  write_file(path, pq::kInt64, true, pq::kLzo,
             pages_of(c, true, 10, false, pq::kPlain, plain_int64, nullptr), c.rows);
  const std::string e = error_of([&] { read_x(path); });
  EXPECT_HAS(e, path +
                    ": row group 0, column 'x': unsupported compression codec LZO (supported: "
                    "UNCOMPRESSED, SNAPPY, ZSTD, GZIP, LZ4_RAW, LZ4, BROTLI)");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dlrec::io
