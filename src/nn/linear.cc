#include "dlrec/nn/linear.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/rng.h"

namespace dlrec::nn {

int64_t check_matrix(const Tensor& t, int64_t cols, const char* what) {
  DLREC_CHECK(t.defined(), what, ": tensor is undefined");
  DLREC_CHECK(!t.device().is_cuda(), what, ": expected a CPU tensor, got ", t.device().str());
  DLREC_CHECK(t.dtype() == DType::F32, what, ": expected f32, got ", dtype_name(t.dtype()));
  DLREC_CHECK(t.ndim() == 2 && t.dim(1) == cols, what, ": expected shape [B, ", cols, "], got ",
              shape_str(t.shape()));
  return t.dim(0);
}

// OpenBLAS is loaded at run time, not linked: Debian's pthreads build starts one worker thread
// per core in its load-time initialiser, and each spins (~2^28 cycles) before it sleeps, ~0.3-7
// CPU s of every process on a 64-core host, ETL runs included. dlrec never lets OpenBLAS thread
// (see the header), so it asks OpenBLAS for one thread before loading it: no pool is created. The
// CLI sets that up first thing in main (prepare_single_threaded_blas), while it has one thread;
// elsewhere the first GEMM does.
namespace {

using SgemmFn = decltype(&cblas_sgemm);  // declared by cblas.h, resolved with dlsym
using SgemvFn = decltype(&cblas_sgemv);
using SetThreadsFn = decltype(&openblas_set_num_threads);
using GetThreadsFn = decltype(&openblas_get_num_threads);

struct OpenBlas {
  SgemmFn sgemm = nullptr;
  SgemvFn sgemv = nullptr;
  GetThreadsFn threads = nullptr;
};

constexpr const char* kOpenBlasLibrary = "libopenblas.so.0";

const OpenBlas& openblas() {
  static const OpenBlas blas = [] {
    prepare_single_threaded_blas();
    void* h = ::dlopen(kOpenBlasLibrary, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = ::dlerror();
      fail("cannot load OpenBLAS (", kOpenBlasLibrary, "): ", why ? why : "unknown error",
           "; dlrec's CPU layers need it (Debian: libopenblas0-pthread)");
    }
    OpenBlas b;
    b.sgemm = reinterpret_cast<SgemmFn>(::dlsym(h, "cblas_sgemm"));
    b.sgemv = reinterpret_cast<SgemvFn>(::dlsym(h, "cblas_sgemv"));
    b.threads = reinterpret_cast<GetThreadsFn>(::dlsym(h, "openblas_get_num_threads"));
    auto set = reinterpret_cast<SetThreadsFn>(::dlsym(h, "openblas_set_num_threads"));
    DLREC_CHECK(b.sgemm && b.sgemv && b.threads && set, kOpenBlasLibrary,
                " lacks cblas_sgemm, cblas_sgemv or openblas_{get,set}_num_threads");
    set(1);  // in case the library was loaded already, by another part of the process
    return b;
  }();
  return blas;
}

}  // namespace

void prepare_single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { ::setenv("OPENBLAS_NUM_THREADS", "1", 1); });
}

void use_single_threaded_blas() { openblas(); }

int blas_threads() { return openblas().threads(); }

namespace {

// Rows per backward chunk. The weight gradient is summed per chunk and the chunks are added in
// order, so this (not the thread count) fixes the summation order.
constexpr int64_t kChunkRows = 256;

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc) {
  openblas().sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                   static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.f, a,
                   static_cast<int>(lda), b, static_cast<int>(ldb), 0.f, c, static_cast<int>(ldc));
}

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, Activation act)
    : in_(in_features), out_(out_features), act_(act) {
  DLREC_CHECK(in_ > 0 && out_ > 0, "Linear: sizes must be positive, got ", in_, " -> ", out_);
  w_.value = Tensor::zeros({out_, in_}, DType::F32);
  w_.grad = Tensor::zeros({out_, in_}, DType::F32);
  b_.value = Tensor::zeros({out_}, DType::F32);
  b_.grad = Tensor::zeros({out_}, DType::F32);
}

