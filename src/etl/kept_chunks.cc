#include "dlrec/etl/kept_chunks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace dlrec::etl {
namespace {

constexpr size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }

// Whether a float is exactly 0.0f or 1.0f (bit patterns: -0.0f is not 0.0f here).
inline bool zero_or_one(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b == 0 || b == 0x3F800000u;
}

// A /proc or /sys file's text, or "" where it does not exist.
std::string read_if_there(const std::string& path) {
  return file_exists(path) ? read_file(path) : std::string();
}

// kRowsBefore[b][j]: the set bits among bits 0..j of byte b.
struct PrefixCounts {
  uint8_t v[256][8];
  constexpr PrefixCounts() : v() {
    for (int b = 0; b < 256; ++b) {
      int n = 0;
      for (int j = 0; j < 8; ++j) {
        n += (b >> j) & 1;
        v[b][j] = static_cast<uint8_t>(n);
      }
    }
  }
};
constexpr PrefixCounts kRowsBefore;

// o[0] = 0, o[r + 1] = o[r] + (bit r of `present`): the offsets of a column with at most one
// value per row. Eight rows per step from a table of the byte's prefix counts (the offsets of
// one step do not wait on each other), not one dependent add per row.
void offsets_from_bitmap(const uint64_t* present, int64_t rows, int64_t* o) {
  o[0] = 0;
  int64_t n = 0, r = 0;
  for (; r + 8 <= rows; r += 8) {
    const unsigned byte = static_cast<unsigned>(present[r >> 6] >> (r & 63)) & 0xFFu;
    const uint8_t* before = kRowsBefore.v[byte];
    for (int j = 0; j < 8; ++j) o[r + 1 + j] = n + before[j];
    n += before[7];
  }
  for (; r < rows; ++r) {
    n += static_cast<int64_t>((present[r >> 6] >> (r & 63)) & 1);
    o[r + 1] = n;
  }
}

}  // namespace

bool thp_madvise_allowed(const std::string& enabled) {
  return enabled.find("[always]") != std::string::npos ||
         enabled.find("[madvise]") != std::string::npos;
}

int64_t free_huge_block_bytes(const std::string& buddyinfo, int64_t page_bytes,
                              int64_t huge_bytes) {
  if (page_bytes <= 0 || huge_bytes <= 0) return -1;
  std::istringstream lines(buddyinfo);
  std::string line;
  int64_t total = 0;
  int zones = 0;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank
    // "Node <n>, zone <name> <count of order 0> <order 1> ..."
    std::istringstream in(line);
    std::string node, id, zone, name;
    if (!(in >> node >> id >> zone >> name) || node != "Node" || zone != "zone") return -1;
    int64_t count = 0;
    int order = 0;
    for (; in >> count; ++order) {
      if (count < 0 || order > 40) return -1;
      const int64_t block = page_bytes << order;
      if (block >= huge_bytes) total += count * block;
    }
    if (!in.eof() || order == 0) return -1;  // a token that is no count, or no counts
    ++zones;
  }
  return zones > 0 ? total : -1;
}

bool huge_pages_free_for(int64_t bytes) {
  if (!thp_madvise_allowed(read_if_there("/sys/kernel/mm/transparent_hugepage/enabled")))
    return false;
  int64_t huge =
      std::atoll(read_if_there("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").c_str());
  if (huge <= 0) huge = int64_t{2} << 20;
  const int64_t free = free_huge_block_bytes(read_if_there("/proc/buddyinfo"),
                                             ::sysconf(_SC_PAGESIZE), huge);
  return free >= 0 && free >= 2 * bytes;
}

std::shared_ptr<char> KeptArena::map_block(size_t size) const {
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    fail("etl: cannot map ", size >> 20, " MB for the kept input rows: ", std::strerror(errno));
  if (huge_) ::madvise(m, size, MADV_HUGEPAGE);
  // The first step's pages at once; alloc() faults in the rest a step ahead of use. Without
  // MADV_POPULATE_WRITE (an older kernel) they fault in as they are written.
  populate(static_cast<char*>(m), std::min(size, kPopulateStep));
  return std::shared_ptr<char>(static_cast<char*>(m), [size](char* p) { ::munmap(p, size); });
}

