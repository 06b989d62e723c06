// Shared by the test programs: the message of the error a call throws.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dlrec/core/error.h"

namespace dlrec::testing {

// The message of the dlrec::Error that fn throws, or "(no error)".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// fn throws a dlrec::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  const std::string e = error_of(fn);
  ASSERT_NE(e, "(no error)") << "no error; expected one with " << parts[0];
  for (const auto& p : parts)
    EXPECT_NE(e.find(p), std::string::npos) << "'" << p << "' not in: " << e;
}

}  // namespace dlrec::testing
