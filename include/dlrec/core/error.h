// dlrec::Error and the checking helpers used across the library.
//
// Inside the library, failures throw dlrec::Error whose message carries the context a user needs
// to act (file, line, column, key). The CLI prints the message on one line and exits non-zero;
// the server turns it into an error response for that request.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dlrec {

// The message is kept printable as a C string: a NUL byte (from a file name, a key or a line
// quoted in it) is written as the two characters "\0", so that what() and everything that
// prints it (the CLI, the server, Python) carry the whole message, not the part before the NUL.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(without_nul(message)) {}
  explicit Error(const char* message) : std::runtime_error(message) {}

 private:
  static std::string without_nul(const std::string& s) {
    if (s.find('\0') == std::string::npos) return s;
    std::string r;
    r.reserve(s.size() + 8);
    for (char c : s) {
      if (c == '\0')
        r += "\\0";
      else
        r += c;
    }
    return r;
  }
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws dlrec::Error with the arguments streamed into one message.
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace dlrec

// DLREC_CHECK(cond, parts...): throws dlrec::Error(parts...) when cond is false.
#define DLREC_CHECK(cond, ...)              \
  do {                                      \
    if (!(cond)) ::dlrec::fail(__VA_ARGS__); \
  } while (0)
