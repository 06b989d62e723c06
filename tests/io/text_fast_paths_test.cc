// The text parser's fast paths against the digit-by-digit loops and the general parser:
// hex8 and digits8 (SWAR / SSE2 on 8 bytes) and LineParser::parse_plain / parse_fast.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dlrec/io/text_reader.h"
#include "../src/io/text_line_parser.h"

namespace dlrec::io {
namespace {

// hex8 (the SWAR fast path for Criteo's 8-digit keys) agrees with the digit-by-digit table for
// every byte value at every position, and for random mixes of hex and other bytes.
TEST(TextParse, Hex8MatchesTheDigitTable) {
  auto expected = [](const char* p, uint64_t& v) {
    v = 0;
    for (int i = 0; i < 8; ++i) {
      const unsigned d = text_detail::kHex.v[static_cast<unsigned char>(p[i])];
      if (d == 0xFF) return false;
      v = (v << 4) | d;
    }
    return true;
  };
  auto check = [&](const char* p) {
    uint64_t want = 0, got = 0;
    const bool ok = expected(p, want);
    ASSERT_EQ(text_detail::hex8(p, got), ok) << std::string(p, 8);
    if (ok) {
      ASSERT_EQ(got, want) << std::string(p, 8);
    }
  };
  int accepted = 0;
  for (int pos = 0; pos < 8; ++pos) {
    for (int b = 0; b < 256; ++b) {
      char s[8] = {'0', '9', 'a', 'f', 'A', 'F', '7', 'c'};
      s[pos] = static_cast<char>(b);
      check(s);
      uint64_t v;
      accepted += text_detail::hex8(s, v);
    }
  }
  EXPECT_EQ(accepted, 8 * 22);  // 0-9, a-f, A-F at each position
  const char pool[] = "0123456789abcdefABCDEFgG/:@`\x00\x7f\x80\xc6\xe6 \t\"";
  uint64_t state = 12345;
  for (int n = 0; n < 200000; ++n) {
    char s[8];
    for (char& c : s) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      c = pool[(state >> 33) % (sizeof(pool) - 1)];
    }
    check(s);
  }
}

// digits8 (the SWAR fast path for dense values) agrees with the digit-by-digit loop: the count
// of leading decimal digits (8 when all are) and their value, for every byte value at every
// position after every run of digits, all-digit words (99999999, 00000000, ...) and random
// mixes of digits and the bytes around them.
TEST(TextParse, Digits8MatchesTheDigitLoop) {
  auto check = [](const char* p) {
    int want_k = 0;
    uint64_t want = 0;
    while (want_k < 8 && static_cast<unsigned>(p[want_k] - '0') < 10u)
      want = want * 10 + static_cast<unsigned>(p[want_k++] - '0');
    uint64_t got = 0;
    ASSERT_EQ(text_detail::digits8(p, got), want_k) << std::string(p, 8);
    if (want_k > 0) {
      ASSERT_EQ(got, want) << std::string(p, 8);
    }
  };
  const char digits[] = "93750812";
  for (int run = 0; run < 8; ++run)
    for (int b = 0; b < 256; ++b) {
      char s[8];
      std::memcpy(s, digits, 8);
      s[run] = static_cast<char>(b);
      for (int j = run + 1; j < 8; ++j) s[j] = static_cast<char>((b * 7 + j) & 0xFF);
      check(s);
    }
  for (const char* w : {"99999999", "00000000", "10000000", "00000001", "12345678"}) check(w);
  const char pool[] = "0123456789/:\t -+.e\x00\x80\xb0\xff";
  uint64_t state = 777;
  int full = 0;
  for (int n = 0; n < 200000; ++n) {
    char s[8];
    for (char& c : s) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      // Mostly digits, so that long runs come up too.
      const uint64_t r = state >> 33;
      c = r % 4 != 0 ? static_cast<char>('0' + r / 4 % 10) : pool[r / 4 % (sizeof(pool) - 1)];
    }
    check(s);
    uint64_t v;
    full += text_detail::digits8(s, v) == 8;
  }
  EXPECT_GT(full, 1000);
}

