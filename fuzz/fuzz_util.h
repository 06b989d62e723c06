// Shared pieces of the fuzz targets (docs/FUZZING.md): the input as an in-memory file, a byte
// consumer for the few choices a target takes from its input, and the error policy.
//
// Error policy: dlrec::Error (and serve::RequestError, derived from it) is the expected outcome
// of bad input. std::bad_alloc is a finding (an input made the reader allocate beyond the
// fuzzer's limit). Any other exception escaping the library (a std::out_of_range from
// nlohmann's at(), a std::invalid_argument from stoi...) breaks the rule that every bad input
// gives a clear dlrec::Error; it is a finding only with --dlrec-strict-errors on the command
// line (libFuzzer passes flags starting with "--" through untouched), because several such
// escapes in code outside the parsers are known and reported (docs/FUZZING.md, "Findings").
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "dlrec/core/error.h"

namespace dlrec::fuzz {

// Set by LLVMFuzzerInitialize (fuzz_util.cc) from --dlrec-strict-errors.
extern bool g_strict_errors;

[[noreturn]] inline void finding(const char* target, const std::string& what) {
  std::fprintf(stderr, "==dlrec-fuzz== %s: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Runs fn(); classifies what it throws per the policy above. Returns true when fn returned.
template <class Fn>
bool guarded(const char* target, Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const dlrec::Error&) {
    return false;
  } catch (const std::bad_alloc&) {
    finding(target, "std::bad_alloc escaped (an input-driven allocation beyond the limit)");
  } catch (const std::exception& e) {
    if (g_strict_errors)
      finding(target, std::string("non-dlrec exception escaped: ") + e.what());
    return false;
  }
}

// The input as a file that has a path (readers that take paths open it by name): a memfd,
// reached through /proc/self/fd. Nothing touches the disk and nothing is left behind.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("dlrec-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) {
        std::perror("write(memfd)");
        std::abort();
      }
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Takes small choices from the front of the input; the rest is the payload.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{byte()} << (8 * i);
    return v;
  }
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  std::string_view rest() const { return {reinterpret_cast<const char*>(p_), n_}; }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace dlrec::fuzz
