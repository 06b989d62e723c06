#include "dlrec/core/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dlrec/core/error.h"

namespace dlrec {

namespace {
std::string dir_of(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? "." : (p == 0 ? "/" : path.substr(0, p));
}
void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
std::string base_of(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}
std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}
// The names in `dir` (none when it cannot be read).
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (const dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  return names;
}
bool stale_pid(long pid) { return pid > 0 && pid != ::getpid() && !process_alive(pid); }
}  // namespace

bool process_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

long pid_after(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 10 ||
      name.compare(0, prefix.size(), prefix) != 0)
    return -1;
  long pid = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir,
                                                  const std::string& marker) {
  std::vector<std::string> removed;
  for (const std::string& n : list_dir(dir)) {
    const size_t at = n.rfind(marker);
    if (at == std::string::npos || at == 0) continue;
    if (!stale_pid(pid_after(n, n.substr(0, at + marker.size())))) continue;
    const std::string p = dir + "/" + n;
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
    if (!ec) removed.push_back(p);
  }
  return removed;
}

std::string staging_dir_for(const std::string& path) {
  return without_trailing_slashes(path) + ".tmp." + std::to_string(::getpid());
}

void replace_dir(const std::string& staged, const std::string& path_in, bool allow_swap) {
  namespace fs = std::filesystem;
  const std::string path = without_trailing_slashes(path_in);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    if (::rename(staged.c_str(), path.c_str()) != 0)
      fail("cannot rename '", staged, "' to '", path, "': ", std::strerror(errno));
    fsync_dir(dir_of(path));
    return;
  }
#if defined(SYS_renameat2)
  if (allow_swap) {
    constexpr unsigned kRenameExchange = 1u << 1;  // RENAME_EXCHANGE of <linux/fs.h>
    if (::syscall(SYS_renameat2, AT_FDCWD, staged.c_str(), AT_FDCWD, path.c_str(),
                  kRenameExchange) == 0) {
      fsync_dir(dir_of(path));
      fs::remove_all(staged, ec);  // the old version
      if (ec) fail("cannot remove the old '", path, "' (now at '", staged, "'): ", ec.message());
      return;
    }
    // EINVAL / ENOSYS / EOPNOTSUPP: the file system (or kernel) cannot swap; two renames.
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
      fail("cannot swap '", staged, "' with '", path, "': ", std::strerror(errno));
  }
#endif
  const std::string old = path + ".old." + std::to_string(::getpid());
  if (::rename(path.c_str(), old.c_str()) != 0)
    fail("cannot rename '", path, "' to '", old, "': ", std::strerror(errno));
  if (::rename(staged.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::rename(old.c_str(), path.c_str());  // put the old one back
    fail("cannot rename '", staged, "' to '", path, "': ", std::strerror(err));
  }
  fsync_dir(dir_of(path));
  fs::remove_all(old, ec);
  if (ec) fail("cannot remove the old '", path, "' (now at '", old, "'): ", ec.message());
}

std::vector<std::string> recover_dir(const std::string& path_in) {
  namespace fs = std::filesystem;
  const std::string path = without_trailing_slashes(path_in);
  const std::string parent = dir_of(path), base = base_of(path);
  std::vector<std::string> done;
  std::vector<std::string> stale;  // dead ".tmp.<pid>" and ".old.<pid>" of `path`
  std::string newest_old;
  int64_t newest_time = -1;
  for (const std::string& n : list_dir(parent)) {
    const bool is_old = stale_pid(pid_after(n, base + ".old."));
    if (!is_old && !stale_pid(pid_after(n, base + ".tmp."))) continue;
    const std::string p = parent + "/" + n;
    stale.push_back(p);
    struct stat st;
    if (is_old && ::stat(p.c_str(), &st) == 0 && st.st_mtime > newest_time) {
      newest_time = st.st_mtime;
      newest_old = p;
    }
  }
  std::error_code ec;
  if (!newest_old.empty() && !fs::exists(fs::symlink_status(path, ec))) {
    if (::rename(newest_old.c_str(), path.c_str()) != 0)
      fail("'", path, "' is missing and its previous version '", newest_old,
           "' (left by a killed replacement) cannot be renamed back: ", std::strerror(errno));
    fsync_dir(parent);
    done.push_back("restored '" + path + "' from '" + newest_old +
                   "' (a replacement was killed before it completed)");
  }
  for (const std::string& p : stale) {
    if (p == newest_old && !fs::exists(fs::symlink_status(p, ec))) continue;  // renamed back
    fs::remove_all(p, ec);
    if (!ec) done.push_back("removed '" + p + "' (left by a killed process)");
  }
  return done;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // A temporary of the same path left by a killed process (".tmp.<dead pid>") goes first.
  {
    const std::string dir = dir_of(path_), prefix = base_of(path_) + ".tmp.";
    for (const std::string& n : list_dir(dir))
      if (stale_pid(pid_after(n, prefix))) std::remove((dir + "/" + n).c_str());
  }
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) fail("cannot create '", tmp_, "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  DLREC_CHECK(f_, "write to closed file '", path_, "'");
  if (bytes && std::fwrite(data, 1, bytes, f_) != bytes)
    fail("write to '", tmp_, "' failed: ", std::strerror(errno));
  bytes_ += bytes;
}

void AtomicFile::commit() {
  DLREC_CHECK(f_, "commit of closed file '", path_, "'");
  bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
  int err = errno;
  std::fclose(f_);
  f_ = nullptr;
  if (!ok) {
    std::remove(tmp_.c_str());
    fail("flushing '", tmp_, "' failed: ", std::strerror(err));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    err = errno;
    std::remove(tmp_.c_str());
    fail("renaming '", tmp_, "' to '", path_, "' failed: ", std::strerror(err));
  }
  fsync_dir(dir_of(path_));
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail("cannot stat '", path, "': ", std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      fail("cannot create directory '", cur, "': ", std::strerror(errno));
  }
}

// ---- CRC-32C ----
namespace {
struct Crc32cTable {
  uint32_t t[8][256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};

uint32_t crc32c_sw(const uint8_t* p, size_t n, uint32_t crc) {
  static const Crc32cTable tab;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = tab.t[7][v & 0xFF] ^ tab.t[6][(v >> 8) & 0xFF] ^ tab.t[5][(v >> 16) & 0xFF] ^
          tab.t[4][(v >> 24) & 0xFF] ^ tab.t[3][(v >> 32) & 0xFF] ^ tab.t[2][(v >> 40) & 0xFF] ^
          tab.t[1][(v >> 48) & 0xFF] ^ tab.t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ tab.t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif
}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  crc = hw ? crc32c_hw(p, bytes, crc) : crc32c_sw(p, bytes, crc);
#else
  crc = crc32c_sw(p, bytes, crc);
#endif
  return ~crc;
}

}  // namespace dlrec
