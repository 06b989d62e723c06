// Linear layer y = act(x W^T + b) on the CPU (F32), GEMMs through OpenBLAS.
#pragma once

#include <cstdint>
#include <string>

#include "dlrec/nn/param.h"

namespace dlrec::nn {

enum class Activation { None, ReLU };

// QAT (LinearHook::fake_quant): the operands the fp32 forward and backward use instead of the
// input and the weight (null: the original one).
struct FakeQuantOperands {
  const Tensor* x = nullptr;
  const Tensor* w = nullptr;
};

// What src/compress attaches to a Linear's weight (Param::quant): INT8 inference replaces the
// fp32 forward; calibration observes the fp32 forward's input and output. nn knows no more of
// quantization than this interface.
class LinearHook {
 public:
  virtual ~LinearHook() = default;
  // Computes y [B, out] = act(x W^T + b) in its own arithmetic and returns true, or returns
  // false to let the fp32 path run. `y` is the layer's output buffer (already [B, out]).
  virtual bool forward(const Tensor& x, const Tensor& bias, bool relu, Tensor& y) = 0;
  // After the fp32 path: its input x [B, in], bias, activation and output y [B, out].
  virtual void observe(const Tensor& /*x*/, const Tensor& /*bias*/, bool /*relu*/,
                       const Tensor& /*y*/) {}
  // QAT: fake-quantized copies of x and W that the fp32 path computes with (and backward's dW
  // and dx GEMMs use); after backward, straight_through() gates dx (null when not computed) and
  // dW with the straight-through estimator.
  virtual FakeQuantOperands fake_quant(const Tensor& /*x*/, const Tensor& /*w*/) { return {}; }
  virtual void straight_through(Tensor* /*dx*/, Tensor& /*dw*/) {}
  // QAT on an engine that keeps its own copy of the layer (the CUDA graph engine runs the
  // record's arithmetic on the device, nn/qat_cuda.h): the record's running input range
  // (< 0: none yet) and EMA decay, read when the engine takes the record up; the engine hands
  // its device range back with set_qat_range before a checkpoint or an export reads it.
  struct QatRange {
    bool on = false;  // a QAT record
    double amax = -1, decay = 0;
  };
  virtual QatRange qat_range() const { return {}; }
  virtual void set_qat_range(double /*amax*/) {}
  // What forward() runs, for reports ("int8 avx512-vnni"); empty when it computes nothing.
  virtual std::string kernel() const { return ""; }
  // A form for serving only (a packed copy of the weight): Linear::backward refuses to run.
  virtual bool inference_only() const { return false; }
};

class Linear {
 public:
  // W [out, in], b [out], both zero until init().
  Linear(int64_t in_features, int64_t out_features, Activation act = Activation::None);

  // DLRM's initialisation: W ~ N(0, sqrt(2 / (in + out))), b ~ N(0, sqrt(1 / out)), from the
  // counter-based stream `seed` (identical on any thread count).
  void init(uint64_t seed);

  // x [B, in] -> y [B, out]. Keeps a reference to x for backward(); the returned tensor is a
  // layer-owned buffer, valid until the next forward().
  const Tensor& forward(const Tensor& x);
  // dy [B, out] (dL/dy of the last forward) -> dx [B, in]. Writes weight().grad and bias().grad
  // (overwritten, not accumulated). With need_dx = false the dx GEMM is skipped and the returned
  // tensor is undefined.
  const Tensor& backward(const Tensor& dy, bool need_dx = true);

  Param& weight() { return w_; }
  Param& bias() { return b_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Activation activation() const { return act_; }

 private:
  int64_t in_, out_;
  Activation act_;
  Param w_, b_;
  Tensor x_, y_, dz_, dx_, partial_;
  Tensor wq_;  // the fake-quantized weight of the last forward (QAT), else undefined
};

// Layers split their GEMMs into row blocks themselves and run them on dlrec's thread pool, one
// single-threaded OpenBLAS call per block: one pool (set_num_threads, the CLI's --threads) does all
// the work, and no idle BLAS threads spin while our own loops run. OpenBLAS is loaded at run time
// (dlopen of libopenblas.so.0) with OPENBLAS_NUM_THREADS=1 set first, so that it never creates
// its worker pool (it would at load, one spinning thread per core).
//
// prepare_single_threaded_blas sets that variable (once; the process environment, so processes
// started later inherit it): the CLI calls it first thing in main, while it has one thread.
// use_single_threaded_blas loads OpenBLAS (once; a clear error if it cannot) and sets it to one
// thread; layers call it before their first GEMM. blas_threads: OpenBLAS's thread count.
void prepare_single_threaded_blas();
void use_single_threaded_blas();
int blas_threads();

}  // namespace dlrec::nn