void Linear::init(uint64_t seed) {
  const double w_std = std::sqrt(2.0 / static_cast<double>(in_ + out_));
  const double b_std = std::sqrt(1.0 / static_cast<double>(out_));
  const uint64_t ws = derive_seed(seed, 0), bs = derive_seed(seed, 1);
  float* w = w_.value.data<float>();
  parallel_for(0, out_ * in_, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) w[i] = static_cast<float>(w_std * normal_at(ws, i));
  });
  float* b = b_.value.data<float>();
  for (int64_t i = 0; i < out_; ++i) b[i] = static_cast<float>(b_std * normal_at(bs, i));
}

const Tensor& Linear::forward(const Tensor& x) {
  const int64_t B = check_matrix(x, in_, "Linear::forward input");
  use_single_threaded_blas();
  x_ = x;
  ensure_buffer(y_, {B, out_});
  if (B == 0) return y_;
  if (w_.quant && w_.quant->forward(x, b_.value, act_ == Activation::ReLU, y_)) return y_;
  wq_ = Tensor();
  const Tensor* xin = &x;
  if (w_.quant) {  // QAT: compute with the fake-quantized operands
    const FakeQuantOperands fq = w_.quant->fake_quant(x, w_.value);
    if (fq.x) x_ = *(xin = fq.x);
    if (fq.w) wq_ = *fq.w;
  }
  const float* xs = xin->data<float>();
  const float* w = (wq_.defined() ? wq_ : w_.value).data<float>();
  const float* b = b_.value.data<float>();
  float* y = y_.data<float>();
  const int64_t in = in_, out = out_;
  const bool relu = act_ == Activation::ReLU;
  auto bias_act = [&](float* yr) {  // one output row
    if (relu) {
      for (int64_t j = 0; j < out; ++j) yr[j] = std::max(yr[j] + b[j], 0.f);
    } else {
      for (int64_t j = 0; j < out; ++j) yr[j] += b[j];
    }
  };
  if (B == 1 && out > 1) {
    // One row (online serving): a GEMV on this thread. A one-row GEMM would pack the whole
    // weight on every call (OpenBLAS does: most of its time), and waking the pool's threads for
    // so little work costs more than it saves (measured: bench/RESULTS.md, "INT8 on the CPU").
    openblas().sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.f,
                     w, static_cast<int>(in), xs, 1, 0.f, y, 1);
    bias_act(y);
    if (w_.quant) w_.quant->observe(x, b_.value, relu, y_);
    return y_;
  }
  // Fixed row chunks: each runs one single-threaded GEMM and applies the bias (and ReLU) while
  // the rows are still in cache. The chunk boundaries depend on the batch only, never on the
  // thread count, because a BLAS kernel may round a row differently depending on where it falls
  // in the call (edge kernels for the remainder rows, seen with AVX-512 OpenBLAS).
  const int64_t chunks = (B + kChunkRows - 1) / kChunkRows;
  parallel_for(0, chunks, 1, [&](int64_t clo, int64_t chi) {
    for (int64_t c = clo; c < chi; ++c) {
      const int64_t lo = c * kChunkRows, hi = std::min(B, lo + kChunkRows);
      if (out == 1) {
        // OpenBLAS turns an n = 1 GEMM into a GEMV whose summation order depends on the row
        // count; a plain dot per row keeps the logits independent of the split.
        for (int64_t r = lo; r < hi; ++r) {
          const float* xr = xs + r * in;
          float acc = 0.f;
          for (int64_t i = 0; i < in; ++i) acc += xr[i] * w[i];
          y[r] = acc;
        }
      } else {
        gemm(false, true, hi - lo, out, in, xs + lo * in, in, w, in, y + lo * out, out);
      }
      for (int64_t r = lo; r < hi; ++r) bias_act(y + r * out);
    }
  });
  if (w_.quant) w_.quant->observe(x, b_.value, relu, y_);
  return y_;
}

