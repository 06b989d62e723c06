// The AVX-512 VNNI kernel of the CPU's int8 GEMM (int8_gemm.cc dispatches to it). vpdpbusd
// multiplies unsigned by signed bytes, so the input is offset by 128 (x + 128 in [1, 255]) and
// each output channel's sum corrected by 128 * sum_k W[j, k]: the int32 result is the exact
// integer product, the reference's bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dlrec/compress/quantize.h"

namespace dlrec::compress {

struct Int8Packed {
  int64_t out = 0, in = 0;
  int64_t in4 = 0;     // in rounded up to a multiple of 4 (the padding weights are 0)
  int64_t blocks = 0;  // groups of 16 output channels (the last padded with zero weights)
  // [blocks][in4 / 4][16 channels][4 k]: one 64-byte vector per block and step of 4 k.
  std::vector<int8_t> w;
  std::vector<int32_t> correction;  // [blocks * 16]: 128 * sum_k W[j, k]
};

bool int8_vnni_available();
std::shared_ptr<const Int8Packed> pack_int8_vnni(const QuantWeight& w);

// xu [rows, p.in4]: the quantized input + 128 (padding columns 128). acc [rows, p.out] (row
// stride p.out) = the int32 products.
void int8_gemm_vnni(const uint8_t* xu, const Int8Packed& p, int64_t rows, int32_t* acc);

// xu row r = quantize_value(x[r, k], inv_scale) + 128 for k < in, 128 for in <= k < in4 (the
// scalar quantize's values); nan_rows[r] = whether x's row r holds a NaN.
void quantize_rows_u8(const float* x, int64_t rows, int64_t in, int64_t in4, float inv_scale,
                      uint8_t* xu, char* nan_rows);

// y row r = relu?(float(acc[r, j]) * deq[j] + b[j]) (NaN where nan_rows[r]): the scalar
// epilogue's values (a product and a sum, never fused; this file is built with
// -ffp-contract=off).
void dequantize_rows_vnni(const int32_t* acc, int64_t rows, int64_t out, const float* deq,
                          const float* b, bool relu, const char* nan_rows, float* y);

}  // namespace dlrec::compress
