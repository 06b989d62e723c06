// Tensor file layout (little-endian):
//   "DLRECTF1" | u32 version | u32 0 | u64 header_bytes | header JSON | pad to 64
//   | tensor payloads (each at its header "offset", 64-aligned) | u32 crc32c | "DLRECEND"
// The CRC covers every byte from the start of the file up to the CRC itself.
#include "dlrec/train/tensor_file.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include "dlrec/core/file_util.h"

namespace dlrec::train {

namespace {
constexpr char kMagic[8] = {'D', 'L', 'R', 'E', 'C', 'T', 'F', '1'};
constexpr char kEnd[8] = {'D', 'L', 'R', 'E', 'C', 'E', 'N', 'D'};
constexpr uint32_t kVersion = 1;
constexpr size_t kAlign = 64;
constexpr size_t kChunk = 16u << 20;

DType dtype_from_name(const std::string& s, const std::string& path) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8})
    if (s == dtype_name(t)) return t;
  fail("tensor file '", path, "': unknown dtype '", s, "'");
}

struct File {
  FILE* f;
  std::string path;
  explicit File(const std::string& p) : f(std::fopen(p.c_str(), "rb")), path(p) {
    if (!f) fail("cannot open tensor file '", p, "'");
  }
  ~File() { std::fclose(f); }
  void read(void* dst, size_t n, uint32_t* crc) {
    if (std::fread(dst, 1, n, f) != n) fail("tensor file '", path, "' is truncated");
    if (crc) *crc = crc32c(dst, n, *crc);
  }
};

struct Header {
  json meta;
  json tensors;
  uint64_t payload_start = 0;
  uint64_t payload_bytes = 0;
};

// Reads and checks the header; verifies the whole-file checksum by streaming once.
Header open_and_verify(const std::string& path) {
  uint64_t size = file_size(path);
  File f(path);
  uint32_t crc = 0;
  char magic[8];
  if (size < 32) fail("tensor file '", path, "' is truncated (", size, " bytes)");
  f.read(magic, 8, &crc);
  if (std::memcmp(magic, kMagic, 8) != 0) fail("'", path, "' is not a dlrec tensor file (bad magic)");
  uint32_t version, zero;
  uint64_t hlen;
  f.read(&version, 4, &crc);
  f.read(&zero, 4, &crc);
  f.read(&hlen, 8, &crc);
  if (version != kVersion)
    fail("tensor file '", path, "' has version ", version, "; this dlrec reads version ", kVersion);
  if (hlen > size) fail("tensor file '", path, "' is truncated (header)");
  std::string htext(hlen, '\0');
  f.read(htext.data(), hlen, &crc);
  Header h;
  try {
    json j = json::parse(htext);
    h.meta = j.at("meta");
    h.tensors = j.at("tensors");
    h.payload_bytes = j.at("payload_bytes").get<uint64_t>();
  } catch (const json::exception& e) {
    fail("tensor file '", path, "': corrupt header: ", e.what());
  }
  h.payload_start = (24 + hlen + kAlign - 1) / kAlign * kAlign;
  if (h.payload_start + h.payload_bytes + 12 != size)
    fail("tensor file '", path, "' is truncated or has trailing bytes (", size, " bytes, expected ",
         h.payload_start + h.payload_bytes + 12, ")");
  std::vector<char> buf(kChunk);
  uint64_t left = h.payload_start - 24 - hlen + h.payload_bytes;
  while (left > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(left, kChunk));
    f.read(buf.data(), n, &crc);
    left -= n;
  }
  uint32_t stored;
  char end[8];
  f.read(&stored, 4, nullptr);
  f.read(end, 8, nullptr);
  if (std::memcmp(end, kEnd, 8) != 0) fail("tensor file '", path, "' is truncated (no end marker)");
  if (stored != crc)
    fail("tensor file '", path, "': checksum mismatch (stored ", stored, ", computed ", crc, ")");
  return h;
}
}  // namespace

void save_tensors(const std::string& path, const std::vector<model::NamedTensor>& tensors,
                  const json& meta) {
  json index = json::array();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    index.push_back({{"name", name}, {"dtype", dtype_name(t.dtype())}, {"shape", t.shape()},
                     {"offset", offset}, {"bytes", t.nbytes()}});
    offset = (offset + t.nbytes() + kAlign - 1) / kAlign * kAlign;
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
  put(pad, (kAlign - (24 + hlen) % kAlign) % kAlign);
  uint64_t written = 0;
  for (const auto& [name, t] : tensors) {
    if (t.device().is_cuda()) {
      Tensor h = t.to(Device::cpu());
      put(h.raw(), h.nbytes());
    } else {
      put(t.raw(), t.nbytes());
    }
    written += t.nbytes();
    uint64_t aligned = (written + kAlign - 1) / kAlign * kAlign;
    put(pad, aligned - written);
    written = aligned;
  }
  out.write(&crc, 4);
  out.write(kEnd, 8);
  out.commit();
}

json read_tensor_meta(const std::string& path) { return open_and_verify(path).meta; }

json load_tensors(const std::string& path, const std::vector<model::NamedTensor>& targets,
                  bool allow_extra) {
  Header h = open_and_verify(path);
  std::map<std::string, const json*> by_name;
  for (const auto& e : h.tensors) by_name[e.at("name").get<std::string>()] = &e;
  if (!allow_extra && by_name.size() != targets.size()) {
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
    const json& e = *it->second;
    Shape shape = e.at("shape").get<Shape>();
    DType dt = dtype_from_name(e.at("dtype").get<std::string>(), path);
    if (shape != target.shape() || dt != target.dtype())
      fail("tensor file '", path, "': tensor '", name, "' is ", dtype_name(dt), shape_str(shape),
           ", the model expects ", dtype_name(target.dtype()), shape_str(target.shape()));
    uint64_t off = h.payload_start + e.at("offset").get<uint64_t>();
    if (std::fseek(f.f, static_cast<long>(off), SEEK_SET) != 0)
      fail("tensor file '", path, "': cannot seek to tensor '", name, "'");
    if (target.device().is_cuda()) {
      Tensor host = Tensor::empty(shape, dt, Device::cpu());
      f.read(host.raw(), host.nbytes(), nullptr);
      const_cast<Tensor&>(target).copy_from(host);
    } else {
      f.read(target.raw(), target.nbytes(), nullptr);
    }
  }
  return h.meta;
}

}  // namespace dlrec::train