const Tensor& Linear::backward(const Tensor& dy_in, bool need_dx) {
  DLREC_CHECK(x_.defined(), "Linear::backward called before forward");
  const int64_t B = check_matrix(dy_in, out_, "Linear::backward dy");
  DLREC_CHECK(B == x_.dim(0), "Linear::backward: dy has ", B, " rows, the forward had ", x_.dim(0));
  DLREC_CHECK(!w_.quant || !w_.quant->inference_only(), "Linear::backward: the layer serves ",
              w_.quant->kernel(), ", a form for inference only (a model prepared for serving "
              "cannot train)");
  use_single_threaded_blas();
  const int64_t in = in_, out = out_;
  const bool relu = act_ == Activation::ReLU;
  const float* dy = dy_in.data<float>();
  const float* xs = x_.data<float>();
  const float* y = y_.data<float>();
  const float* w = (wq_.defined() ? wq_ : w_.value).data<float>();
  if (relu) ensure_buffer(dz_, {B, out_});
  float* dzw = relu ? dz_.data<float>() : nullptr;
  const float* dz = relu ? dzw : dy;
  if (need_dx) {
    ensure_buffer(dx_, {B, in_});
  } else {
    dx_ = Tensor();
  }
  float* dx = need_dx ? dx_.data<float>() : nullptr;

  // One pass over fixed chunks of rows: ReLU mask, the chunk's partial bias and weight gradients
  // (a single-threaded GEMM over the chunk's rows) and the chunk's rows of dx. Then the partials
  // are added in chunk order: the result does not depend on the thread count.
  const int64_t chunks = (B + kChunkRows - 1) / kChunkRows;
  const int64_t wn = out * in;
  ensure_buffer(partial_, {std::max<int64_t>(chunks, 1), wn + out});
  float* part = partial_.data<float>();
  parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t r0 = c * kChunkRows, r1 = std::min(B, r0 + kChunkRows);
      float* pw = part + c * (wn + out);
      float* pb = pw + wn;
      std::fill(pb, pb + out, 0.f);
      for (int64_t r = r0; r < r1; ++r) {
        const float* dyr = dy + r * out;
        if (relu) {
          const float* yr = y + r * out;
          float* dzr = dzw + r * out;
          for (int64_t j = 0; j < out; ++j) {
            const float g = yr[j] > 0.f ? dyr[j] : 0.f;
            dzr[j] = g;
            pb[j] += g;
          }
        } else {
          for (int64_t j = 0; j < out; ++j) pb[j] += dyr[j];
        }
      }
      // dW_c [out, in] = dz_c^T [out, rows] x_c [rows, in]
      gemm(true, false, out, in, r1 - r0, dz + r0 * out, out, xs + r0 * in, in, pw, in);
      // dx_c [rows, in] = dz_c [rows, out] W [out, in]
      if (dx) gemm(false, false, r1 - r0, in, out, dz + r0 * out, out, w, in, dx + r0 * in, in);
    }
  });
  float* dw = w_.grad.data<float>();
  float* db = b_.grad.data<float>();
  parallel_for(0, wn + out, 4096, [&](int64_t lo, int64_t hi) {
    if (chunks == 0) {
      for (int64_t i = lo; i < hi; ++i) (i < wn ? dw[i] : db[i - wn]) = 0.f;
      return;
    }
    // Elements [lo, hi) of the concatenation [dW, db].
    auto reduce = [&](float* dst, int64_t off, int64_t a, int64_t e) {
      std::copy(part + off + a, part + off + e, dst + a);
      for (int64_t c = 1; c < chunks; ++c) {
        const float* pc = part + c * (wn + out) + off;
        for (int64_t i = a; i < e; ++i) dst[i] += pc[i];
      }
    };
    if (lo < wn) reduce(dw, 0, lo, std::min(hi, wn));
    if (hi > wn) reduce(db, wn, std::max(lo, wn) - wn, hi - wn);
  });
  if (w_.quant) w_.quant->straight_through(need_dx ? &dx_ : nullptr, w_.grad);
  return dx_;
}

}  // namespace dlrec::nn
