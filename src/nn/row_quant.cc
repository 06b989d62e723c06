// Checks of row-wise quantized embedding records (row_quant.h).
#include "dlrec/nn/row_quant.h"

#include <cmath>
#include <limits>

#include "dlrec/core/error.h"

namespace dlrec::nn {

void row_quant_dequantize(const RowQuantRows& t, int64_t row, float* out) {
  const uint8_t* c = t.codes.data() + row * t.row_bytes();
  const float s = t.scale[static_cast<size_t>(row)], b = t.bias[static_cast<size_t>(row)];
  for (int64_t k = 0; k < t.dim; ++k) out[k] = row_quant_value(row_quant_code(c, k, t.bits), s, b);
}

float fp16_value(uint16_t bits) {
  const int sign = bits >> 15, e = (bits >> 10) & 31, m = bits & 1023;
  float v;
  if (e == 0)
    v = std::ldexp(static_cast<float>(m), -24);  // zero or subnormal
  else if (e == 31)
    v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(m | 1024), e - 25);
  return sign ? -v : v;
}

uint16_t fp16_bits_exact(float x, const std::string& what) {
  if (!std::isfinite(x) || std::fabs(x) > 65504.f)
    fail(what, ": ", x, " is not a finite fp16 value");
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const float a = std::fabs(x);
  uint16_t bits;
  if (a < std::ldexp(1.f, -14)) {  // zero or subnormal: a multiple of 2^-24
    bits = static_cast<uint16_t>(std::ldexp(a, 24));
  } else {
    int e = 0;
    const float f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
    bits = static_cast<uint16_t>(((e + 14) << 10) | (static_cast<int>(std::ldexp(f, 11)) & 1023));
  }
  bits |= sign;
  if (fp16_value(bits) != x) fail(what, ": ", x, " is not an fp16 value (it rounds)");
  return bits;
}

void check_row_quant(const RowQuantRows& t, const std::string& what) {
  if (t.bits != 8 && t.bits != 4) fail(what, ": bits must be 8 or 4, got ", t.bits);
  if (t.rows < 0 || t.dim <= 0) fail(what, ": bad shape [", t.rows, ", ", t.dim, "]");
  const int64_t want = t.rows * t.row_bytes();
  if (static_cast<int64_t>(t.codes.size()) != want)
    fail(what, ": holds ", t.codes.size(), " code bytes, [", t.rows, ", ", t.dim, "] at ", t.bits,
         " bits needs ", want);
  if (static_cast<int64_t>(t.scale.size()) != t.rows ||
      static_cast<int64_t>(t.bias.size()) != t.rows)
    fail(what, ": holds ", t.scale.size(), " scales and ", t.bias.size(), " biases for ", t.rows,
         " rows");
  for (int64_t r = 0; r < t.rows; ++r) {
    if (!(std::isfinite(t.scale[r]) && t.scale[r] >= 0))
      fail(what, ": row ", r, "'s scale is ", t.scale[r], " (a scale is finite and >= 0)");
    if (!std::isfinite(t.bias[r]))
      fail(what, ": row ", r, "'s bias is ", t.bias[r], " (a bias is finite)");
  }
  if (t.bits == 4 && t.dim % 2)
    for (int64_t r = 0; r < t.rows; ++r)
      if (t.codes[r * t.row_bytes() + t.row_bytes() - 1] >> 4)
        fail(what, ": row ", r, "'s last byte has a non-zero unused high nibble (odd dim ", t.dim,
             ")");
}

}  // namespace dlrec::nn
