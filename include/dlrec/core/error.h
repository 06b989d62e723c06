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

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
