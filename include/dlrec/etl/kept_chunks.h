// Parsed input kept between the ETL passes, in a compact form (EtlOptions::input_cache_mb).
//
// A io::RawChunk holds 8 bytes per categorical value and 8 more per row and column for the
// offsets: 472 bytes per Criteo row, 1.8x the text. A KeptChunk stores the same rows with
//   - labels as one byte per row when every label is exactly 0.0f or 1.0f (else 4 bytes);
//   - dense values as they are (4 bytes, NaN payloads and all);
//   - a categorical column whose rows hold at most one value each, every value < 2^32 (Criteo's
//     8-hex-digit keys): 4 bytes per value plus a bitmap of the rows that have one (no bitmap
//     when all do); any other column as the RawChunk holds it (8-byte values and offsets);
// so about 165 bytes per Criteo row, and unpack() gives back the RawChunk bit for bit.
//
// Its memory comes from a KeptArena: blocks (2 MB growing to 64 MB), each mapped while the one
// before is being filled and faulted in 8 MB at a time, a step ahead of use, by
// madvise(MADV_POPULATE_WRITE) calls (where the kernel has it; 2-3x less kernel time than a
// page fault per 4 KB page on the 2-core build machine, docs/ETL.md), optionally with
// MADV_HUGEPAGE (transparent huge pages). A block is unmapped
// when the last chunk kept in it is destroyed, so the memory goes down as the transform pass
// consumes the chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dlrec/io/raw_chunk.h"

namespace dlrec::etl {

// Whether madvise(MADV_HUGEPAGE) can give transparent huge pages: `enabled` is the text of
// /sys/kernel/mm/transparent_hugepage/enabled (e.g. "always [madvise] never"); true when the
// bracketed mode is "always" or "madvise", false for "never" or any other text.
bool thp_madvise_allowed(const std::string& enabled);
// Bytes of free memory in blocks of at least `huge_bytes` (the buddy allocator's orders whose
// block of `page_bytes << order` is that large), summed over the zones listed in `buddyinfo`
// (the text of /proc/buddyinfo: "Node 0, zone   Normal  18343  15650 ..." with the free block
// counts of orders 0, 1, ...). -1 when the text lists no zone or a line is not of that form.
int64_t free_huge_block_bytes(const std::string& buddyinfo, int64_t page_bytes,
                              int64_t huge_bytes);
// From the running system (the two files above, the page size, hpage_pmd_size): whether huge
// pages may be asked for and free 2 MB blocks already cover 2 * `bytes` (so the kernel need
// not compact memory to find them). False where a file cannot be read or parsed.
bool huge_pages_free_for(int64_t bytes);

class KeptArena {
 public:
  // huge_pages: ask for transparent huge pages on the blocks (MADV_HUGEPAGE); block_bytes:
  // the largest block (blocks grow from 2 MB to it, doubling the memory mapped; a larger
  // request gets a block of its own size).
  explicit KeptArena(bool huge_pages = false, size_t block_bytes = kBlockBytes)
      : huge_(huge_pages), block_(block_bytes) {}
  KeptArena(const KeptArena&) = delete;
  KeptArena& operator=(const KeptArena&) = delete;

  // `bytes` of zeroed memory (8-byte aligned); `block` shares the ownership of its block.
  // Thread-safe. Throws dlrec::Error when no memory can be mapped.
  char* alloc(size_t bytes, std::shared_ptr<char>& block);
  // Bytes of the blocks used so far (including the unused end of the current one).
  int64_t mapped_bytes() const { return mapped_; }
  // No more requests: drops the block made ready ahead, if any, and makes no more.
  void finish();

  static constexpr size_t kBlockBytes = size_t{64} << 20;

 private:
  // Maps a block and faults in its first kPopulateStep bytes.
  std::shared_ptr<char> map_block(size_t size) const;
  // Faults in [from, from + bytes) (MADV_POPULATE_WRITE; pages already there are left as
  // they are).
  static void populate(char* from, size_t bytes);
  static constexpr size_t kPopulateStep = size_t{8} << 20;
  // The size of a new block: as much as all blocks so far (at least 2 MB, at most block_), so
  // that a small input does not fault in a large block.
  size_t grown_size() const;

  std::mutex mu_;
  bool huge_;
  size_t block_;
  std::shared_ptr<char> cur_;
  std::shared_ptr<char> next_;  // the next block, mapped and faulted in ahead
  size_t next_size_ = 0;
  bool preparing_ = false, last_ = false, populating_ = false;
  size_t used_ = 0, size_ = 0;
  size_t populated_ = 0;  // bytes of cur_ faulted in (a prefix, some of it maybe in progress)
  int64_t mapped_ = 0;
};

class KeptChunk {
 public:
  KeptChunk() = default;
  // Rows [lo, hi) of c (0 <= lo <= hi <= c.rows), copied into memory from `arena`.
  // first_line becomes c.first_line + lo (0 stays 0).
  static KeptChunk keep(const io::RawChunk& c, int64_t lo, int64_t hi, KeptArena& arena);
  // The chunk as parsed, moved in (no copy, no compaction; `c` is left empty).
  static KeptChunk keep_parsed(io::RawChunk&& c);

  // The rows as a RawChunk, bit-identical to the rows kept; reuses out's capacity.
  void unpack(io::RawChunk& out) const;
  // The same, moving a chunk kept as parsed out of this one (no copy; it is empty after).
  void unpack_move(io::RawChunk& out);

  // A chunk kept as parsed (keep_parsed), else null.
  const io::RawChunk* parsed() const { return parsed_.get(); }
  int64_t rows() const { return rows_; }
  int64_t bytes() const { return bytes_; }  // bytes this chunk holds (arena, or the parsed chunk's)

 private:
  struct Cat {
    const uint32_t* narrow = nullptr;   // one value per present row (narrow form), or
    const uint64_t* values = nullptr;   // the values and
    const int64_t* offsets = nullptr;   // the row offsets, from 0 (wide form)
    const uint64_t* present = nullptr;  // narrow: bit r = row r has a value; null: all have one
    int64_t count = 0;                  // values
  };
  int64_t rows_ = 0, first_line_ = 0, bytes_ = 0;
  int num_dense_ = 0, num_cat_ = 0;
  int label_kind_ = 0;  // 0: no labels, 1: bytes (0/1), 2: floats
  const void* label_ = nullptr;
  const float* dense_ = nullptr;
  std::vector<Cat> cat_;
  std::shared_ptr<char> block_;
  std::unique_ptr<io::RawChunk> parsed_;  // keep_parsed(): the chunk itself
};

}  // namespace dlrec::etl
