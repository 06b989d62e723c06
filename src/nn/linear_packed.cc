// The fp32 Linear on packed weights (dlrec/nn/linear_packed.h). Built with -ffp-contract=off
// (CMakeLists.txt): the only fused operations are the explicit FMAs of the chain, as in the
// scalar reference (std::fma); the bias is added after the chain, rounded on its own.
//
// Loop order: a task owns a block of rows and a range of panels; for each block of kKc steps
// of k it runs every (panel group, row tile) pair, keeping the running sums in y between
// blocks (an fp32 store and load are exact, so the chain is the same as one unbroken loop).
// The tile's weights (kKc x 32 floats) stay in L1 while its block's rows pass. The tiles' small
// loops carry `#pragma GCC unroll`: without it GCC 12 kept the AVX2 sums in an array on the stack
// and stored each one every step (half OpenBLAS's speed).
#include "dlrec/nn/linear_packed.h"

#include <algorithm>
#include <cmath>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define DLREC_F32_X86 1
// GCC 12's AVX-512 headers start some intrinsics from an undefined vector and then warn that it
// may be used uninitialized: a known false positive (as in compress/int8_gemm_packed.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dlrec::nn {

namespace {

constexpr int64_t kKc = 256;        // steps of k per block
constexpr int64_t kRowBlock = 48;   // rows per task (6 tiles of 8, 8 of 6)
constexpr int64_t kMinTask = 1 << 17;  // multiply-adds below which a call is not split

#ifdef DLREC_F32_X86
#define DLREC_AVX512_TARGET __attribute__((target("avx512f")))
#define DLREC_AVX2_TARGET __attribute__((target("avx2,fma")))

// ---- Avx512: panels of 32 channels = 2 vectors ----

// R rows x NP panels (panels pstride floats apart) over kn steps of k. x: the tile's first row at
// its block's first k (rows ldx apart); y likewise (rows ldy apart), all 32 NP channels real
// (run_block passes a padded copy for the last panel). first: start from 0, else from y; bias
// (non-null on the last block): add it, then ReLU.
template <int R, int NP>
DLREC_AVX512_TARGET void tile512(const float* x, int64_t ldx, const float* wp, int64_t pstride,
                                 int64_t kn, float* y, int64_t ldy, bool first, const float* bias,
                                 bool relu) {
  constexpr int V = 2 * NP;
  __m512 a[R][V];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v)
      a[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + r * ldy + 16 * v);
  for (int64_t k = 0; k < kn; ++k) {
    __m512 w[V];
    #pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      w[2 * p] = _mm512_loadu_ps(wp + p * pstride + 32 * k);
      w[2 * p + 1] = _mm512_loadu_ps(wp + p * pstride + 32 * k + 16);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
      #pragma GCC unroll 8
      for (int v = 0; v < V; ++v) a[r][v] = _mm512_fmadd_ps(xv, w[v], a[r][v]);
    }
  }
  if (bias) {
    const __m512 zero = _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m512 b = _mm512_loadu_ps(bias + 16 * v);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        a[r][v] = _mm512_add_ps(a[r][v], b);
        // max(0, v) returns its second operand for a NaN or a zero of either sign, as
        // std::max(v, 0.f) returns v: the reference's bits.
        if (relu) a[r][v] = _mm512_max_ps(zero, a[r][v]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(y + r * ldy + 16 * v, a[r][v]);
}

// ---- Avx2: panels of 16 channels = 2 vectors ----

template <int R, int NP>
DLREC_AVX2_TARGET void tile256(const float* x, int64_t ldx, const float* wp, int64_t pstride,
                               int64_t kn, float* y, int64_t ldy, bool first, const float* bias,
                               bool relu) {
  constexpr int V = 2 * NP;
  __m256 a[R][V];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v)
      a[r][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * ldy + 8 * v);
  for (int64_t k = 0; k < kn; ++k) {
    __m256 w[V];
    #pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      w[2 * p] = _mm256_loadu_ps(wp + p * pstride + 16 * k);
      w[2 * p + 1] = _mm256_loadu_ps(wp + p * pstride + 16 * k + 8);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      #pragma GCC unroll 8
      for (int v = 0; v < V; ++v) a[r][v] = _mm256_fmadd_ps(xv, w[v], a[r][v]);
    }
  }
  if (bias) {
    const __m256 zero = _mm256_setzero_ps();
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m256 b = _mm256_loadu_ps(bias + 8 * v);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        a[r][v] = _mm256_add_ps(a[r][v], b);
        if (relu) a[r][v] = _mm256_max_ps(zero, a[r][v]);  // see tile512
      }
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(y + r * ldy + 8 * v, a[r][v]);
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                        bool, const float*, bool);

// Panels per tile for R rows: enough independent sums to hide the FMA latency when the rows are
// few (one row: 8 vectors), one panel once the rows alone give enough.
constexpr int panels_for(int rows, bool wide) {
  return rows == 1 ? 4 : rows <= (wide ? 4 : 2) ? 2 : 1;
}

