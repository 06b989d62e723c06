// Tensor file layout (little-endian):
//   "DLRECTF1" | u32 version | u32 0 | u64 header_bytes | header JSON | pad to 64
//   | tensor payloads (each at its header "offset", 64-aligned) | u32 crc32c | "DLRECEND"
// The CRC covers every byte from the start of the file up to the CRC itself.
//
// Reading trusts nothing in the file before it is checked: the header length is checked
// against the file's size before anything is allocated for it, the checksum of the whole file
// is verified before the header is parsed, and every tensor's extent is checked against the
// payload before a byte of it is read (docs/FORMATS.md, "Tensor files").
#include "dlrec/io/tensor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>

#include "dlrec/core/file_util.h"

namespace dlrec::io {

namespace {
constexpr char kMagic[8] = {'D', 'L', 'R', 'E', 'C', 'T', 'F', '1'};
constexpr char kEnd[8] = {'D', 'L', 'R', 'E', 'C', 'E', 'N', 'D'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kPrefixBytes = 24;  // magic, version, 0, header length
constexpr uint64_t kSuffixBytes = 12;  // crc, end marker
constexpr uint64_t kAlign = 64;
constexpr uint64_t kChunk = 16u << 20;

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

struct File {
  int fd = -1;
  std::string path;
  explicit File(const std::string& p) : path(p) {
    fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open tensor file '", p, "': ", std::strerror(errno));
  }
  ~File() { ::close(fd); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  // Reads exactly n bytes at offset `at`; `what` names the part in errors.
  void read(void* dst, uint64_t n, uint64_t at, const char* what) const {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got =
          ::pread(fd, p, static_cast<size_t>(std::min(n, kChunk)), static_cast<off_t>(at));
      if (got < 0) {
        if (errno == EINTR) continue;
        fail("tensor file '", path, "': reading ", what, " at offset ", at,
             " failed: ", std::strerror(errno));
      }
      if (got == 0)
        fail("tensor file '", path, "' is truncated (", what, " is cut off at offset ", at, ")");
      p += got;
      n -= static_cast<uint64_t>(got);
      at += static_cast<uint64_t>(got);
    }
  }
};

DType dtype_from_name(const std::string& s) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8})
    if (s == dtype_name(t)) return t;
  fail("unknown dtype '", s, "'");
}

// One tensor of the header, checked against the payload.
struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0, bytes = 0;
};

struct Header {
  json meta;
  std::vector<Entry> tensors;
  uint64_t payload_start = 0;
  uint64_t payload_bytes = 0;
};

// Reads tensors[i] of the header; `where` names it in errors.
Entry parse_entry(const json& e, uint64_t payload_bytes, const std::string& where) {
  ConfigReader r(e, where);
  Entry t;
  t.name = r.require<std::string>("name");
  if (t.name.empty()) fail(where, ": empty tensor name");
  t.dtype = dtype_from_name(r.require<std::string>("dtype"));
  t.shape = r.require<Shape>("shape");
  t.offset = r.require<uint64_t>("offset");
  t.bytes = r.require<uint64_t>("bytes");
  r.finish();
  // The element count, checked for overflow against the bytes the payload can hold.
  uint64_t elems = 1;
  for (int64_t d : t.shape) {
    if (d < 0) fail(where, " ('", t.name, "'): negative dimension in shape ", shape_str(t.shape));
    if (d > 0 && elems > payload_bytes / static_cast<uint64_t>(d))
      fail(where, " ('", t.name, "'): shape ", shape_str(t.shape), " is larger than the ",
           payload_bytes, "-byte payload");
    elems *= static_cast<uint64_t>(d);
  }
  if (elems > payload_bytes || elems * dtype_size(t.dtype) != t.bytes)
    fail(where, " ('", t.name, "'): ", t.bytes, " bytes for ", dtype_name(t.dtype),
         shape_str(t.shape), " (", elems, " elements)");
  if (t.offset % kAlign != 0)
    fail(where, " ('", t.name, "'): offset ", t.offset, " is not a multiple of ", kAlign);
  if (t.offset > payload_bytes || t.bytes > payload_bytes - t.offset)
    fail(where, " ('", t.name, "'): bytes [", t.offset, ", ", t.offset + t.bytes,
         ") lie outside the ", payload_bytes, "-byte payload");
  return t;
}

