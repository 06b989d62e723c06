// Internal: quantization-aware training of one Linear layer on the CUDA graph engine
// (docs/COMPRESSION.md, "QAT"). The arithmetic is the CPU reference's (compress/qat.h,
// src/compress/qat.cc), kernel for kernel:
//
//   forward   m = max |x| over the batch (a device reduction; a non-finite input sets a flag;
//             with a running range the same pass as the quantization, else the one before)
//             sx = (amax >= 0 ? amax : m) / 127 in double, rounded to float (1/127 if 0)
//             xq = sx * clamp(rint(x * (1 / sx)), -127, 127)
//             sw[j] = max(max_k |W[j, k]| / 127, FLT_MIN) (1 if the row is 0)
//             wq[j, k] = sw[j] * clamp(rint(W[j, k] / sw[j]), -127, 127)
//             the layer's GEMM then runs on xq and wq (the weight gradient reads xq)
//   backward  dx = [|x| <= 127 sx] * (dz wq): the data GEMM writes f32 scratch, one pass gates
//             it into the destination (+ what was there, or + a separate addend)
//             the weight gate [|W| <= 127 sw] always passes (|q| <= 127), so it is not run
//   end step  amax <- m (first step), else d * amax + (1 - d) * m (double, no FMA)
//
// Every operation is an IEEE-rounded one (no contraction), so in fp32 precision xq and wq equal
// the CPU's bit for bit given the same x and W. The state lives on the device (captured steps
// read and update it); amax() and the flags are read back on request (a synchronisation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "dlrec/core/tensor.h"

namespace dlrec::nn::cuda_qat {

class QatLayer {
 public:
  // A layer W [out, in] whose inputs are rows in_pad apart of type `act` (F32, BF16 or F16;
  // the weight copy wq is of that type too); `amax` < 0: no range yet.
  QatLayer(std::string name, int64_t out, int64_t in, int64_t in_pad, DType act, double amax,
           double decay, cudaStream_t stream);
  QatLayer(const QatLayer&) = delete;
  QatLayer& operator=(const QatLayer&) = delete;

  // Buffers for batches of up to `rows` rows (reallocates: captured graphs must go).
  void reserve(int64_t rows);
  int64_t capacity() const { return cap_; }
  // The forward's operands from x [B, in_pad] and the f32 master weights w [out, in]: returns
  // xq [B, in_pad]; wq() then holds the fake-quantized weights [out, in_pad] (padding 0).
  const void* forward(const float* w, const void* x, int64_t B, cudaStream_t st);
  const void* wq() const { return wq_.raw(); }
  // The data GEMM's f32 scratch [rows, in_pad] (rows in_pad apart).
  float* grad_scratch() { return gx_.data<float>(); }
  // dst [B, in_pad] (rows dst_ld apart, type dt) = addend + gate * scratch, where the addend is
  // `c` (rows dst_ld apart, type dt; it may be dst itself) or 0 when c is null; the gate reads
  // the last forward's input.
  void gate(DType dt, const void* c, void* dst, int64_t dst_ld, int64_t B, cudaStream_t st);
  // After the step's backward: the running range takes the step's batch range.
  void end_step(cudaStream_t st);
  // Host reads (synchronise `st`): the running range (< 0: none yet), and the flags of a
  // non-finite input (1) or weight (2) seen since the last call, which clears them.
  double amax(cudaStream_t st) const;
  int take_flags(cudaStream_t st);
  double decay() const { return decay_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int64_t out_, in_, in_pad_, cap_ = 0;
  DType act_;
  double decay_;
  Tensor state_;       // the device State (qat_cuda.cu)
  Tensor xq_, wq_, gx_;
  const void* x_ = nullptr;  // the last forward's input
  // The device has a running range (created with one, or a step's end enqueued): a forward
  // then quantizes and reduces the batch's range in one kernel; before, it reduces first.
  bool ranged_;
};

}  // namespace dlrec::nn::cuda_qat
