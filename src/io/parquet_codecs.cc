// The Parquet codecs beyond UNCOMPRESSED/SNAPPY/ZSTD (those stay in parquet_format.cc): GZIP
// (zlib), LZ4_RAW and the deprecated Hadoop-framed LZ4 (liblz4), BROTLI (libbrotlidec). Every
// one decompresses into the page header's uncompressed size (allocated once by decompress(),
// after checking that the compressed bytes can hold that much; BROTLI's buffer grows up to it
// as the stream decodes, since a few of its bytes can hold megabytes): a stream that would
// write more, ends early or is damaged is an error naming the codec.
#include <brotli/decode.h>
#include <lz4.h>
#include <zlib.h>

#include <algorithm>
#include <string>

#include "dlrec/core/error.h"
#include "io/parquet_format.h"

namespace dlrec::io::pq {
namespace {

// GZIP (RFC 1952; zlib headers are accepted too); a page may hold several members back to
// back (Compression.md asks readers to accept that).
void inflate_gzip(const uint8_t* data, size_t size, size_t want, std::string& out,
                  const std::string& what) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 32) != Z_OK) fail(what, ": GZIP: cannot initialise zlib");
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&z};
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(want);
  for (;;) {
    const int rc = inflate(&z, Z_NO_FLUSH);
    if (rc == Z_OK) continue;
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      if (inflateReset(&z) != Z_OK) fail(what, ": GZIP: cannot reset zlib");
      continue;  // the next member
    }
    const size_t got = want - z.avail_out;
    if (rc == Z_BUF_ERROR && z.avail_in == 0)
      fail(what, ": truncated GZIP data (the stream ends after ", got, " of ", want, " bytes)");
    if (rc == Z_BUF_ERROR)
      fail(what, ": GZIP data holds more than the page header's ", want, " bytes");
    fail(what, ": corrupt GZIP data (zlib: ", z.msg ? z.msg : "error " + std::to_string(rc),
         ", after ", got, " of ", want, " bytes)");
  }
  const size_t got = want - z.avail_out;
  if (got != want) fail(what, ": GZIP data holds ", got, " bytes, the page header says ", want);
}

void lz4_raw(const uint8_t* data, size_t size, size_t want, std::string& out,
             const std::string& what, const char* name) {
  const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(data), out.data(),
                                    static_cast<int>(size), static_cast<int>(want));
  if (n < 0)
    fail(what, ": corrupt ", name, " data (not an LZ4 block of at most ", want,
         " bytes; truncated or damaged)");
  if (static_cast<size_t>(n) != want)
    fail(what, ": ", name, " data holds ", n, " bytes, the page header says ", want);
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Hadoop's BlockCompressorStream framing: blocks of [u32 BE raw length] followed by chunks of
// [u32 BE compressed length][LZ4 block] until the block's raw length is reached. False (with
// the reason) when the bytes are not such frames adding up to exactly `want` bytes.
bool lz4_hadoop(const uint8_t* data, size_t size, size_t want, std::string& out, std::string& why) {
  size_t in = 0, produced = 0;
  while (in < size) {
    if (size - in < 4) return why = "a frame header is cut short", false;
    const uint32_t block_raw = load_be32(data + in);
    in += 4;
    if (block_raw > want - produced)
      return why = "a frame of " + std::to_string(block_raw) + " bytes exceeds the page", false;
    size_t block_done = 0;
    while (block_done < block_raw) {
      if (size - in < 4) return why = "a chunk header is cut short", false;
      const uint32_t chunk = load_be32(data + in);
      in += 4;
      if (chunk > size - in)
        return why = "a chunk of " + std::to_string(chunk) + " bytes runs past the page", false;
      const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(data + in),
                                        out.data() + produced + block_done, static_cast<int>(chunk),
                                        static_cast<int>(block_raw - block_done));
      if (n <= 0) return why = "a chunk is not a valid LZ4 block", false;
      in += chunk;
      block_done += static_cast<size_t>(n);
    }
    produced += block_raw;
  }
  if (produced != want)
    return why = "the frames hold " + std::to_string(produced) + " bytes", false;
  return true;
}

void brotli(const uint8_t* data, size_t size, size_t want, std::string& out,
            const std::string& what) {
  BrotliDecoderState* s = BrotliDecoderCreateInstance(nullptr, nullptr, nullptr);
  if (!s) fail(what, ": BROTLI: cannot create a decoder");
  struct End {
    BrotliDecoderState* s;
    ~End() { BrotliDecoderDestroyInstance(s); }
  } end{s};
  // The buffer starts at 64 times the input (at least 64 KiB) and doubles, up to `want`.
  out.resize(std::min(want, std::max<size_t>(size_t{1} << 16, size * 64)));
  size_t avail_in = size, avail_out = out.size(), got = 0;
  const uint8_t* next_in = data;
  uint8_t* next_out = reinterpret_cast<uint8_t*>(out.data());
  BrotliDecoderResult r;
  for (;;) {
    r = BrotliDecoderDecompressStream(s, &avail_in, &next_in, &avail_out, &next_out, nullptr);
    got = out.size() - avail_out;
    if (r != BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT || out.size() == want) break;
    out.resize(std::min(want, out.size() * 2));
    next_out = reinterpret_cast<uint8_t*>(out.data()) + got;
    avail_out = out.size() - got;
  }
  switch (r) {
    case BROTLI_DECODER_RESULT_SUCCESS:
      if (avail_in != 0)
        fail(what, ": corrupt BROTLI data (", avail_in, " bytes after the end of the stream)");
      if (got != want)
        fail(what, ": BROTLI data holds ", got, " bytes, the page header says ", want);
      return;
    case BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT:
      fail(what, ": truncated BROTLI data (the stream ends after ", got, " of ", want, " bytes)");
    case BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT:
      fail(what, ": BROTLI data holds more than the page header's ", want, " bytes");
    default:
      fail(what, ": corrupt BROTLI data (", BrotliDecoderErrorString(BrotliDecoderGetErrorCode(s)),
           ", after ", got, " of ", want, " bytes)");
  }
}

}  // namespace

void decompress_more(int32_t codec, const uint8_t* data, size_t size, size_t uncompressed_size,
                     std::string& out, const std::string& what) {
  switch (codec) {
    case kGzip:
      return inflate_gzip(data, size, uncompressed_size, out, what);
    case kLz4Raw:
      return lz4_raw(data, size, uncompressed_size, out, what, "LZ4_RAW");
    case kLz4: {
      // The deprecated LZ4 codec: Hadoop-framed (parquet-mr), or, as older parquet-cpp wrote
      // it, a bare LZ4 block; Arrow reads both the same way.
      std::string why;
      if (lz4_hadoop(data, size, uncompressed_size, out, why)) return;
      const int n =
          LZ4_decompress_safe(reinterpret_cast<const char*>(data), out.data(),
                              static_cast<int>(size), static_cast<int>(uncompressed_size));
      if (n >= 0 && static_cast<size_t>(n) == uncompressed_size) return;
      fail(what, ": corrupt LZ4 data: neither Hadoop-framed LZ4 (", why,
           ") nor a bare LZ4 block of ", uncompressed_size, " bytes");
    }
    case kBrotli:
      return brotli(data, size, uncompressed_size, out, what);
    default:
      fail(what, ": unsupported compression codec ", codec_name(codec),
           " (supported: ", kSupportedCodecs, ")");
  }
}

}  // namespace dlrec::io::pq