void KeptArena::populate(char* from, size_t bytes) { ::madvise(from, bytes, MADV_POPULATE_WRITE); }

char* KeptArena::alloc(size_t bytes, std::shared_ptr<char>& block) {
  bytes = round8(bytes);
  constexpr size_t kHuge = size_t{2} << 20;
  std::unique_lock<std::mutex> g(mu_);
  if (!cur_ || used_ + bytes > size_) {
    if (next_ && next_size_ >= bytes) {  // the block made ready ahead
      cur_ = std::move(next_);
      size_ = next_size_;
    } else {  // the first block, or a request larger than the next one
      size_ = std::max(grown_size(), (bytes + kHuge - 1) / kHuge * kHuge);
      cur_ = map_block(size_);
    }
    next_.reset();
    used_ = 0;
    populated_ = std::min(size_, kPopulateStep);
    mapped_ += static_cast<int64_t>(size_);
  }
  char* p = cur_.get() + used_;
  used_ += bytes;
  block = cur_;
  // Near the end of the pages faulted in, the caller faults in the next step, outside the
  // lock. A step at a time and not the whole block at once: the last block of a run is used
  // in part only, and zeroing its unused pages was CPU time for nothing (up to a block: an
  // eighth to a fifth of the kept input's pages on 1-4M Criteo rows).
  if (used_ + kPopulateStep / 2 > populated_ && populated_ < size_ && !populating_) {
    populating_ = true;
    const std::shared_ptr<char> cur = cur_;
    const size_t from = populated_, len = std::min(kPopulateStep, size_ - from);
    populated_ += len;  // claimed: no other thread populates these
    g.unlock();
    populate(cur.get() + from, len);
    g.lock();
    populating_ = false;
  }
  // Past half of the block, the caller maps the next one (and faults in its first step),
  // outside the lock, so that the others go on meanwhile.
  if (used_ > size_ / 2 && !next_ && !preparing_ && !last_) {
    preparing_ = true;
    const size_t size = grown_size();
    g.unlock();
    std::shared_ptr<char> ready;
    try {
      ready = map_block(size);
    } catch (...) {  // the next request maps its own block (and reports the error)
    }
    g.lock();
    next_ = std::move(ready);
    next_size_ = size;
    preparing_ = false;
  }
  return p;
}

size_t KeptArena::grown_size() const {
  return std::clamp(static_cast<size_t>(mapped_), size_t{2} << 20, std::max(block_, size_t{2} << 20));
}

void KeptArena::finish() {
  std::lock_guard<std::mutex> g(mu_);
  last_ = true;
  next_.reset();
}

