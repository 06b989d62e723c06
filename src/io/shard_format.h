// Private to the shard files (shard_writer.cc, shard_reader.cc, ...): the constants and
// byte-level helpers of the training shard format.
//
// dlrec training shards, format version 2 (byte-exact layout in docs/FORMATS.md; version 1 is
// still read).
//
//   file    = header block* footer trailer
//   header  = "DLRSHARD" u32 version u32 json_len json u32 crc32c(version..json)
//   block   = u64 rows u64 payload_bytes u32 crc32c(rows, payload_bytes, payload) u32 0 payload
//   payload = labels f32[rows] dense f32[rows*num_dense]
//             per categorical feature t: (multi-hot only) u32 row_end[rows], then ids
//             (u8, u16, i32 or i64: the narrowest holding every id of the feature's
//             cardinality; version 1: i32 when cardinality <= 2^31 else i64)[n_ids]
//   footer  = u64 num_blocks u64 total_rows (u64 first_row, u64 file_offset)[num_blocks]
//   trailer = u64 footer_offset u32 crc32c(footer) u32 0 "DLRSEND\0"
//
// All integers little-endian. The trailer sits at a fixed distance from the end so a reader
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "dlrec/io/shard.h"

namespace dlrec::io::shard_format {

constexpr char kMagic[8] = {'D', 'L', 'R', 'S', 'H', 'A', 'R', 'D'};
constexpr char kEndMagic[8] = {'D', 'L', 'R', 'S', 'E', 'N', 'D', '\0'};
constexpr uint32_t kVersion = 2;  // written; 1 and 2 are read
constexpr size_t kBlockHeaderBytes = 24;
constexpr size_t kTrailerBytes = 24;
constexpr int64_t kInt32Cardinality = int64_t{1} << 31;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are little-endian");

inline std::string base_name(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}

// Bytes per id of a feature of `cardinality` in a file of format `version`: version 2 the
// narrowest of u8/u16/i32/i64 holding ids [0, cardinality); version 1 i32 or i64.
inline size_t id_width(int64_t cardinality, uint32_t version) {
  if (cardinality > kInt32Cardinality) return 8;
  if (version >= 2 && cardinality <= 256) return 1;
  if (version >= 2 && cardinality <= 65536) return 2;
  return 4;
}

template <class T>
inline void put(std::string& buf, T v) {
  buf.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <class T>
inline T get_at(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline std::string hex32(uint32_t v) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

// Checks a layout's structure (counts agree, cardinalities >= 1); `where` starts the message.
void validate_layout(const ShardLayout& l, const std::string& where);

}  // namespace dlrec::io::shard_format
