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

// Where a row's scale and bias start (the host's quant_row_stride is this + 8).
__host__ __device__ __forceinline__ int64_t rq_sb_offset(int64_t dim, int bits) {
  return ((dim * bits + 7) / 8 + 7) / 8 * 8;
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

// The codes of values k .. k + 3 of a row (k and dim multiples of 4): one 4-byte (8 bits) or
// 2-byte (4 bits) load.
template <int BITS>
__device__ __forceinline__ uint32_t rq_raw4(const uint8_t* row, int k) {
  if constexpr (BITS == 8) return __ldg(reinterpret_cast<const uint32_t*>(row + k));
  return __ldg(reinterpret_cast<const uint16_t*>(row + (k >> 1)));
}

// Their four values. A code q becomes float(q) exactly without a conversion instruction: the
// float with bits 0x4B000000 | q is 2^23 + q, minus 2^23 (the conversion's quarter-rate
// instruction showed in the lookup's time).
template <int BITS>
__device__ __forceinline__ float4 rq_decode4(uint32_t u, float2 s) {
  constexpr float kTwo23 = 8388608.f;
  uint32_t b0, b1, b2, b3;
  if constexpr (BITS == 8) {  // byte i of u into the low byte of 0x4B000000
    b0 = __byte_perm(u, 0x4B000000u, 0x7440);
    b1 = __byte_perm(u, 0x4B000000u, 0x7441);
    b2 = __byte_perm(u, 0x4B000000u, 0x7442);
    b3 = __byte_perm(u, 0x4B000000u, 0x7443);
  } else {
    b0 = (u & 15u) | 0x4B000000u;
    b1 = ((u >> 4) & 15u) | 0x4B000000u;
    b2 = ((u >> 8) & 15u) | 0x4B000000u;
    b3 = ((u >> 12) & 15u) | 0x4B000000u;
  }
  auto value = [&](uint32_t b) {
    const float q = __fsub_rn(__uint_as_float(b), kTwo23);
    return __fadd_rn(__fmul_rn(q, s.x), s.y);  // rq_value's arithmetic
  };
  return make_float4(value(b0), value(b1), value(b2), value(b3));
}

// Values k .. k + 3 of a row (k and dim multiples of 4).
__device__ __forceinline__ float4 rq_load4(const uint8_t* row, int bits, int dim, int k) {
  const float2 s = rq_sb(row, dim, bits);
  return bits == 8 ? rq_decode4<8>(rq_raw4<8>(row, k), s) : rq_decode4<4>(rq_raw4<4>(row, k), s);
}

}  // namespace dlrec::nn::cuda_emb
