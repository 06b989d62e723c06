// Internal: device reads of row-wise quantized embedding rows (the CPU reference is
// include/dlrec/nn/row_quant.h). On the device a table is one array of rows, row r at
// r * quant_row_stride(dim, bits) (nn/embedding_cuda.h): row_bytes = (dim * bits + 7) / 8 bytes of
// codes (8 bits: one byte per value; 4 bits: two values per byte, the even value in the low
// nibble), then at quant_sb_offset (row_bytes rounded up to 8) the row's scale and bias as two
// floats (fp16 scales and biases are exact floats). Scale and bias sit beside the codes so that a
// lookup reads one place of memory per row, as an fp32 row is read (a separate array of them cost
// a second random access per row: the int8 lookup was 1.2x slower than fp32's, H200).
// A value is q * scale rounded to float, plus bias rounded to float: __fmul_rn / __fadd_rn, never
// a fused multiply-add, so the values are the CPU's bit for bit. Shared by the pooling forward
// (embedding_cuda.cu) and the fused small-batch kernels (model/infer_small_cuda.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dlrec::nn::cuda_emb {

__device__ __forceinline__ float rq_value(uint32_t q, float2 sb) {
  return __fadd_rn(__fmul_rn(static_cast<float>(q), sb.x), sb.y);
}

__device__ __forceinline__ int64_t rq_sb_offset(int dim, int bits) {
  return ((static_cast<int64_t>(dim) * bits + 7) / 8 + 7) / 8 * 8;
}

// Row r of a table's rows.
__device__ __forceinline__ const uint8_t* rq_row(const uint8_t* rows, int dim, int bits,
                                                 int64_t r) {
  return rows + r * (rq_sb_offset(dim, bits) + 8);
}

__device__ __forceinline__ float2 rq_sb(const uint8_t* row, int dim, int bits) {
  return __ldg(reinterpret_cast<const float2*>(row + rq_sb_offset(dim, bits)));
}

// Value k of a row.
__device__ __forceinline__ float rq_load1(const uint8_t* row, int bits, int dim, int k) {
  const uint32_t q = bits == 8 ? __ldg(row + k)
                               : (k & 1 ? __ldg(row + (k >> 1)) >> 4 : __ldg(row + (k >> 1)) & 15u);
  return rq_value(q, rq_sb(row, dim, bits));
}

// Values k .. k + 3 of a row (k and dim multiples of 4: one 4-byte or 2-byte load).
__device__ __forceinline__ float4 rq_load4(const uint8_t* row, int bits, int dim, int k) {
  const float2 s = rq_sb(row, dim, bits);
  uint32_t q0, q1, q2, q3;
  if (bits == 8) {
    const uint32_t u = __ldg(reinterpret_cast<const uint32_t*>(row + k));
    q0 = u & 255u;
    q1 = (u >> 8) & 255u;
    q2 = (u >> 16) & 255u;
    q3 = u >> 24;
  } else {
    const uint32_t u = __ldg(reinterpret_cast<const uint16_t*>(row + (k >> 1)));
    q0 = u & 15u;
    q1 = (u >> 4) & 15u;
    q2 = (u >> 8) & 15u;
    q3 = (u >> 12) & 15u;
  }
  return make_float4(rq_value(q0, s), rq_value(q1, s), rq_value(q2, s), rq_value(q3, s));
}

}  // namespace dlrec::nn::cuda_emb
