// Files: atomic writes, whole-file reads, checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dlrec {

// Writes a file atomically: data goes to "<path>.tmp.<pid>", is fsync'ed, then renamed over
// `path` (and the directory fsync'ed), so a crash leaves either the old file or the new one.
// Destroying an AtomicFile without commit() removes the temporary file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return bytes_; }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  uint64_t bytes_ = 0;
};

void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
uint64_t file_size(const std::string& path);
void make_dirs(const std::string& path);  // mkdir -p

// CRC-32C (Castagnoli), hardware-accelerated where the CPU has SSE4.2. Pass the previous
// value as `crc` to continue a running checksum.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace dlrec
