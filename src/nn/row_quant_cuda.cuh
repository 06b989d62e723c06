// Internal: device reads of row-wise quantized embedding rows (the CPU reference is
// include/dlrec/nn/row_quant.h). A table's row r is row_bytes = (dim * bits + 7) / 8 bytes of
// codes (8 bits: one byte per value; 4 bits: two values per byte, the even value in the low
// nibble) and one (scale, bias) pair, held as float2 (fp16 scales and biases are exact floats).
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

__device__ __forceinline__ int64_t rq_row_bytes(int dim, int bits) {
  return (static_cast<int64_t>(dim) * bits + 7) / 8;
}

// Value k of row r.
__device__ __forceinline__ float rq_load1(const uint8_t* codes, const float2* sb, int bits,
                                          int dim, int64_t r, int k) {
  const uint8_t* c = codes + r * rq_row_bytes(dim, bits);
  const uint32_t q = bits == 8 ? c[k] : (k & 1 ? c[k >> 1] >> 4 : c[k >> 1] & 15u);
  return rq_value(q, __ldg(sb + r));
}

// Values k .. k + 3 of row r (k and dim multiples of 4: one 4-byte or 2-byte load).
__device__ __forceinline__ float4 rq_load4(const uint8_t* codes, const float2* sb, int bits,
                                           int dim, int64_t r, int k) {
  const uint8_t* c = codes + r * rq_row_bytes(dim, bits);
  const float2 s = __ldg(sb + r);
  uint32_t q0, q1, q2, q3;
  if (bits == 8) {
    const uint32_t u = __ldg(reinterpret_cast<const uint32_t*>(c + k));
    q0 = u & 255u;
    q1 = (u >> 8) & 255u;
    q2 = (u >> 16) & 255u;
    q3 = u >> 24;
  } else {
    const uint32_t u = __ldg(reinterpret_cast<const uint16_t*>(c + (k >> 1)));
    q0 = u & 15u;
    q1 = (u >> 4) & 15u;
    q2 = (u >> 8) & 15u;
    q3 = (u >> 12) & 15u;
  }
  return make_float4(rq_value(q0, s), rq_value(q1, s), rq_value(q2, s), rq_value(q3, s));
}

}  // namespace dlrec::nn::cuda_emb
