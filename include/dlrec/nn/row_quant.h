// Row-wise INT8 / 4-bit embedding rows (docs/COMPRESSION.md, "Row-wise INT8 / 4-bit embedding
// tables"): per row a scale and a bias, codes one byte a value (8 bits) or two values a byte,
// low nibble first (4 bits). The one place that turns a code back into a value, shared by the
// quantizer's round trip (row_quant_dequantize) and the CPU lookup (nn::EmbeddingBag), so
// that a lookup of the codes gives bit for bit the values of the fp32-dequantized table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrec::nn {

struct RowQuantRows {
  int64_t rows = 0, dim = 0;
  int bits = 8;
  bool fp16 = false;               // scale and bias are fp16 values (held as float)
  std::vector<uint8_t> codes;      // [rows * row_bytes()]
  std::vector<float> scale, bias;  // [rows]
  int64_t row_bytes() const { return (dim * bits + 7) / 8; }
  // The bytes a serving copy needs: codes plus scale and bias (2 or 4 bytes each) per row.
  int64_t bytes() const { return rows * (row_bytes() + 2 * (fp16 ? 2 : 4)); }
};

// Code k of a row whose codes start at c.
inline int row_quant_code(const uint8_t* c, int64_t k, int bits) {
  return bits == 8 ? c[k] : (k % 2 ? c[k / 2] >> 4 : c[k / 2] & 15);
}

// The value of code q: the product rounded to float, then the sum rounded to float (two
// roundings, never a fused multiply-add: the CUDA kernel writes the same __fmul_rn/__fadd_rn).
inline float row_quant_value(int q, float scale, float bias) {
  const float m = static_cast<float>(q) * scale;
  return m + bias;
}

// Row `row` of t dequantized into out [t.dim] (row_quant_value of each code).
void row_quant_dequantize(const RowQuantRows& t, int64_t row, float* out);

// fp16 storage of the scales and biases of a record with fp16 = true: the bits of x, which must
// be an fp16 value (finite; an error otherwise, naming `what`), and the value of fp16 bits.
uint16_t fp16_bits_exact(float x, const std::string& what);
float fp16_value(uint16_t bits);

// Checks a record's sizes and values, each a clear error naming `what`: bits 8 or 4, the code
// count rows * row_bytes(), rows scales and biases, every scale finite and >= 0, every bias
// finite, and for 4 bits an odd dim's unused high nibble 0.
void check_row_quant(const RowQuantRows& t, const std::string& what);

}  // namespace dlrec::nn
