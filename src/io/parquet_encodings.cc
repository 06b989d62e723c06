// DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY and BYTE_STREAM_SPLIT
// decoders (see parquet_encodings.h), from the layout Encodings.md describes.
#include "io/parquet_encodings.h"

#include <algorithm>
#include <cstring>

#include "dlrec/core/error.h"

namespace dlrec::io::pq {
namespace {

// ULEB128 at data[pos]; advances pos.
uint64_t read_uleb(const uint8_t* data, size_t size, size_t& pos, const std::string& what,
                   const char* field) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    if (pos >= size) fail(what, ": the ", field, " is past the end of the data");
    if (shift > 63) fail(what, ": the ", field, " is not a valid ULEB128 integer");
    const uint8_t b = data[pos++];
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

uint64_t unzigzag(uint64_t u) { return (u >> 1) ^ (~(u & 1) + 1); }

// Unpacks n values of `width` bits (0..64, LSB first) from p, which holds `bytes` bytes
// (enough for them).
void unpack(const uint8_t* p, size_t bytes, int width, int64_t n, uint64_t* out) {
  if (width == 0) {
    std::fill(out, out + n, 0);
    return;
  }
  const uint64_t mask = width == 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1;
  uint64_t bit = 0;
  for (int64_t i = 0; i < n; ++i, bit += static_cast<uint64_t>(width)) {
    const size_t byte = bit >> 3;
    const int shift = static_cast<int>(bit & 7);
    uint64_t x = 0;
    std::memcpy(&x, p + byte, std::min<size_t>(8, bytes - byte));
    uint64_t v = x >> shift;
    if (shift + width > 64) v |= static_cast<uint64_t>(p[byte + 8]) << (64 - shift);
    out[i] = v & mask;
  }
}

}  // namespace

size_t delta_binary_packed_decode(const uint8_t* data, size_t size, int value_bits,
                                  int64_t max_values, std::vector<int64_t>& out,
                                  const std::string& what) {
  size_t pos = 0;
  const uint64_t block_size = read_uleb(data, size, pos, what, "block size");
  const uint64_t miniblocks = read_uleb(data, size, pos, what, "miniblock count");
  const uint64_t total = read_uleb(data, size, pos, what, "value count");
  const uint64_t first = unzigzag(read_uleb(data, size, pos, what, "first value"));
  if (block_size == 0 || block_size % 128 != 0 || block_size > (uint64_t{1} << 31))
    fail(what, ": block size ", block_size, " is not a positive multiple of 128");
  if (miniblocks == 0 || block_size % miniblocks != 0 || (block_size / miniblocks) % 32 != 0)
    fail(what, ": ", miniblocks, " miniblocks do not split a block of ", block_size,
         " values into multiples of 32");
  if (total > static_cast<uint64_t>(std::max<int64_t>(max_values, 0)))
    fail(what, ": the header declares ", total, " values, more than the page's ", max_values);
  const uint64_t per_mini = block_size / miniblocks;
  out.resize(total);
  if (total == 0) return pos;
  auto value_of = [&](uint64_t v) {
    return value_bits == 32 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(v)))
                            : static_cast<int64_t>(v);
  };
  out[0] = value_of(first);
  uint64_t prev = first;
  std::vector<uint64_t> deltas(std::min(per_mini, total));
  uint64_t done = 1;
  while (done < total) {
    const uint64_t min_delta = unzigzag(read_uleb(data, size, pos, what, "block's min delta"));
    if (miniblocks > size - pos)
      fail(what, ": the bit widths of a block's ", miniblocks, " miniblocks are past the end ",
           "of the data (value ", done, " of ", total, ")");
    const uint8_t* widths = data + pos;
    pos += miniblocks;
    for (uint64_t m = 0; m < miniblocks && done < total; ++m) {
      const int width = widths[m];
      if (width > value_bits)
        fail(what, ": miniblock bit width ", width, " exceeds the ", value_bits,
             " bits of the values (value ", done, " of ", total, ")");
      const uint64_t bytes = per_mini * static_cast<uint64_t>(width) / 8;
      if (bytes > size - pos)
        fail(what, ": a miniblock of ", bytes, " bytes is past the end of the data (value ", done,
             " of ", total, ")");
      const int64_t n = static_cast<int64_t>(std::min(per_mini, total - done));
      unpack(data + pos, bytes, width, n, deltas.data());
      for (int64_t k = 0; k < n; ++k) {
        prev += min_delta + deltas[k];  // wraps, as the format requires
        out[done++] = value_of(prev);
      }
      pos += bytes;
    }
  }
  return pos;
}

