// dlrec::Error keeps the whole message printable as a C string.
#include "dlrec/core/error.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace dlrec {
namespace {

// A message with a NUL byte (a key or a line quoted from a file) was cut off at it by what()
// and by the CLI's printf: the rest, often the part that says what is wrong, was lost.
TEST(Error, NulByteIsKeptVisibleNotTruncating) {
  const std::string key("ke\0y", 4);
  try {
    fail("unknown key '", key, "' in 'run.json'");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown key 'ke\\0y' in 'run.json'");
    EXPECT_EQ(std::strlen(e.what()), std::string("unknown key 'ke\\0y' in 'run.json'").size());
  }
  EXPECT_STREQ(Error("plain").what(), "plain");
  EXPECT_STREQ(Error(std::string("a\0\0b", 4)).what(), "a\\0\\0b");
}

}  // namespace
}  // namespace dlrec
