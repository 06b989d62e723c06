// Quantization-aware training of one Linear layer on the CUDA graph engine (nn/qat_cuda.h; the
// CPU reference is src/compress/qat.cc).
#include "nn/qat_cuda.h"

#include <cfloat>
#include <cstring>

#include "core/cuda_check.h"
#include "dlrec/core/error.h"
#include "nn/half_cuda.cuh"

namespace dlrec::nn::cuda_qat {

using half_cuda::bf16;
using half_cuda::f16;
using half_cuda::from_f;
using half_cuda::grid_for;
using half_cuda::to_f;

namespace {

struct State {
  double amax;          // running range; < 0: none yet
  unsigned batch_bits;  // the last forward's max |x| (float bits: non-negative floats order
                        // as integers, so atomicMax reduces them)
  float x_scale;        // the last forward's input scale
  int flags;            // 1: a non-finite input, 2: a non-finite weight, 4: no range (a bug)
  int pad;
};

__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>((blockDim.x + 31) / 32) ? part[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;  // valid in thread 0
}

template <class T>
__global__ void absmax_kernel(const T* __restrict__ x, int64_t B, int64_t in, int64_t in_pad,
                              State* s) {
  float m = 0.f;
  bool bad = false;
  const int64_t n = B * in;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / in, c = i - r * in;
    const float a = fabsf(to_f(x[r * in_pad + c]));
    if (isfinite(a)) m = fmaxf(m, a);
    else bad = true;
  }
  if (bad) atomicOr(&s->flags, 1);
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(&s->batch_bits, __float_as_uint(m));
}

// The input scale of a range (every thread computes it; thread 0 of block 0 stores it).
__device__ __forceinline__ float input_scale(State* s, double range) {
  const float sx = range > 0 ? __double2float_rn(__ddiv_rn(range, 127.0)) : __fdiv_rn(1.f, 127.f);
  if (blockIdx.x == 0 && threadIdx.x == 0) s->x_scale = sx;
  return sx;
}

// One element: its fake-quantized value (0 in the padding columns).
__device__ __forceinline__ float fake_quant_x(float x, float sx, float inv) {
  return __fmul_rn(fminf(127.f, fmaxf(-127.f, rintf(__fmul_rn(x, inv)))), sx);
}

// The first forward (no running range yet): the batch's range, reduced by absmax_kernel.
template <class T>
__global__ void fake_quant_x_kernel(const T* __restrict__ x, T* __restrict__ xq, int64_t B,
                                    int64_t in, int64_t in_pad, State* s) {
  const double range =
      s->amax >= 0 ? s->amax : static_cast<double>(__uint_as_float(s->batch_bits));
  const float sx = input_scale(s, range), inv = __fdiv_rn(1.f, sx);
  const int64_t n = B * in_pad;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % in_pad;
    xq[i] = from_f<T>(c < in ? fake_quant_x(to_f(x[i]), sx, inv) : 0.f);
  }
}

// Later forwards (a running range): the fake quantization and the batch's range for the
// step's update in one pass.
template <class T>
__global__ void fake_quant_x_ranged_kernel(const T* __restrict__ x, T* __restrict__ xq,
                                           int64_t B, int64_t in, int64_t in_pad, State* s) {
  if (s->amax < 0 && threadIdx.x == 0) atomicOr(&s->flags, 4);
  const float sx = input_scale(s, s->amax), inv = __fdiv_rn(1.f, sx);
  float m = 0.f;
  bool bad = false;
  const int64_t n = B * in_pad;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % in_pad;
    float v = 0.f;
    if (c < in) {
      const float xv = to_f(x[i]), a = fabsf(xv);
      if (isfinite(a)) m = fmaxf(m, a);
      else bad = true;
      v = fake_quant_x(xv, sx, inv);
    }
    xq[i] = from_f<T>(v);
  }
  if (bad) atomicOr(&s->flags, 1);
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(&s->batch_bits, __float_as_uint(m));
}

// One block per output row.
// Block 0 also resets the batch range that this forward's input kernel reduces.
template <class T>
__global__ void fake_quant_w_kernel(const float* __restrict__ w, T* __restrict__ wq, int64_t in,
                                    int64_t in_pad, State* s) {
  const int64_t j = blockIdx.x;
  if (j == 0 && threadIdx.x == 0) s->batch_bits = 0;
  const float* row = w + j * in;
  float m = 0.f;
  bool bad = false;
  for (int64_t k = threadIdx.x; k < in; k += blockDim.x) {
    const float a = fabsf(row[k]);
    if (isfinite(a)) m = fmaxf(m, a);
    else bad = true;
  }
  if (bad) atomicOr(&s->flags, 2);
  __shared__ float amax;
  m = block_max(m);
  if (threadIdx.x == 0) amax = m;
  __syncthreads();
  const float sw = amax > 0.f ? fmaxf(__fdiv_rn(amax, 127.f), FLT_MIN) : 1.f;
  for (int64_t k = threadIdx.x; k < in_pad; k += blockDim.x) {
    float v = 0.f;
    if (k < in) v = __fmul_rn(fminf(127.f, fmaxf(-127.f, rintf(__fdiv_rn(row[k], sw)))), sw);
    wq[j * in_pad + k] = from_f<T>(v);
  }
}

template <class T, class D>
__global__ void gate_kernel(const T* __restrict__ x, const float* __restrict__ g, const D* c,
                            D* dst, int64_t dst_ld, int64_t B, int64_t in_pad, const State* s) {
  const float lim = __fmul_rn(127.f, s->x_scale);
  const int64_t n = B * in_pad;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / in_pad, col = i - r * in_pad;
    const float pass = fabsf(to_f(x[i])) <= lim ? g[i] : 0.f;
    const int64_t o = r * dst_ld + col;
    dst[o] = from_f<D>(c ? __fadd_rn(to_f(c[o]), pass) : pass);
  }
}