// The fast paths (parse_plain for the plain Criteo layout, parse_fast for the others) accept
// the lines the general parser accepts, with the same values, line by line: dense values of 0
// to 21 digits, signs, decimals and bad text (8 digits at a time where 8 bytes are left in the
// line, digit by digit after); keys of 8 digits (either case), shorter, wide (9-16 digits), too
// long, bad or quoted; labels other than 0/1; a field missing or one too many. Layouts: Criteo,
// a small plain one, and one whose dense fields come last (the last value within 8 bytes of
// the line's end; not plain).
TEST(TextParse, FastPathsMatchTheGeneralParser) {
  uint64_t state = 4242;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  auto digits = [&](int n, const char* set, int set_size) {
    std::string v;
    for (int i = 0; i < n; ++i) v += set[next() % set_size];
    return v;
  };
  auto dense = [&] {
    const uint64_t kind = next() % 20;
    if (kind == 0) return std::string();
    if (kind == 1) return std::string(next() % 2 ? "2.5" : "-0");
    if (kind == 2) return std::string(next() % 2 ? "12a" : next() % 2 ? "-" : "1-2");
    std::string v = next() % 5 == 0 ? (next() % 2 ? "-" : "+") : "";
    return v + digits(1 + static_cast<int>(next() % (kind == 3 ? 21 : 9)), "0123456789", 10);
  };
  auto key = [&] {
    const uint64_t kind = next() % 24;
    if (kind < 6) return std::string();
    if (kind == 6) return digits(1 + static_cast<int>(next() % 7), "0123456789abcdef", 16);
    if (kind == 7) return digits(9 + static_cast<int>(next() % 9), "0123456789abcdef", 16);
    if (kind == 8) return std::string(next() % 2 ? "zz" : next() % 2 ? "0a1b2c3g" : "\"0a1b2c3d\"");
    if (kind == 9) return digits(8, "0123456789ABCDEF", 16);
    return digits(8, "0123456789abcdef", 16);
  };
  Schema last = Schema::criteo(3, 2);  // label, C1, C2, I1, I2, I3
  std::rotate(last.columns.begin() + 1, last.columns.begin() + 4, last.columns.end());
  for (const Schema& s : {Schema::criteo(), Schema::criteo(2, 3), last}) {
    const std::vector<int> map = field_mapping(s, "", "x");
    text_detail::LineParser parser(s, map);
    ASSERT_TRUE(parser.deferred_offsets());
    int fast = 0, failed = 0;
    for (int i = 0; i < 6000; ++i) {
      std::string line = next() % 40 == 0 ? "2" : next() % 2 ? "1" : "0";
      for (const auto& c : s.columns) {
        if (c.kind == ColumnKind::Label) continue;
        line += "\t";
        line += c.kind == ColumnKind::Dense ? dense() : key();
      }
      if (next() % 30 == 0) line = line.substr(0, line.rfind('\t'));  // a field short
      if (next() % 30 == 0) line += next() % 2 ? "\t" : "\t5";        // one too many
      RawChunk a, b;
      a.reset(s.num_dense(), s.num_cat());
      b.reset(s.num_dense(), s.num_cat());
      text_detail::LineParser::Scratch scratch;
      text_detail::LineError err;
      const char* e = line.data() + line.size();
      const bool ok_a = parser.parse(line.data(), e, a, scratch, err);
      parser.finish(a, scratch);
      fast += a.facts() != nullptr;  // the line took a fast path
      const bool ok_b = parser.parse_general(line.data(), e, b, scratch, err);
      ASSERT_EQ(ok_a, ok_b) << line;
      failed += !ok_a;
      if (!ok_a) continue;
      ASSERT_EQ(a.dense.size(), b.dense.size());
      ASSERT_EQ(std::memcmp(a.dense.data(), b.dense.data(), a.dense.size() * 4), 0) << line;
      EXPECT_EQ(a.label, b.label) << line;
      EXPECT_EQ(a.cat_values, b.cat_values) << line;
      EXPECT_EQ(a.cat_offsets, b.cat_offsets) << line;
    }
    EXPECT_GT(fast, 300) << s.columns.size();
    EXPECT_GT(failed, 300) << s.columns.size();
  }
}

}  // namespace
}  // namespace dlrec::io