KeptChunk KeptChunk::keep(const io::RawChunk& c, int64_t lo, int64_t hi, KeptArena& arena) {
  DLREC_CHECK(lo >= 0 && lo <= hi && hi <= c.rows, "KeptChunk::keep: rows [", lo, ", ", hi,
              ") of a chunk of ", c.rows);
  DLREC_CHECK(c.label.empty() || static_cast<int64_t>(c.label.size()) == c.rows,
              "KeptChunk::keep: ", c.label.size(), " labels for ", c.rows, " rows");
  const int nd = c.num_dense, nc = c.num_cat;
  const int64_t rows = hi - lo;
  KeptChunk k;
  k.rows_ = rows;
  k.first_line_ = c.first_line > 0 ? c.first_line + lo : 0;
  k.num_dense_ = nd;
  k.num_cat_ = nc;
  k.cat_.resize(nc);

  // Sizes first: which form each part takes.
  size_t bytes = 0;
  if (!c.label.empty()) {
    bool small = true;
    for (int64_t r = lo; r < hi && small; ++r) small = zero_or_one(c.label[r]);
    k.label_kind_ = small ? 1 : 2;
    bytes += round8(static_cast<size_t>(rows) * (small ? 1 : 4));
  }
  bytes += round8(static_cast<size_t>(rows * nd) * 4);
  // Each categorical column's offsets are read once: its presence bitmap goes to per-thread
  // scratch (copied into the arena below); that and a read-only pass over its values tell
  // whether the narrow form holds the column. The values are then cut to 32 bits straight
  // into the arena (not into scratch first and copied: one store per value, not two).
  const int64_t words = (rows + 63) / 64;
  const size_t bitmap_bytes = static_cast<size_t>(words) * 8;
  thread_local std::vector<std::vector<uint64_t>> bits_scratch;
  if (static_cast<int>(bits_scratch.size()) < nc) bits_scratch.resize(nc);
  std::vector<uint8_t> narrow(nc), all_present(nc);
  // The whole chunk, with what its parser knew (io::RawChunk::facts): a narrow column's bitmap
  // is the parser's and no pass over its offsets or values is needed.
  const io::RawChunk::CatFacts* facts = lo == 0 && hi == c.rows ? c.facts() : nullptr;
  for (int t = 0; t < nc; ++t) {
    const int64_t* off = c.cat_offsets[t].data() + lo;
    const uint64_t* val = c.cat_values[t].data() + off[0];
    const int64_t count = off[rows] - off[0];
    k.cat_[t].count = count;
    if (facts && ((facts->narrow >> t) & 1)) {
      narrow[t] = 1;
      all_present[t] = count == rows;
      bytes += round8(static_cast<size_t>(count) * 4) + (all_present[t] ? 0 : bitmap_bytes);
      continue;
    }
    auto& bits = bits_scratch[t];
    bits.resize(static_cast<size_t>(words));
    uint64_t over = 0;  // non-zero when a row holds more than one value
    for (int64_t w = 0; w < words; ++w) {
      const int64_t r0 = w * 64, r1 = std::min(rows, r0 + 64);
      uint64_t word = 0;
      for (int64_t r = r0; r < r1; ++r) {
        const uint64_t d = static_cast<uint64_t>(off[r + 1] - off[r]);
        over |= d >> 1;
        word |= static_cast<uint64_t>(d != 0) << (r - r0);
      }
      bits[w] = word;
    }
    bool fits = over == 0;
    if (fits) {  // a read-only pass (vectorized); the values are cut to 32 bits into the arena
      uint64_t high = 0;
      for (int64_t i = 0; i < count; ++i) high |= val[i];
      fits = (high >> 32) == 0;
    }
    narrow[t] = fits;
    all_present[t] = fits && count == rows;  // one value per row at most, so each has one
    if (narrow[t])
      bytes += round8(static_cast<size_t>(count) * 4) + (all_present[t] ? 0 : bitmap_bytes);
    else
      bytes += static_cast<size_t>(count) * 8 + static_cast<size_t>(rows + 1) * 8;
  }
  k.bytes_ = static_cast<int64_t>(std::max<size_t>(bytes, 8));
  char* p = arena.alloc(static_cast<size_t>(k.bytes_), k.block_);

  // Then the copies.
  if (k.label_kind_ == 1) {
    auto* l = reinterpret_cast<uint8_t*>(p);
    for (int64_t r = 0; r < rows; ++r) l[r] = c.label[lo + r] != 0.f;
    k.label_ = l;
    p += round8(static_cast<size_t>(rows));
  } else if (k.label_kind_ == 2) {
    std::memcpy(p, c.label.data() + lo, static_cast<size_t>(rows) * 4);
    k.label_ = p;
    p += round8(static_cast<size_t>(rows) * 4);
  }
  if (rows * nd > 0) std::memcpy(p, c.dense.data() + lo * nd, static_cast<size_t>(rows * nd) * 4);
  k.dense_ = reinterpret_cast<const float*>(p);
  p += round8(static_cast<size_t>(rows * nd) * 4);
  for (int t = 0; t < nc; ++t) {
    Cat& x = k.cat_[t];
    const int64_t* off = c.cat_offsets[t].data();
    const uint64_t* val = c.cat_values[t].data() + off[lo];
    if (narrow[t]) {
      auto* v32 = reinterpret_cast<uint32_t*>(p);
      for (int64_t i = 0; i < x.count; ++i) v32[i] = static_cast<uint32_t>(val[i]);
      x.narrow = v32;
      p += round8(static_cast<size_t>(x.count) * 4);
      if (!all_present[t]) {
        const bool known = facts && ((facts->narrow >> t) & 1);
        std::memcpy(p, known ? facts->present.data() + t * words : bits_scratch[t].data(),
                    bitmap_bytes);
        x.present = reinterpret_cast<const uint64_t*>(p);
        p += bitmap_bytes;
      }
    } else {
      auto* v = reinterpret_cast<uint64_t*>(p);
      if (x.count > 0) std::memcpy(v, val, static_cast<size_t>(x.count) * 8);
      p += static_cast<size_t>(x.count) * 8;
      auto* o = reinterpret_cast<int64_t*>(p);
      for (int64_t r = 0; r <= rows; ++r) o[r] = off[lo + r] - off[lo];
      p += static_cast<size_t>(rows + 1) * 8;
      x.values = v;
      x.offsets = o;
    }
  }
  return k;
}

