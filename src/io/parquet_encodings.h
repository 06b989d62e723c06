// Decoders of the Parquet value encodings beyond PLAIN and dictionary indices, written from the
// format's Encodings.md: DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY and
// BYTE_STREAM_SPLIT. Each reads only [data, data + size) and checks every header field, bit
// width and length against those bytes; errors throw dlrec::Error starting with `what`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlrec::io::pq {

// The most bytes DELTA_BYTE_ARRAY may expand one page into (its prefixes repeat earlier bytes,
// so a small page could otherwise ask for any amount of memory).
inline constexpr uint64_t kMaxDeltaByteArrayBytes = uint64_t{1} << 30;

// DELTA_BINARY_PACKED: decodes all the values the stream's header declares (at most
// `max_values`, else an error) into `out`. `value_bits` is 32 (INT32: values wrap at 32 bits,
// miniblocks are at most 32 bits wide) or 64. Returns the number of bytes the stream spans.
size_t delta_binary_packed_decode(const uint8_t* data, size_t size, int value_bits,
                                  int64_t max_values, std::vector<int64_t>& out,
                                  const std::string& what);

// DELTA_LENGTH_BYTE_ARRAY: DELTA_BINARY_PACKED lengths, then the bytes back to back. `out`
// views [data, data + size). `lengths` is scratch. Returns the bytes the encoding spans.
size_t delta_length_byte_array_decode(const uint8_t* data, size_t size, int64_t max_values,
                                      std::vector<std::string_view>& out,
                                      std::vector<int64_t>& lengths, const std::string& what);

// DELTA_BYTE_ARRAY: DELTA_BINARY_PACKED prefix lengths, then the suffixes as
// DELTA_LENGTH_BYTE_ARRAY; value i is the first prefix[i] bytes of value i-1 and its suffix.
// The values are assembled in `arena` (at most kMaxDeltaByteArrayBytes) and `out` views it.
void delta_byte_array_decode(const uint8_t* data, size_t size, int64_t max_values,
                             std::string& arena, std::vector<std::string_view>& out,
                             const std::string& what);

// BYTE_STREAM_SPLIT: `n` values of `width` bytes stored as `width` streams of n bytes (stream b
// holds byte b of every value; exactly n * width bytes). Writes them to `out` in PLAIN layout.
void byte_stream_split_decode(const uint8_t* data, size_t size, int64_t n, int width,
                              std::string& out, const std::string& what);

}  // namespace dlrec::io::pq
