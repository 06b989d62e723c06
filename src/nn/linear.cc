#include "dlrec/nn/linear.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

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

void sync_blas_threads() {
  static std::atomic<int> last{0};
  const int n = num_threads();
  if (last.exchange(n) != n) openblas_set_num_threads(n);
}

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
  sync_blas_threads();
  x_ = x;
  ensure_buffer(y_, {B, out_});
  if (B == 0) return y_;
  float* y = y_.data<float>();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(B),
              static_cast<int>(out_), static_cast<int>(in_), 1.f, x.data<float>(),
              static_cast<int>(in_), w_.value.data<float>(), static_cast<int>(in_), 0.f, y,
              static_cast<int>(out_));
  // Epilogue: bias (and ReLU), one pass over y.
  const float* b = b_.value.data<float>();
  const int64_t out = out_;
  const bool relu = act_ == Activation::ReLU;
  parallel_for(0, B, std::max<int64_t>(1, 8192 / out), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* yr = y + r * out;
      if (relu) {
        for (int64_t j = 0; j < out; ++j) yr[j] = std::max(yr[j] + b[j], 0.f);
      } else {
        for (int64_t j = 0; j < out; ++j) yr[j] += b[j];
      }
    }
  });
  return y_;
}

const Tensor& Linear::backward(const Tensor& dy_in, bool need_dx) {
  DLREC_CHECK(x_.defined(), "Linear::backward called before forward");
  const int64_t B = check_matrix(dy_in, out_, "Linear::backward dy");
  DLREC_CHECK(B == x_.dim(0), "Linear::backward: dy has ", B, " rows, the forward had ",
              x_.dim(0));
  sync_blas_threads();
  const float* dy = dy_in.data<float>();
  float* db = b_.grad.data<float>();
  const int64_t out = out_;
  // The ReLU mask and the bias gradient in one pass; columns are split among threads so that
  // each bias element is summed over rows in a fixed order (thread-count independent).
  const bool relu = act_ == Activation::ReLU;
  const float* dz = dy;
  if (relu) {
    ensure_buffer(dz_, {B, out_});
    dz = dz_.data<float>();
  }
  {
    float* dzw = relu ? dz_.data<float>() : nullptr;
    const float* y = y_.data<float>();
    constexpr int64_t kCols = 16;
    const int64_t blocks = (out + kCols - 1) / kCols;
    parallel_for(0, blocks, std::max<int64_t>(1, 4096 / std::max<int64_t>(B, 1)),
                 [&](int64_t lo, int64_t hi) {
      for (int64_t blk = lo; blk < hi; ++blk) {
        const int64_t c0 = blk * kCols, c1 = std::min(out, c0 + kCols);
        float acc[kCols] = {};
        for (int64_t r = 0; r < B; ++r) {
          const float* dyr = dy + r * out;
          if (relu) {
            const float* yr = y + r * out;
            float* dzr = dzw + r * out;
            for (int64_t j = c0; j < c1; ++j) {
              const float g = yr[j] > 0.f ? dyr[j] : 0.f;
              dzr[j] = g;
              acc[j - c0] += g;
            }
          } else {
            for (int64_t j = c0; j < c1; ++j) acc[j - c0] += dyr[j];
          }
        }
        for (int64_t j = c0; j < c1; ++j) db[j] = acc[j - c0];
      }
    });
  }
  const int Bi = static_cast<int>(B), in = static_cast<int>(in_), o = static_cast<int>(out_);
  if (B == 0) {
    w_.grad.zero_();
  } else {
    // dW [out, in] = dz^T [out, B] x [B, in]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, in, Bi, 1.f, dz, o,
                x_.data<float>(), in, 0.f, w_.grad.data<float>(), in);
  }
  if (!need_dx) {
    dx_ = Tensor();
    return dx_;
  }
  ensure_buffer(dx_, {B, in_});
  if (B > 0) {
    // dx [B, in] = dz [B, out] W [out, in]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Bi, in, o, 1.f, dz, o,
                w_.value.data<float>(), in, 0.f, dx_.data<float>(), in);
  }
  return dx_;
}

}  // namespace dlrec::nn
