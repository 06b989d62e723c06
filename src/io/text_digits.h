// Private to the text parser (text_line_parser.h): the digits of 8 bytes at once, hex keys
// (hex8) and decimal values (digits8), by SWAR bit tricks on a 64-bit word (and SSE2 byte
// compares where the target has them).
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace dlrec::io::text_detail {

// SWAR helpers on 8 bytes (little-endian): high bit of each byte set iff lo < byte < hi
// (bytes below 128; lo, hi <= 128), without carries between bytes.
constexpr uint64_t kOnes = ~uint64_t{0} / 255;
inline uint64_t bytes_between(uint64_t x, uint64_t lo, uint64_t hi) {
  const uint64_t low7 = x & kOnes * 127;
  return (kOnes * (127 + hi) - low7) & ~x & (low7 + kOnes * (127 - lo)) & kOnes * 128;
}

// Parses exactly 8 hexadecimal digits at p (the first is the most significant) into v;
// false when one of them is not a hex digit. Same value as the digit-by-digit loop.
// A byte is a hex digit when it is '0'-'9' or, with bit 5 set (ASCII's lower case), 'a'-'f':
// setting bit 5 maps exactly 'A'-'F' and 'a'-'f' onto 'a'-'f'. The test runs on the 8 bytes
// at once (SSE2 byte compares where the target has them, else SWAR on a 64-bit word); the
// digits are then packed by three multiplications, each joining neighbouring lanes (bytes,
// then 16-bit, then 32-bit lanes; the first digit, byte 0, ends highest) without carries.
inline bool hex8(const char* p, uint64_t& v) {
  uint64_t x;
  std::memcpy(&x, p, 8);
#ifdef __SSE2__
  const __m128i b = _mm_cvtsi64_si128(static_cast<long long>(x));
  const __m128i low = _mm_or_si128(b, _mm_set1_epi8(0x20));
  // Signed compares: bytes of 128 and more are negative, below every bound.
  const __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(b, _mm_set1_epi8(0x2F)),
                                      _mm_cmpgt_epi8(_mm_set1_epi8(0x3A), b));
  const __m128i letter = _mm_and_si128(_mm_cmpgt_epi8(low, _mm_set1_epi8(0x60)),
                                       _mm_cmpgt_epi8(_mm_set1_epi8(0x67), low));
  if ((_mm_movemask_epi8(_mm_or_si128(digit, letter)) & 0xFF) != 0xFF) return false;
#else
  const uint64_t ok = bytes_between(x, 0x2F, 0x3A) | bytes_between(x | kOnes * 0x20, 0x60, 0x67);
  if (ok != kOnes * 128) return false;
#endif
  // Digit values: low nibble, plus 9 for letters (bit 6 set).
  const uint64_t d = (x & kOnes * 0x0F) + ((x >> 6) & kOnes) * 9;
  // Byte 2k + 1 becomes 16 x digit 2k + digit 2k + 1 (at most 255); taken down to byte 2k.
  const uint64_t a = ((d * 0x1001) >> 8) & 0x00FF00FF00FF00FFULL;
  // 16-bit lane 2k + 1 becomes 256 x pair 2k + pair 2k + 1; taken down to lane 2k.
  const uint64_t h = ((a * 0x1000001) >> 16) & 0x0000FFFF0000FFFFULL;
  v = (h * 0x1000000000001ULL) >> 32;
  return true;
}

// The decimal digits that start the 8 bytes at p: their count k in [0, 8] (8: all eight are
// digits, more may follow) and, when k > 0, their value in v (the first digit most
// significant). Same value as the digit-by-digit loop.
inline int digits8(const char* p, uint64_t& v) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  const uint64_t other = ~bytes_between(x, 0x2F, 0x3A) & kOnes * 128;
  const int k = other == 0 ? 8 : __builtin_ctzll(other) >> 3;
  if (k == 0) return 0;
  // Digit values (a byte past the digits may borrow, but only from the bytes above it, which
  // the shift drops), moved up so that the k digits are the high bytes, zeros below.
  const uint64_t d = (x - kOnes * '0') << (64 - 8 * k);
  // Byte 2k + 1 becomes 10 x digit 2k + digit 2k + 1; then 100 x and 10000 x the lanes below.
  const uint64_t a = ((d * (10 * 256 + 1)) >> 8) & 0x00FF00FF00FF00FFULL;
  const uint64_t b = ((a * (100 * 65536 + 1)) >> 16) & 0x0000FFFF0000FFFFULL;
  v = (b * (10000 * (uint64_t{1} << 32) + 1)) >> 32;
  return k;
}

}  // namespace dlrec::io::text_detail