template <int R>
TileFn tile_for_rows(bool wide, int np) {
  if (wide) {
    static const TileFn f[4] = {tile512<R, 1>, tile512<R, 2>, tile512<R, 3>, tile512<R, 4>};
    return f[np - 1];
  }
  static const TileFn f[4] = {tile256<R, 1>, tile256<R, 2>, tile256<R, 3>, tile256<R, 4>};
  return f[np - 1];
}

TileFn tile_for(bool wide, int rows, int np) {
  switch (rows) {
    case 1: return tile_for_rows<1>(wide, np);
    case 2: return tile_for_rows<2>(wide, np);
    case 3: return tile_for_rows<3>(wide, np);
    case 4: return tile_for_rows<4>(wide, np);
    case 5: return tile_for_rows<5>(wide, np);
    case 6: return tile_for_rows<6>(wide, np);
    case 7: return tile_for_rows<7>(wide, np);
    default: return tile_for_rows<8>(wide, np);
  }
}

// Rows [r0, r1) x panels [q0, q1) of y.
void run_block(const PackedWeight& p, const float* x, int64_t r0, int64_t r1, int64_t q0,
               int64_t q1, const float* b, bool relu, float* y) {
  const bool wide = p.kernel == Fp32Kernel::Avx512;
  const int max_rows = wide ? 8 : 6;  // AVX2: 12 sums + 2 weights + 1 input in 16 registers
  const int64_t in = p.in, out = p.out, width = p.width, pstride = in * width;
  // Panels outside, row tiles inside: a panel group's kKc steps of weights stay in L1 while the
  // block's rows pass. Few rows (one tile) take several panels at once (panels_for).
  const int np_max = panels_for(static_cast<int>(std::min<int64_t>(max_rows, r1 - r0)), wide);
  for (int64_t k0 = 0; k0 < in; k0 += kKc) {
    const int64_t kn = std::min(kKc, in - k0);
    const bool first = k0 == 0, last = k0 + kn == in;
    for (int64_t q = q0; q < q1;) {
      const int np = static_cast<int>(std::min<int64_t>(np_max, q1 - q));
      const int64_t c0 = q * width;
      const float* wq = p.w.data() + q * pstride + k0 * width;
      const int64_t span = np * width, valid = std::min(span, out - c0);
      for (int64_t r = r0; r < r1; r += max_rows) {
        const int rows = static_cast<int>(std::min<int64_t>(max_rows, r1 - r));
        const TileFn tile = tile_for(wide, rows, np);
        if (valid == span) {
          tile(x + r * in + k0, in, wq, pstride, kn, y + r * out + c0, out, first,
               last ? b + c0 : nullptr, relu);
          continue;
        }
        // The last panel, past the output's channels: through a padded copy of its rows.
        float ty[8 * 128], tb[128];
        for (int i = 0; i < rows; ++i) {
          float* t = ty + i * span;
          std::fill(t, t + span, 0.f);
          if (!first) std::copy(y + (r + i) * out + c0, y + (r + i) * out + c0 + valid, t);
        }
        if (last) {
          std::fill(tb, tb + span, 0.f);
          std::copy(b + c0, b + c0 + valid, tb);
        }
        tile(x + r * in + k0, in, wq, pstride, kn, ty, span, first, last ? tb : nullptr, relu);
        for (int i = 0; i < rows; ++i)
          std::copy(ty + i * span, ty + i * span + valid, y + (r + i) * out + c0);
      }
      q += np;
    }
  }
}
#endif  // DLREC_F32_X86

void run_reference(const PackedWeight& p, const float* x, int64_t r0, int64_t r1, int64_t q0,
                   int64_t q1, const float* b, bool relu, float* y) {
  const int64_t in = p.in, out = p.out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t j = q0; j < q1; ++j) {
      const float* xr = x + r * in;
      const float* wj = p.w.data() + j * in;
      float acc = 0.f;
      for (int64_t k = 0; k < in; ++k) acc = std::fma(xr[k], wj[k], acc);
      const float v = acc + b[j];
      y[r * out + j] = relu ? std::max(v, 0.f) : v;
    }
}

}  // namespace