// Checks the header's structure and every tensor's extent (no name twice, no overlap).
Header parse_header(const std::string& htext, uint64_t size, const std::string& path) {
  const std::string what = "tensor file '" + path + "' header";
  const json j = parse_json(htext, what);
  Header h;
  try {
    if (!j.is_object()) fail("is not a JSON object");
    ConfigReader r(j, "");
    h.meta = r.raw("meta");
    const json& tensors = r.raw("tensors");
    h.payload_bytes = r.require<uint64_t>("payload_bytes");
    r.finish();
    if (!tensors.is_array()) fail("'tensors' is not an array");
    h.payload_start = align_up(kPrefixBytes + htext.size());
    if (h.payload_bytes > size || h.payload_start + h.payload_bytes + kSuffixBytes != size)
      fail("payload_bytes ", h.payload_bytes, " does not match the file's ", size,
           " bytes (expected ", size - std::min(size, h.payload_start + kSuffixBytes), ")");
    std::map<std::string, size_t> names;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string where = "tensors[" + std::to_string(i) + "]";
      h.tensors.push_back(parse_entry(tensors[i], h.payload_bytes, where));
      auto [it, fresh] = names.emplace(h.tensors.back().name, i);
      if (!fresh)
        fail(where, ": tensor '", it->first, "' appears twice (also tensors[", it->second, "])");
    }
    // No two tensors share a byte (empty tensors share none).
    std::vector<size_t> order(h.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const Entry &x = h.tensors[a], &y = h.tensors[b];
      return x.offset != y.offset ? x.offset < y.offset : x.bytes < y.bytes;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const Entry& prev = h.tensors[order[k - 1]];
      const Entry& cur = h.tensors[order[k]];
      if (prev.bytes > 0 && cur.offset < prev.offset + prev.bytes)
        fail("tensors[", order[k], "] ('", cur.name, "') at offset ", cur.offset,
             " overlaps tensors[", order[k - 1], "] ('", prev.name, "', bytes [", prev.offset, ", ",
             prev.offset + prev.bytes, "))");
    }
  } catch (const Error& e) {
    fail(what, ": ", e.what());
  } catch (const json::exception& e) {
    fail(what, ": ", e.what());
  }
  return h;
}

// Verifies the whole file (size, magic, version, end marker, checksum) and then its header.
Header open_and_verify(const std::string& path) {
  File f(path);
  const uint64_t size = file_size(path);
  if (size < kPrefixBytes + kSuffixBytes)
    fail("tensor file '", path, "' is truncated (", size, " bytes)");
  char prefix[kPrefixBytes];
  f.read(prefix, kPrefixBytes, 0, "the header");
  if (std::memcmp(prefix, kMagic, 8) != 0)
    fail("'", path, "' is not a dlrec tensor file (bad magic)");
  uint32_t version;
  uint64_t hlen;
  std::memcpy(&version, prefix + 8, 4);
  std::memcpy(&hlen, prefix + 16, 8);
  if (version != kVersion)
    fail("tensor file '", path, "' has version ", version, "; this dlrec reads version ", kVersion);
  // The header length is checked against the bytes present before anything is allocated.
  if (hlen > size - kPrefixBytes - kSuffixBytes)
    fail("tensor file '", path, "': header length ", hlen, " (at offset 16) exceeds the file's ",
         size, " bytes");
  char suffix[kSuffixBytes];
  f.read(suffix, kSuffixBytes, size - kSuffixBytes, "the end marker");
  if (std::memcmp(suffix + 4, kEnd, 8) != 0)
    fail("tensor file '", path, "' is truncated (no end marker at offset ", size - 8, ")");
  // The checksum, streamed over everything before it; the header text is kept on the way.
  std::string htext(hlen, '\0');
  uint32_t crc = crc32c(prefix, kPrefixBytes);
  f.read(htext.data(), hlen, kPrefixBytes, "the header");
  crc = crc32c(htext.data(), hlen, crc);
  const uint64_t rest_end = size - kSuffixBytes;
  std::vector<char> buf(static_cast<size_t>(std::min(kChunk, rest_end)));
  for (uint64_t at = kPrefixBytes + hlen; at < rest_end;) {
    const uint64_t n = std::min<uint64_t>(rest_end - at, buf.size());
    f.read(buf.data(), n, at, "the payload");
    crc = crc32c(buf.data(), n, crc);
    at += n;
  }
  uint32_t stored;
  std::memcpy(&stored, suffix, 4);
  if (stored != crc)
    fail("tensor file '", path, "': checksum mismatch (stored ", stored, ", computed ", crc,
         "; the file is damaged)");
  return parse_header(htext, size, path);
}