__global__ void end_step_kernel(State* s, double decay) {
  const double m = static_cast<double>(__uint_as_float(s->batch_bits));
  s->amax = s->amax < 0
                ? m
                : __dadd_rn(__dmul_rn(decay, s->amax), __dmul_rn(__dadd_rn(1.0, -decay), m));
}

template <class F>
void with_type(DType t, F&& f) {
  if (t == DType::F32) f(static_cast<float*>(nullptr));
  else if (t == DType::BF16) f(static_cast<bf16*>(nullptr));
  else if (t == DType::F16) f(static_cast<f16*>(nullptr));
  else fail("QAT on the GPU: unsupported type ", dtype_name(t));
}

Device current_device() {
  int d = 0;
  DLREC_CUDA_CHECK(cudaGetDevice(&d));
  return Device::cuda(d);
}

}  // namespace

QatLayer::QatLayer(std::string name, int64_t out, int64_t in, int64_t in_pad, DType act,
                   double amax, double decay, cudaStream_t stream)
    : name_(std::move(name)),
      out_(out),
      in_(in),
      in_pad_(in_pad),
      act_(act),
      decay_(decay),
      ranged_(amax >= 0) {
  DLREC_CHECK(out > 0 && in > 0 && in_pad >= in, "QAT layer '", name_, "': bad shape [", out,
              ", ", in, "] (row stride ", in_pad, ")");
  const Device dev = current_device();
  state_ = Tensor::empty({static_cast<int64_t>(sizeof(State))}, DType::U8, dev);
  State init{};
  init.amax = amax;
  init.x_scale = 1.f;
  DLREC_CUDA_CHECK(cudaMemcpyAsync(state_.raw(), &init, sizeof init, cudaMemcpyHostToDevice,
                                   stream));
  wq_ = Tensor::empty({out_, in_pad_}, act_, dev);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream));  // `init` is on the stack
}

void QatLayer::reserve(int64_t rows) {
  if (rows <= cap_) return;
  const Device dev = current_device();
  xq_ = Tensor::empty({rows, in_pad_}, act_, dev);
  gx_ = Tensor::empty({rows, in_pad_}, DType::F32, dev);
  cap_ = rows;
}

const void* QatLayer::forward(const float* w, const void* x, int64_t B, cudaStream_t st) {
  DLREC_CHECK(B <= cap_, "QAT layer '", name_, "': ", B, " rows, buffers for ", cap_, " (bug)");
  State* s = static_cast<State*>(state_.raw());
  x_ = x;
  with_type(act_, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    fake_quant_w_kernel<T><<<static_cast<unsigned>(out_), 256, 0, st>>>(
        w, static_cast<T*>(wq_.raw()), in_, in_pad_, s);
    DLREC_CUDA_LAUNCH_CHECK();
    if (B == 0) return;
    if (ranged_) {
      fake_quant_x_ranged_kernel<T><<<grid_for(B * in_pad_, 256, 2048), 256, 0, st>>>(
          static_cast<const T*>(x), static_cast<T*>(xq_.raw()), B, in_, in_pad_, s);
      DLREC_CUDA_LAUNCH_CHECK();
      return;
    }
    absmax_kernel<T><<<grid_for(B * in_, 256, 1024), 256, 0, st>>>(static_cast<const T*>(x), B,
                                                                   in_, in_pad_, s);
    DLREC_CUDA_LAUNCH_CHECK();
    fake_quant_x_kernel<T><<<grid_for(B * in_pad_, 256), 256, 0, st>>>(
        static_cast<const T*>(x), static_cast<T*>(xq_.raw()), B, in_, in_pad_, s);
    DLREC_CUDA_LAUNCH_CHECK();
  });
  return xq_.raw();
}

void QatLayer::gate(DType dt, const void* c, void* dst, int64_t dst_ld, int64_t B,
                    cudaStream_t st) {
  if (B == 0) return;
  DLREC_CHECK(x_, "QAT layer '", name_, "': backward before its forward");
  with_type(act_, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    with_type(dt, [&](auto* dp) {
      using D = std::remove_pointer_t<decltype(dp)>;
      gate_kernel<T, D><<<grid_for(B * in_pad_, 256), 256, 0, st>>>(
          static_cast<const T*>(x_), gx_.data<float>(), static_cast<const D*>(c),
          static_cast<D*>(dst), dst_ld, B, in_pad_, static_cast<const State*>(state_.raw()));
      DLREC_CUDA_LAUNCH_CHECK();
    });
  });
}

void QatLayer::end_step(cudaStream_t st) {
  end_step_kernel<<<1, 1, 0, st>>>(static_cast<State*>(state_.raw()), decay_);
  DLREC_CUDA_LAUNCH_CHECK();
  ranged_ = true;  // the device holds a range from here on (stream order)
}

double QatLayer::amax(cudaStream_t st) const {
  State s;
  DLREC_CUDA_CHECK(cudaMemcpyAsync(&s, state_.raw(), sizeof s, cudaMemcpyDeviceToHost, st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
  return s.amax;
}

int QatLayer::take_flags(cudaStream_t st) {
  int f = 0;
  State* s = static_cast<State*>(state_.raw());
  DLREC_CUDA_CHECK(cudaMemcpyAsync(&f, &s->flags, sizeof f, cudaMemcpyDeviceToHost, st));
  DLREC_CUDA_CHECK(cudaMemsetAsync(&s->flags, 0, sizeof(int), st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
  return f;
}

}  // namespace dlrec::nn::cuda_qat