bool fp32_kernel_available(Fp32Kernel k) {
  switch (k) {
    case Fp32Kernel::Reference:
    case Fp32Kernel::Auto:
      return true;
#ifdef DLREC_F32_X86
    case Fp32Kernel::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Fp32Kernel::Avx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

const char* fp32_kernel_name(Fp32Kernel k) {
  switch (k) {
    case Fp32Kernel::Reference: return "reference";
    case Fp32Kernel::Avx2: return "avx2";
    case Fp32Kernel::Avx512: return "avx512";
    case Fp32Kernel::Auto: return "auto";
  }
  return "?";
}

Fp32Kernel fp32_best_kernel() {
  if (fp32_kernel_available(Fp32Kernel::Avx512)) return Fp32Kernel::Avx512;
  if (fp32_kernel_available(Fp32Kernel::Avx2)) return Fp32Kernel::Avx2;
  return Fp32Kernel::Reference;
}

std::shared_ptr<const PackedWeight> pack_weight(const Tensor& weight, Fp32Kernel k) {
  DLREC_CHECK(weight.defined() && !weight.device().is_cuda() && weight.dtype() == DType::F32 &&
                  weight.ndim() == 2,
              "pack_weight: expected a CPU f32 matrix [out, in]");
  if (k == Fp32Kernel::Auto) k = fp32_best_kernel();
  DLREC_CHECK(fp32_kernel_available(k), "fp32 Linear: this CPU cannot run the ",
              fp32_kernel_name(k), " kernel");
  auto p = std::make_shared<PackedWeight>();
  p->kernel = k;
  p->out = weight.dim(0);
  p->in = weight.dim(1);
  const float* w = weight.data<float>();
  if (k == Fp32Kernel::Reference) {
    p->w.assign(w, w + p->out * p->in);
    return p;
  }
  p->width = k == Fp32Kernel::Avx512 ? 32 : 16;
  const int64_t panels = (p->out + p->width - 1) / p->width;
  p->w.assign(static_cast<size_t>(panels * p->width * p->in), 0.f);
  for (int64_t j = 0; j < p->out; ++j) {
    float* dst = p->w.data() + (j / p->width) * p->in * p->width + j % p->width;
    for (int64_t kk = 0; kk < p->in; ++kk) dst[kk * p->width] = w[j * p->in + kk];
  }
  return p;
}

void packed_linear(const Tensor& x, const PackedWeight& w, const Tensor& bias, bool relu,
                   Tensor& y) {
  DLREC_CHECK(x.defined() && !x.device().is_cuda() && x.dtype() == DType::F32 && x.ndim() == 2 &&
                  x.dim(1) == w.in,
              "fp32 Linear: expected an input [B, ", w.in, "] (CPU f32), got ",
              x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  const int64_t B = x.dim(0);
  DLREC_CHECK(y.defined() && y.ndim() == 2 && y.dim(0) == B && y.dim(1) == w.out &&
                  y.dtype() == DType::F32 && !y.device().is_cuda(),
              "fp32 Linear: the output must be [", B, ", ", w.out, "] (CPU f32)");
  DLREC_CHECK(bias.defined() && bias.numel() == w.out && bias.dtype() == DType::F32,
              "fp32 Linear: the bias must hold ", w.out, " f32 values");
  DLREC_CHECK(fp32_kernel_available(w.kernel), "fp32 Linear: this CPU cannot run the ",
              fp32_kernel_name(w.kernel), " kernel");
  if (B == 0) return;
  const float* xs = x.data<float>();
  const float* b = bias.data<float>();
  float* ys = y.data<float>();
  // Channels are split in whole panels (Reference: single channels).
  const int64_t unit = w.width > 0 ? w.width : 1;
  const int64_t units = (w.out + unit - 1) / unit;
  const int64_t row_blocks = (B + kRowBlock - 1) / kRowBlock;
  // Tasks: every row block, and the panels split into groups while the rows alone give fewer
  // tasks than twice the threads and each task keeps at least kMinTask multiply-adds.
  const int64_t work = B * w.out * w.in;
  const int64_t want = std::clamp<int64_t>(work / kMinTask, 1, 2 * int64_t{num_threads()});
  const int64_t groups = std::clamp<int64_t>((want + row_blocks - 1) / row_blocks, 1, units);
  const int64_t per_group = (units + groups - 1) / groups;
  auto task = [&](int64_t t) {
    const int64_t rb = t / groups, g = t % groups;
    const int64_t r0 = rb * kRowBlock, r1 = std::min(B, r0 + kRowBlock);
    const int64_t q0 = g * per_group, q1 = std::min(units, q0 + per_group);
    if (q0 >= q1) return;
#ifdef DLREC_F32_X86
    if (w.kernel != Fp32Kernel::Reference) {
      run_block(w, xs, r0, r1, q0, q1, b, relu, ys);
      return;
    }
#endif
    run_reference(w, xs, r0, r1, q0, q1, b, relu, ys);
  };
  const int64_t tasks = row_blocks * groups;
  if (tasks == 1 || work < kMinTask) {
    for (int64_t t = 0; t < tasks; ++t) task(t);
    return;
  }
  parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) task(t);
  });
}

PackedLinear::PackedLinear(const Tensor& weight, Fp32Kernel k) : w_(pack_weight(weight, k)) {}

bool PackedLinear::forward(const Tensor& x, const Tensor& bias, bool relu, Tensor& y) {
  packed_linear(x, *w_, bias, relu, y);
  return true;
}

std::string PackedLinear::kernel() const {
  return std::string("fp32 ") + fp32_kernel_name(w_->kernel) + " (packed)";
}

}  // namespace dlrec::nn
