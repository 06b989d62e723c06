// The SIMD kernels of the CPU's int8 Linear on packed weights (int8_gemm.cc dispatches to them):
// quantize a chunk of rows, multiply, dequantize. Both give the scalar reference's bits: the
// int32 sums are exact in any order, and the quantize and dequantize compute the same values.
//   Avx512Vnni: vpdpbusd multiplies unsigned by signed bytes, so the input is offset by 128
//     (x + 128 in [1, 255]) and each channel's sum corrected by 128 * sum_k W[j, k]; tiles of
//     8 rows x 32 channels.
//   Avx2: the weight widened to int16 at packing, pairs of k multiplied and added by madd into
//     int32; tiles of 4 rows x 16 channels.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dlrec/compress/quantize.h"

namespace dlrec::compress {

struct Int8Packed {
  Int8Kernel kernel = Int8Kernel::Avx512Vnni;  // or Avx2
  int64_t out = 0, in = 0;
  int64_t in_pad = 0;  // in rounded up to a multiple of 4 (Vnni) or 2 (Avx2); padding weights 0
  int64_t blocks = 0;  // groups of 16 (Vnni) or 8 (Avx2) channels, the last zero-padded
  std::vector<int8_t> w8;           // Vnni: [blocks][in_pad / 4][16 channels][4 k]
  std::vector<int16_t> w16;         // Avx2: [blocks][in_pad / 2][8 channels][2 k]
  std::vector<int32_t> correction;  // Vnni: [blocks * 16], 128 * sum_k W[j, k]
};

// Whether this CPU runs kernel k (Avx2 or Avx512Vnni).
bool int8_simd_available(Int8Kernel k);
std::shared_ptr<const Int8Packed> pack_int8(const QuantWeight& w, Int8Kernel k);

// y [rows, out] = act(dequant(quant(x [rows, in]) . W^T) + b), deq[j] = x_scale * w_scale[j]; a
// row of x holding a NaN gives a NaN row.
void int8_rows_packed(const Int8Packed& p, const float* x, int64_t rows, float inv_scale,
                      const float* deq, const float* b, bool relu, float* y);

}  // namespace dlrec::compress