KeptChunk KeptChunk::keep_parsed(io::RawChunk&& c) {
  KeptChunk k;
  k.rows_ = c.rows;
  k.num_dense_ = c.num_dense;
  k.num_cat_ = c.num_cat;
  int64_t b = static_cast<int64_t>(c.label.capacity() + c.dense.capacity()) * 4;
  for (const auto& v : c.cat_values) b += static_cast<int64_t>(v.capacity()) * 8;
  for (const auto& v : c.cat_offsets) b += static_cast<int64_t>(v.capacity()) * 8;
  k.bytes_ = b;
  k.parsed_ = std::make_unique<io::RawChunk>(std::move(c));
  c = io::RawChunk();
  return k;
}

void KeptChunk::unpack_move(io::RawChunk& out) {
  if (!parsed_) return unpack(out);
  std::swap(out, *parsed_);
  parsed_.reset();
}

void KeptChunk::unpack(io::RawChunk& out) const {
  if (parsed_) {
    out = *parsed_;
    return;
  }
  // Not out.reset(): that shrinks every offsets vector to one entry, and resizing them back
  // to rows + 1 zero-filled 8 bytes per row and column (memset, for values all written
  // below). Every part of `out` is assigned or fully written here instead.
  out.num_dense = num_dense_;
  out.num_cat = num_cat_;
  out.cat_values.resize(num_cat_);
  out.cat_offsets.resize(num_cat_);
  out.rows = rows_;
  out.first_line = first_line_;
  out.cat_facts.clear();
  if (label_kind_ == 0) out.label.clear();
  if (label_kind_ == 1) {
    const auto* l = static_cast<const uint8_t*>(label_);
    out.label.assign(l, l + rows_);  // 0 -> 0.0f, 1 -> 1.0f
  } else if (label_kind_ == 2) {
    const auto* l = static_cast<const float*>(label_);
    out.label.assign(l, l + rows_);
  }
  out.dense.assign(dense_, dense_ + rows_ * num_dense_);
  for (int t = 0; t < num_cat_; ++t) {
    const Cat& x = cat_[t];
    auto& vals = out.cat_values[t];
    auto& off = out.cat_offsets[t];
    if (x.narrow) {
      vals.assign(x.narrow, x.narrow + x.count);
      off.resize(static_cast<size_t>(rows_ + 1));
      int64_t* o = off.data();
      if (!x.present) {
        for (int64_t r = 0; r <= rows_; ++r) o[r] = r;
      } else {
        offsets_from_bitmap(x.present, rows_, o);
      }
    } else {
      vals.assign(x.values, x.values + x.count);
      off.assign(x.offsets, x.offsets + rows_ + 1);
    }
  }
}

}  // namespace dlrec::etl
