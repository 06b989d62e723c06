// Files: atomic writes, whole-file reads, checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dlrec {

// Writes a file atomically: data goes to "<path>.tmp.<pid>", is fsync'ed, then renamed over
// `path` (and the directory fsync'ed), so a crash leaves either the old file or the new one.
// Destroying an AtomicFile without commit() removes the temporary file; one left by a killed
// process ("<path>.tmp.<pid>" of a pid that no longer runs) is removed by the next AtomicFile
// of the same path.
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

// ---- Temporaries of killed processes and whole-directory replacement ----
// Our temporary names end in ".tmp.<pid>" (or ".old.<pid>", see replace_dir); one whose pid
// is no live process was left by a killed run and may be removed. (A pid is only checked on
// this machine: do not share an output directory between hosts while both write to it.)

// True when a process with this pid exists (kill(pid, 0) succeeds or says EPERM).
bool process_alive(long pid);
// The pid of a name "<prefix><digits>" (nothing after the digits), else -1.
long pid_after(const std::string& name, const std::string& prefix);
// Removes the entries of `dir` named "<something><marker><pid>" whose pid is not alive
// (marker e.g. ".tmp."; a directory is removed with its contents). Returns their paths.
std::vector<std::string> remove_stale_temporaries(const std::string& dir,
                                                  const std::string& marker = ".tmp.");

// "<path>.tmp.<our pid>", `path` without trailing slashes: where a new version of the
// directory `path` is built before replace_dir puts it in place.
std::string staging_dir_for(const std::string& path);

// Puts the complete directory `staged` at `path`, so that `path` names a complete directory at
// every moment: renamed into place where `path` does not exist; else both swapped in one step
// (renameat2 RENAME_EXCHANGE) and the old one, now at `staged`, removed. Where the file system
// cannot swap (or `allow_swap` is false, for tests), the old one is renamed to
// "<path>.old.<pid>" first and removed after; recover_dir puts it back after a crash between
// the two renames.
void replace_dir(const std::string& staged, const std::string& path, bool allow_swap = true);

// Recovery before writing or reading `path` (a directory written by replace_dir): where `path`
// does not exist, a "<path>.old.<pid>" of a dead process is renamed back (the old version; the
// replacement was never completed); then every "<path>.tmp.<pid>" and "<path>.old.<pid>" of a
// dead process is removed. Returns one line per thing done (empty when there was nothing).
std::vector<std::string> recover_dir(const std::string& path);

// CRC-32C (Castagnoli), hardware-accelerated where the CPU has SSE4.2. Pass the previous
// value as `crc` to continue a running checksum.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace dlrec