// Index of the first non-finite element of a floating-point buffer, or -1.
int64_t first_non_finite(const void* data, DType dt, int64_t n) {
  if (dt == DType::F32) {
    const float* p = static_cast<const float*>(data);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) return i;
  } else if (dt == DType::F16 || dt == DType::BF16) {
    const uint16_t exp_mask = dt == DType::F16 ? 0x7c00 : 0x7f80;  // all ones: inf or NaN
    const uint16_t* p = static_cast<const uint16_t*>(data);
    for (int64_t i = 0; i < n; ++i)
      if ((p[i] & exp_mask) == exp_mask) return i;
  }
  return -1;
}
}  // namespace

void save_tensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                  const json& meta) {
  json index = json::array();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    index.push_back({{"name", name},
                     {"dtype", dtype_name(t.dtype())},
                     {"shape", t.shape()},
                     {"offset", offset},
                     {"bytes", t.nbytes()}});
    offset = align_up(offset + t.nbytes());
  }
  json header = {{"meta", meta}, {"tensors", index}, {"payload_bytes", offset}};
  std::string htext = header.dump();
  uint64_t hlen = htext.size();

  AtomicFile out(path);
  uint32_t crc = 0;
  auto put = [&](const void* p, size_t n) {
    out.write(p, n);
    crc = crc32c(p, n, crc);
  };
  uint32_t version = kVersion, zero = 0;
  put(kMagic, 8);
  put(&version, 4);
  put(&zero, 4);
  put(&hlen, 8);
  put(htext.data(), hlen);
  static const char pad[kAlign] = {};
  put(pad, (kAlign - (kPrefixBytes + hlen) % kAlign) % kAlign);
  uint64_t written = 0;
  for (const auto& [name, t] : tensors) {
    if (t.device().is_cuda()) {
      Tensor h = t.to(Device::cpu());
      put(h.raw(), h.nbytes());
    } else {
      put(t.raw(), t.nbytes());
    }
    written += t.nbytes();
    uint64_t aligned = align_up(written);
    put(pad, aligned - written);
    written = aligned;
  }
  out.write(&crc, 4);
  out.write(kEnd, 8);
  out.commit();
}

json read_tensor_meta(const std::string& path) { return open_and_verify(path).meta; }

json load_tensors(const std::string& path, const std::vector<NamedTensor>& targets,
                  const TensorLoadOptions& options) {
  Header h = open_and_verify(path);
  std::map<std::string, const Entry*> by_name;
  for (const auto& e : h.tensors) by_name[e.name] = &e;
  if (!options.allow_extra) {
    for (const auto& kv : by_name) {
      bool wanted = false;
      for (const auto& t : targets) wanted |= t.first == kv.first;
      if (!wanted) fail("tensor file '", path, "' has tensor '", kv.first, "' the model does not");
    }
  }
  File f(path);
  for (const auto& [name, target] : targets) {
    auto it = by_name.find(name);
    if (it == by_name.end()) fail("tensor file '", path, "' lacks tensor '", name, "'");
    const Entry& e = *it->second;
    if (e.shape != target.shape() || e.dtype != target.dtype())
      fail("tensor file '", path, "': tensor '", name, "' is ", dtype_name(e.dtype),
           shape_str(e.shape), ", the model expects ", dtype_name(target.dtype()),
           shape_str(target.shape()));
    const uint64_t at = h.payload_start + e.offset;
    const std::string what = "tensor '" + name + "'";
    Tensor host =
        target.device().is_cuda() ? Tensor::empty(e.shape, e.dtype, Device::cpu()) : target;
    f.read(host.raw(), e.bytes, at, what.c_str());
    if (options.require_finite) {
      const int64_t bad = first_non_finite(host.raw(), e.dtype, host.numel());
      if (bad >= 0)
        fail("tensor file '", path, "': tensor '", name,
             "' holds a non-finite value (NaN or "
             "infinity) at element ",
             bad, "; the model cannot be used");
    }
    if (target.device().is_cuda()) const_cast<Tensor&>(target).copy_from(host);
  }
  return h.meta;
}

}  // namespace dlrec::io
