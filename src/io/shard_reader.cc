// ShardReader: opens a training shard (format: shard_format.h and docs/FORMATS.md), checks its
// header, footer and block index against the file, and decodes rows block by block, each block
// verified by its checksum before it is used.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "dlrec/core/config.h"
#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"
#include "shard_format.h"

namespace dlrec::io {

using namespace shard_format;

namespace {


// Loads n `width`-byte ids from p into out; false when one is not in [0, cardinality).
bool load_ids(const char* p, int64_t n, size_t width, int64_t cardinality, int64_t* out) {
  const uint64_t card = static_cast<uint64_t>(cardinality);
  uint64_t bad = 0;
  switch (width) {
    case 1:
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t v = static_cast<uint8_t>(p[i]);
        bad |= v >= card;
        out[i] = v;
      }
      break;
    case 2:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        bad |= v >= card;
        out[i] = v;
      }
      break;
    case 4:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        bad |= static_cast<uint64_t>(static_cast<int64_t>(v)) >= card;  // negative: huge
        out[i] = v;
      }
      break;
    default:
      if (n > 0) std::memcpy(out, p, static_cast<size_t>(n) * 8);  // (out may be null if 0)
      for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint64_t>(out[i]) >= card;
  }
  return bad == 0;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// ShardReader

struct ShardReader::Impl {
  std::string path, name;
  int fd = -1;
  uint64_t size = 0;
  uint32_t file_version = 0;  // the file's format version (the width of its ids)
  ShardLayout layout;
  int64_t rows = 0;
  std::vector<uint64_t> first_row;  // per block, plus total at the end
  std::vector<uint64_t> offset;     // per block, plus footer offset at the end
  // The last block read, verified: its payload and where each section starts.
  int64_t cached = -1;
  std::string block;
  std::vector<size_t> off_pos, ids_pos;  // per feature, byte positions inside `block`
  std::vector<int64_t> n_ids;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  void pread_all(void* dst, size_t n, uint64_t at, const std::string& what) const {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd, p, n, static_cast<off_t>(at));
      if (got < 0) {
        if (errno == EINTR) continue;
        fail("shard '", name, "': reading ", what, " failed: ", std::strerror(errno));
      }
      if (got == 0) fail("shard '", name, "': truncated file (", what, " is cut off)");
      p += got;
      n -= static_cast<size_t>(got);
      at += static_cast<uint64_t>(got);
    }
  }

  // The fewest payload bytes a row takes in a block: its label and dense values, one id per
  // one-hot feature, a row end per multi-hot feature. Bounds the rows an index may claim.
  uint64_t min_row_bytes() const {
    uint64_t r = 4 * (1 + static_cast<uint64_t>(layout.num_dense));
    for (size_t t = 0; t < layout.cardinalities.size(); ++t)
      r += layout.multi_hot[t] ? 4 : id_width(layout.cardinalities[t], file_version);
    return r;
  }

  void open() {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open shard '", path, "': ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) fail("cannot stat shard '", path, "': ", std::strerror(errno));
    size = static_cast<uint64_t>(st.st_size);
    const uint64_t header_end = read_header();
    read_footer(header_end);
  }

  // Reads and checks the header (magic, version, JSON length against the file, checksum, then
  // the layout); returns where the first block starts.
  uint64_t read_header() {
    char head[16];
    if (size < 16) {
      std::string got(size, '\0');
      if (size) pread_all(&got[0], size, 0, "header");
      if (got.compare(0, std::min<size_t>(8, size), std::string(kMagic, 8), 0,
                      std::min<size_t>(8, size)) != 0)
        fail("shard '", name, "': bad magic (not a dlrec shard)");
      fail("shard '", name, "': truncated file (", size, " bytes)");
    }
    pread_all(head, 16, 0, "header");
    if (std::memcmp(head, kMagic, 8) != 0) fail("shard '", name, "': bad magic (not a dlrec shard)");
    const uint32_t version = get_at<uint32_t>(head + 8);
    if (version != 1 && version != kVersion)
      fail("shard '", name, "': unsupported format version ", version, " (this build reads 1 "
           "and ", kVersion, ")");
    file_version = version;
    // The length is checked against the bytes present before anything is allocated for it.
    const uint32_t json_len = get_at<uint32_t>(head + 12);
    if (16 + uint64_t{json_len} + 4 + kTrailerBytes > size)
      fail("shard '", name, "': header length ", json_len, " (at offset 12) exceeds the file's ",
           size, " bytes (truncated or damaged file)");
    std::string hdr(16 + json_len + 4, '\0');
    pread_all(&hdr[0], hdr.size(), 0, "header");
    const uint32_t stored = get_at<uint32_t>(hdr.data() + 16 + json_len);
    const uint32_t computed = crc32c(hdr.data() + 8, 8 + json_len);
    if (stored != computed)
      fail("shard '", name, "' header: checksum mismatch (stored ", hex32(stored), ", computed ",
           hex32(computed), ")");
    const std::string what = "shard '" + name + "' header (JSON at offset 16)";
    const json h = parse_json(std::string_view(hdr).substr(16, json_len), what);
    try {
      if (!h.is_object() || !h.contains("layout")) fail("no layout");
      layout = ShardLayout::from_json(h.at("layout"));
    } catch (const Error& e) {
      fail(what, ": invalid layout: ", e.what());
    } catch (const json::exception& e) {
      fail(what, ": invalid layout: ", e.what());
    }
    return hdr.size();
  }

  // Reads and checks the trailer, the footer (its size against the file before it is read, its
  // checksum before it is used) and every block index entry against the bytes present.
  void read_footer(uint64_t header_end) {
    char tr[kTrailerBytes];
    pread_all(tr, kTrailerBytes, size - kTrailerBytes, "trailer");
    if (std::memcmp(tr + 16, kEndMagic, 8) != 0)
      fail("shard '", name, "': truncated file (no end marker; the writer did not finish)");
    const uint64_t footer_offset = get_at<uint64_t>(tr);
    const uint32_t footer_crc = get_at<uint32_t>(tr + 8);
    const std::string where = "shard '" + name + "' footer";
    if (footer_offset < header_end || footer_offset > size - kTrailerBytes ||
        size - kTrailerBytes - footer_offset < 16)
      fail(where, ": bad offset ", footer_offset, " (trailer at offset ", size - kTrailerBytes,
           ", blocks from offset ", header_end, ")");
    // 16 bytes per block; each block takes at least a block header's bytes before the footer.
    const uint64_t foot_bytes = size - kTrailerBytes - footer_offset;
    const uint64_t max_blocks = (footer_offset - header_end) / kBlockHeaderBytes;
    if ((foot_bytes - 16) % 16 != 0 || (foot_bytes - 16) / 16 > max_blocks)
      fail(where, " at offset ", footer_offset, ": ", foot_bytes, " bytes cannot index the ",
           footer_offset - header_end, " bytes of blocks before it");
    std::string foot(foot_bytes, '\0');
    pread_all(&foot[0], foot.size(), footer_offset, "footer");
    const uint32_t fc = crc32c(foot.data(), foot.size());
    if (fc != footer_crc)
      fail(where, ": checksum mismatch (stored ", hex32(footer_crc), ", computed ", hex32(fc),
           "; the footer at offset ", footer_offset, ")");
    const uint64_t nb = get_at<uint64_t>(foot.data());
    const uint64_t total = get_at<uint64_t>(foot.data() + 8);
    if (nb != (foot_bytes - 16) / 16)
      fail(where, " at offset ", footer_offset, ": ", nb, " blocks do not fit its ", foot_bytes,
           " bytes");
    first_row.resize(nb + 1);
    offset.resize(nb + 1);
    for (uint64_t b = 0; b < nb; ++b) {
      first_row[b] = get_at<uint64_t>(foot.data() + 16 + b * 16);
      offset[b] = get_at<uint64_t>(foot.data() + 24 + b * 16);
    }
    first_row[nb] = total;
    offset[nb] = footer_offset;
    if (nb == 0 && (total != 0 || footer_offset != header_end))
      fail(where, ": inconsistent empty shard");
    // Each block: starts where the previous ends, holds >= 1 row, and no more rows than its
    // bytes can hold (so that no row count from the index is trusted beyond the file).
    const uint64_t row_bytes = min_row_bytes();
    for (uint64_t b = 0; b < nb; ++b) {
      const uint64_t rows_b = first_row[b + 1] - first_row[b];
      const bool ok = (b > 0 || (first_row[0] == 0 && offset[0] == header_end)) &&
                      first_row[b + 1] > first_row[b] && offset[b + 1] > offset[b] &&
                      offset[b + 1] - offset[b] >= kBlockHeaderBytes &&
                      rows_b <= (offset[b + 1] - offset[b] - kBlockHeaderBytes) / row_bytes;
      if (!ok)
        fail(where, ": block ", b, " has an inconsistent index entry (rows [", first_row[b], ", ",
             first_row[b + 1], "), bytes [", offset[b], ", ", offset[b + 1], "))");
    }
    rows = static_cast<int64_t>(total);
  }

  // Reads block b into `block` and verifies it.
  void load_block(int64_t b) {
    if (cached == b) return;
    cached = -1;
    const uint64_t at = offset[b], len = offset[b + 1] - offset[b];
    const std::string where = "shard '" + name + "' block " + std::to_string(b);
    if (len < kBlockHeaderBytes) fail(where, ": corrupt index (", len, " bytes)");
    block.resize(len);
    pread_all(&block[0], len, at, "block " + std::to_string(b));
    const uint64_t n = get_at<uint64_t>(block.data());
    const uint64_t payload = get_at<uint64_t>(block.data() + 8);
    const uint32_t stored = get_at<uint32_t>(block.data() + 16);
    uint32_t computed = crc32c(block.data(), 16);
    if (payload == len - kBlockHeaderBytes)
      computed = crc32c(block.data() + kBlockHeaderBytes, payload, computed);
    if (stored != computed || payload != len - kBlockHeaderBytes)
      fail(where, ": checksum mismatch (stored ", hex32(stored), ", computed ", hex32(computed),
           "; the block at offset ", at, ")");
    if (n != first_row[b + 1] - first_row[b])
      fail(where, ": holds ", n, " rows, the index says ", first_row[b + 1] - first_row[b]);
    // Section positions; sizes are checked against the payload.
    const size_t nc = layout.cardinalities.size();
    off_pos.assign(nc, 0);
    ids_pos.assign(nc, 0);
    n_ids.assign(nc, 0);
    uint64_t pos = kBlockHeaderBytes + n * 4 + n * 4 * static_cast<uint64_t>(layout.num_dense);
    for (size_t t = 0; t < nc; ++t) {
      uint64_t count = n;
      if (layout.multi_hot[t]) {
        off_pos[t] = pos;
        if (pos + n * 4 > len) fail(where, ": payload too short");
        count = n ? get_at<uint32_t>(block.data() + pos + (n - 1) * 4) : 0;
        // Row ends never decrease (a row holds a non-negative number of ids); checksum-valid
        // ends that do are refused here rather than decoded as rows of negative length.
        uint32_t prev_end = 0;
        for (uint64_t r = 0; r < n; ++r) {
          const uint32_t e = get_at<uint32_t>(block.data() + pos + r * 4);
          if (e < prev_end)
            fail(where, ": feature ", t, " row ", first_row[b] + r, " ends at id ", e,
                 ", before the previous row's end ", prev_end);
          prev_end = e;
        }
        pos += n * 4;
      }
      ids_pos[t] = pos;
      n_ids[t] = static_cast<int64_t>(count);
      pos += count * id_width(layout.cardinalities[t], file_version);
      if (pos > len) fail(where, ": payload too short");
    }
    if (pos != len) fail(where, ": payload has ", len - pos, " unexpected trailing bytes");
    cached = b;
  }

  // Appends rows [lo, hi) of the cached block to `out`.
  void decode(int64_t lo, int64_t hi, Batch& out) const {
    const int64_t n = static_cast<int64_t>(first_row[cached + 1] - first_row[cached]);
    const int64_t k = hi - lo;
    const int nd = layout.num_dense;
    const char* p = block.data() + kBlockHeaderBytes;
    size_t old = out.labels.size();
    out.labels.resize(old + k);
    // (no copy of nothing: data() may be null, e.g. without dense features)
    if (k > 0) std::memcpy(out.labels.data() + old, p + lo * 4, k * 4);
    p += n * 4;
    old = out.dense.size();
    out.dense.resize(old + k * nd);
    if (k * nd > 0) std::memcpy(out.dense.data() + old, p + lo * nd * 4, k * nd * 4);
    for (size_t t = 0; t < layout.cardinalities.size(); ++t) {
      auto& ooff = out.cat_offsets[t];
      auto& oids = out.cat_indices[t];
      int64_t id_lo = lo, id_hi = hi;
      const int64_t base = ooff.back();
      if (layout.multi_hot[t]) {
        const char* ends = block.data() + off_pos[t];
        id_lo = lo ? get_at<uint32_t>(ends + (lo - 1) * 4) : 0;
        id_hi = hi ? get_at<uint32_t>(ends + (hi - 1) * 4) : 0;
        if (id_lo > id_hi || id_hi > n_ids[t])
          fail("shard '", name, "' block ", cached, ": bad offsets of feature ", t);
        for (int64_t r = lo; r < hi; ++r)
          ooff.push_back(base + get_at<uint32_t>(ends + r * 4) - id_lo);
      } else {
        for (int64_t r = 1; r <= k; ++r) ooff.push_back(base + r);
      }
      const int64_t m = id_hi - id_lo;
      const size_t at = oids.size();
      oids.resize(at + m);
      const int64_t card = layout.cardinalities[t];
      const size_t width = id_width(card, file_version);
      if (!load_ids(block.data() + ids_pos[t] + id_lo * width, m, width, card,
                    oids.data() + at))
        fail("shard '", name, "' block ", cached, ": id out of range in feature ", t);
    }
    out.rows += k;
  }
};

ShardReader::ShardReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->name = base_name(path);
  impl_->open();
}

ShardReader::~ShardReader() = default;

const ShardLayout& ShardReader::layout() const { return impl_->layout; }
int64_t ShardReader::rows() const { return impl_->rows; }

void ShardReader::read(int64_t begin, int64_t count, Batch& out) {
  Impl& m = *impl_;
  DLREC_CHECK(begin >= 0 && count >= 0 && begin + count <= m.rows, "shard '", m.name,
              "': read of rows [", begin, ", ", begin + count, ") outside [0, ", m.rows, ")");
  out.reset(m.layout.num_dense, static_cast<int>(m.layout.cardinalities.size()));
  int64_t row = begin;
  const int64_t end = begin + count;
  while (row < end) {
    const int64_t b = std::upper_bound(m.first_row.begin(), m.first_row.end() - 1,
                                       static_cast<uint64_t>(row)) -
                      m.first_row.begin() - 1;
    m.load_block(b);
    const int64_t lo = row - static_cast<int64_t>(m.first_row[b]);
    const int64_t hi = std::min<int64_t>(end, m.first_row[b + 1]) - m.first_row[b];
    m.decode(lo, hi, out);
    row += hi - lo;
  }
}

}  // namespace dlrec::io