size_t delta_length_byte_array_decode(const uint8_t* data, size_t size, int64_t max_values,
                                      std::vector<std::string_view>& out,
                                      std::vector<int64_t>& lengths, const std::string& what) {
  size_t pos = delta_binary_packed_decode(data, size, 32, max_values, lengths, what + ": lengths");
  out.resize(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t len = lengths[i];
    if (len < 0) fail(what, ": value ", i, " has a negative length ", len);
    if (static_cast<uint64_t>(len) > size - pos)
      fail(what, ": value ", i, " of ", len, " bytes is past the end of the data (", size - pos,
           " bytes left)");
    out[i] = std::string_view(reinterpret_cast<const char*>(data + pos), static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
  }
  return pos;
}

void delta_byte_array_decode(const uint8_t* data, size_t size, int64_t max_values,
                             std::string& arena, std::vector<std::string_view>& out,
                             const std::string& what) {
  std::vector<int64_t> prefix, lengths;
  const size_t pos =
      delta_binary_packed_decode(data, size, 32, max_values, prefix, what + ": prefix lengths");
  std::vector<std::string_view> suffix;
  delta_length_byte_array_decode(data + pos, size - pos, max_values, suffix, lengths,
                                 what + ": suffixes");
  if (prefix.size() != suffix.size())
    fail(what, ": ", prefix.size(), " prefix lengths but ", suffix.size(), " suffixes");
  // Sizes first: check every prefix against the value before it and bound the total.
  uint64_t total = 0, prev_len = 0;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (prefix[i] < 0 || static_cast<uint64_t>(prefix[i]) > prev_len)
      fail(what, ": value ", i, " has prefix length ", prefix[i], " but the value before it has ",
           prev_len, " bytes");
    prev_len = static_cast<uint64_t>(prefix[i]) + suffix[i].size();
    total += prev_len;
    if (total > kMaxDeltaByteArrayBytes)
      fail(what, ": the values expand to more than ", kMaxDeltaByteArrayBytes, " bytes (at value ",
           i, ")");
  }
  arena.resize(total);
  char* base = arena.data();
  size_t at = 0, prev_at = 0;
  out.resize(prefix.size());
  for (size_t i = 0; i < prefix.size(); ++i) {
    const size_t p = static_cast<size_t>(prefix[i]);
    if (p) std::memcpy(base + at, base + prev_at, p);
    if (!suffix[i].empty()) std::memcpy(base + at + p, suffix[i].data(), suffix[i].size());
    const size_t len = p + suffix[i].size();
    out[i] = std::string_view(base + at, len);
    prev_at = at;
    at += len;
  }
}

void byte_stream_split_decode(const uint8_t* data, size_t size, int64_t n, int width,
                              std::string& out, const std::string& what) {
  const uint64_t un = static_cast<uint64_t>(n);
  if (n < 0 || width <= 0 || un * static_cast<uint64_t>(width) != size)
    fail(what, ": ", size, " bytes of data do not hold ", n, " values of ", width,
         " bytes (the streams must fill the page exactly)");
  out.resize(size);
  char* o = out.data();
  for (int b = 0; b < width; ++b) {
    const uint8_t* s = data + static_cast<size_t>(b) * un;
    for (uint64_t i = 0; i < un; ++i) o[i * width + b] = static_cast<char>(s[i]);
  }
}

}  // namespace dlrec::io::pq
