// The CUDA embedding-bag kernels (src/nn/embedding_cuda.h) against a CPU reference written
// here: pooling into rows of a wider matrix (a row stride ld > T * dim and a first column, as
// when the embedding layer writes into a concat's columns), f32 and bf16 outputs, sum and mean
// pooling over multi-hot bags (empty bags, duplicate ids, hot rows whose runs span several
// 32-id chunks), odd and float4-sized widths; the backward reading a strided f32 or bf16
// gradient, split into backward_ids + backward_apply, against the packed f32 backward_update
// (bit for bit: the same sums) and against the CPU's SGD and Adagrad updates (within
// rounding of the chunked sum), and rows that occur thousands of times against the documented
// summation order (bit for bit, computed here). Without a GPU (or in a build without CUDA)
// every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/nn/rng.h"
#include "dlrec/nn/row_quant.h"
#ifdef DLREC_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../../src/nn/embedding_cuda.h"
#endif

namespace dlrec::nn {
namespace {

#ifdef DLREC_WITH_CUDA
#define SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                        \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: embedding kernels not run"; \
  } while (0)
#else
#define SKIP_WITHOUT_GPU() GTEST_SKIP() << "built without CUDA: embedding kernels not run"
#endif

#ifdef DLREC_WITH_CUDA
namespace ce = cuda_emb;

// A device buffer holding a copy of a host vector (or n zero-filled elements).
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, sizeof(T) * (n ? n : 1)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, sizeof(T) * (n ? n : 1)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    if (n) {
      EXPECT_EQ(cudaMemcpy(p, v.data(), sizeof(T) * n, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    if (n) {
      EXPECT_EQ(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  }
};

// Host bf16 <-> float through the bit pattern (round to nearest even, as __float2bfloat16).
uint16_t to_bf16_bits(float f) {
  const __nv_bfloat16 h = __float2bfloat16(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float from_bf16_bits(uint16_t u) {
  uint32_t w = uint32_t(u) << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

// T tables of `rows[t]` rows x dim, their ids and bags, on host and device.
struct Problem {
  int T = 0, dim = 0;
  int64_t B = 0;
  std::vector<int64_t> rows;
  std::vector<uint32_t> row_base;
  std::vector<std::vector<float>> w, acc;  // per table, [rows_t * dim]
  std::vector<int32_t> offsets;            // [T * B + 1], bag = t * B + b
  std::vector<uint32_t> keys;              // row_base[t] + id
  int key_bits = 1;

  Problem(std::vector<int64_t> r, int d, int64_t b, uint64_t seed, int max_bag = 4)
      : dim(d), B(b), rows(r) {
    T = static_cast<int>(rows.size());
    Rng rng(seed);
    uint32_t total = 0;
    for (int t = 0; t < T; ++t) {
      row_base.push_back(total);
      total += static_cast<uint32_t>(rows[t]);
      std::vector<float> x(rows[t] * dim);
      for (auto& v : x) v = static_cast<float>(rng.uniform(-1, 1));
      w.push_back(x);
      acc.push_back(std::vector<float>(rows[t] * dim, 0.1f));
    }
    while (key_bits < 32 && (uint64_t{1} << key_bits) < total) ++key_bits;
    // Bags of 0..max_bag ids; table 0 (the smallest) sees its few rows hundreds of times.
    offsets.push_back(0);
    for (int t = 0; t < T; ++t)
      for (int64_t i = 0; i < B; ++i) {
        const int64_t len = rng.below(max_bag + 1);
        for (int64_t j = 0; j < len; ++j)
          keys.push_back(row_base[t] + static_cast<uint32_t>(rng.below(rows[t])));
        offsets.push_back(static_cast<int32_t>(keys.size()));
      }
  }
  int64_t nnz() const { return static_cast<int64_t>(keys.size()); }
  int bag_len(int t, int64_t b) const { return offsets[t * B + b + 1] - offsets[t * B + b]; }

  // Pooled bag (t, b) as the kernel sums it: first row, then each next one added in order,
  // scaled by 1/len once for mean bags of more than one id.
  std::vector<float> pool(int t, int64_t b, bool mean) const {
    std::vector<float> out(dim, 0.f);
    const int32_t beg = offsets[t * B + b], end = offsets[t * B + b + 1];
    for (int32_t p = beg; p < end; ++p) {
      const int64_t r = keys[p] - row_base[t];
      for (int k = 0; k < dim; ++k) out[k] = p == beg ? w[t][r * dim + k] : out[k] + w[t][r * dim + k];
    }
    if (mean && end - beg > 1) {
      const float s = 1.f / static_cast<float>(end - beg);
      for (auto& v : out) v *= s;
    }
    return out;
  }
};

// The device side of a Problem: tables, accumulators, their pointer arrays, ids, scratch.
struct DevProblem {
  std::vector<std::unique_ptr<Dev<float>>> w, acc;
  std::unique_ptr<Dev<float*>> wp, ap;
  std::unique_ptr<Dev<uint32_t>> base, keys;
  std::unique_ptr<Dev<int32_t>> offsets;
  std::unique_ptr<Dev<char>> scratch_mem;
  ce::Tables tab;
  ce::Scratch scratch;

  explicit DevProblem(const Problem& p) {
    std::vector<float*> hw, ha;
    for (int t = 0; t < p.T; ++t) {
      w.push_back(std::make_unique<Dev<float>>(p.w[t]));
      acc.push_back(std::make_unique<Dev<float>>(p.acc[t]));
      hw.push_back(w.back()->p);
      ha.push_back(acc.back()->p);
    }
    wp = std::make_unique<Dev<float*>>(hw);
    ap = std::make_unique<Dev<float*>>(ha);
    base = std::make_unique<Dev<uint32_t>>(p.row_base);
    keys = std::make_unique<Dev<uint32_t>>(p.keys);
    offsets = std::make_unique<Dev<int32_t>>(p.offsets);
    tab.weights = wp->p;
    tab.states = ap->p;
    tab.row_base = base->p;
    tab.num_tables = p.T;
    tab.dim = p.dim;
    scratch_mem = std::make_unique<Dev<char>>(ce::scratch_bytes(p.nnz(), p.key_bits, p.dim));
    scratch = ce::carve(scratch_mem->p, p.nnz(), p.key_bits, p.dim);
    ce::prepare(scratch, nullptr);
  }
  std::vector<std::vector<float>> tables() const {
    std::vector<std::vector<float>> out;
    for (const auto& x : w) out.push_back(x->get());
    return out;
  }
  std::vector<std::vector<float>> states() const {
    std::vector<std::vector<float>> out;
    for (const auto& x : acc) out.push_back(x->get());
    return out;
  }
};

struct Shape {
  std::vector<int64_t> rows;
  int dim;
  int64_t B;
  int64_t extra;  // ld = col + T * dim + extra
  int64_t col;    // first column of the pooled rows
  int max_bag = 4;  // bags of 0..max_bag ids
};

// dim 3 (scalar lanes, odd), dim 8 with an odd first column (scalar: misaligned), dim 8 and
// 36 aligned (float4 lanes; 36: more columns than one warp's float4s); long bags (up to 41 ids,
// empty ones among them: a warp's ids in several rounds of loads) of dim 128 with 37 samples (a
// warp's bags in two tables) and of dim 8 with 3 samples (in several).
const Shape kShapes[] = {{{5, 40, 1000}, 3, 70, 2, 1},
                         {{3, 17, 200, 9}, 8, 50, 3, 5},
                         {{4, 100}, 8, 90, 4, 8},
                         {{7, 300, 11}, 36, 45, 0, 4},
                         {{6, 500, 30}, 128, 37, 0, 0, 41},
                         {{50, 9, 20}, 8, 3, 4, 4, 20}};
#endif

TEST(EmbeddingCuda, StridedForwardMatchesCpuF32AndBf16) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  int checked = 0;
  for (const Shape& sh : kShapes)
    for (bool mean : {false, true})
      for (bool ordered : {false, true}) {  // forward's order: the tables' warps by ids, most first
        Problem p(sh.rows, sh.dim, sh.B, 11 + sh.dim, sh.max_bag);
        DevProblem d(p);
        Dev<int32_t> order(std::vector<int32_t>(p.T, -1));
        const int64_t width = int64_t(p.T) * p.dim, ld = sh.col + width + sh.extra;
        const float sentinel = 1234.5f;  // exact in f32; in bf16 it is 1232
        const uint16_t sentinel16 = to_bf16_bits(sentinel);
        Dev<float> out32(std::vector<float>(p.B * ld, sentinel));
        Dev<uint16_t> out16(std::vector<uint16_t>(p.B * ld, sentinel16));
        int32_t* scratch = ordered ? order.p : nullptr;
        ce::forward(d.tab, d.offsets->p, d.keys->p, p.B, mean, out32.p + sh.col, nullptr, ld,
                    scratch);
        ce::forward(d.tab, d.offsets->p, d.keys->p, p.B, mean,
                    reinterpret_cast<__nv_bfloat16*>(out16.p) + sh.col, nullptr, ld, scratch);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto o32 = out32.get();
        const auto o16 = out16.get();
        if (ordered) {  // a permutation of the tables, by their ids in the batch, most first
          const auto o = order.get();
          std::vector<int> seen(p.T, 0);
          int64_t prev = INT64_MAX;
          for (int32_t t : o) {
            ASSERT_TRUE(t >= 0 && t < p.T && !seen[t]++) << "order is not a permutation";
            const int64_t n = p.offsets[(t + 1) * p.B] - p.offsets[t * p.B];
            ASSERT_LE(n, prev) << "table " << t << " after one with fewer ids";
            prev = n;
          }
        }
        for (int64_t b = 0; b < p.B; ++b) {
          for (int64_t c = 0; c < ld; ++c) {
            if (c >= sh.col && c < sh.col + width) continue;
            ASSERT_EQ(o32[b * ld + c], sentinel) << "column " << c << " outside the pooled ones";
            ASSERT_EQ(o16[b * ld + c], sentinel16) << "bf16, column " << c;
          }
          for (int t = 0; t < p.T; ++t) {
            const auto ref = p.pool(t, b, mean);
            for (int k = 0; k < p.dim; ++k) {
              const int64_t at = b * ld + sh.col + int64_t(t) * p.dim + k;
              ASSERT_EQ(o32[at], ref[k]) << "dim " << p.dim << " bag (" << t << ", " << b << ")"
                                         << (ordered ? ", tables in order of ids" : "");
              ASSERT_EQ(o16[at], to_bf16_bits(ref[k])) << "bf16, bag (" << t << ", " << b << ")";
              ++checked;
            }
          }
        }
      }
  EXPECT_GT(checked, 10000);
#endif
}

// Row-wise quantized tables (Tables::codes, serving): every table served from 8-bit codes, every
// one from 4-bit codes (fp16-valued scales and biases), or a mix of both beside fp32 tables (the
// kernel's three forms: Tables::quant_bits 8, 4 and 0), multi-hot bags, sum
// and mean, f32 and bf16 outputs, odd and float4-sized widths: the pooled rows are bit for bit
// those of fp32 tables holding the codes' values (nn::row_quant_dequantize, the CPU reference;
// the CPU embedding bag serves codes the same way, tests/nn), through both kernels' forms.
TEST(EmbeddingCuda, QuantizedTablesPoolLikeTheirValues) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  // kShapes, plus widths 32 and 128 (forward_quant16: 2 and 8 lanes per row of codes).
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({{5, 300, 40}, 32, 70, 4, 8});
  shapes.push_back({{9, 2000}, 128, 33, 0, 0});
  int checked = 0;
  for (const Shape& sh : shapes)
    for (int mix : {0, 8, 4})
    for (bool mean : {false, true}) {
      Problem p(sh.rows, sh.dim, sh.B, 29 + sh.dim, sh.max_bag);
      Rng rng(7 + sh.dim);
      std::vector<std::unique_ptr<Dev<uint8_t>>> codes;
      std::vector<const uint8_t*> hc;
      std::vector<int32_t> bits;
      for (int t = 0; t < p.T; ++t) {
        // 0: 8 bits, 1: fp32 rows, 2: 4 bits with fp16 scale/bias
        const int kind = mix == 8 ? 0 : mix == 4 ? 2 : t % 3;
        if (kind == 1) {
          hc.push_back(nullptr);
          bits.push_back(0);
          continue;
        }
        RowQuantRows q;
        q.rows = p.rows[t];
        q.dim = p.dim;
        q.bits = kind == 0 ? 8 : 4;
        q.fp16 = kind == 2;
        q.codes.resize(static_cast<size_t>(q.rows * q.row_bytes()));
        for (auto& c : q.codes) c = static_cast<uint8_t>(rng.below(256));
        if (q.bits == 4 && p.dim % 2)  // an odd width's unused high nibble is 0
          for (int64_t r = 0; r < q.rows; ++r) q.codes[(r + 1) * q.row_bytes() - 1] &= 15;
        for (int64_t r = 0; r < q.rows; ++r) {
          float s = static_cast<float>(rng.uniform(0, 0.02)), b = static_cast<float>(rng.uniform(-1, 1));
          if (q.fp16) {  // fp16 values (round to nearest)
            s = __half2float(__float2half_rn(s));
            b = __half2float(__float2half_rn(b));
          }
          q.scale.push_back(s);
          q.bias.push_back(b);
        }
        check_row_quant(q, "test table");
        for (int64_t r = 0; r < q.rows; ++r) row_quant_dequantize(q, r, p.w[t].data() + r * p.dim);
        // The device layout: rows of codes, then scale and bias.
        std::vector<uint8_t> rows(static_cast<size_t>(q.rows * ce::quant_row_stride(q.dim, q.bits)));
        ce::pack_quant_rows(q, 0, q.rows, rows.data());
        codes.push_back(std::make_unique<Dev<uint8_t>>(rows));
        hc.push_back(codes.back()->p);
        bits.push_back(q.bits);
      }
      DevProblem d(p);  // fp32 copies of every table; the quantized ones are not read
      std::vector<float*> hw;
      for (int t = 0; t < p.T; ++t) hw.push_back(hc[t] ? nullptr : d.w[t]->p);
      Dev<float*> wp(hw);
      Dev<const uint8_t*> cp(hc);
      Dev<int32_t> bp(bits);
      ce::Tables tab = d.tab;
      tab.weights = wp.p;
      tab.codes = cp.p;
      tab.qbits = bp.p;
      tab.quant_bits = mix;
      const int64_t width = int64_t(p.T) * p.dim, ld = sh.col + width + sh.extra;
      Dev<float> out32(p.B * ld);
      Dev<uint16_t> out16(p.B * ld);
      ce::forward(tab, d.offsets->p, d.keys->p, p.B, mean, out32.p + sh.col, nullptr, ld);
      ce::forward(tab, d.offsets->p, d.keys->p, p.B, mean,
                  reinterpret_cast<__nv_bfloat16*>(out16.p) + sh.col, nullptr, ld);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto o32 = out32.get();
      const auto o16 = out16.get();
      for (int64_t b = 0; b < p.B; ++b)
        for (int t = 0; t < p.T; ++t) {
          const auto ref = p.pool(t, b, mean);
          for (int k = 0; k < p.dim; ++k) {
            const int64_t at = b * ld + sh.col + int64_t(t) * p.dim + k;
            ASSERT_EQ(o32[at], ref[k])
                << "mix " << mix << " dim " << p.dim << " bag (" << t << ", " << b << ")";
            ASSERT_EQ(o16[at], to_bf16_bits(ref[k])) << "bf16, bag (" << t << ", " << b << ")";
            ++checked;
          }
        }
    }
  EXPECT_GT(checked, 30000);
#endif
}

// The device layout of quantized rows: codes, zero padding to 8 bytes, scale, bias.
TEST(EmbeddingCuda, QuantizedRowLayout) {
#ifdef DLREC_WITH_CUDA
  EXPECT_EQ(ce::quant_row_stride(128, 8), 136);
  EXPECT_EQ(ce::quant_row_stride(128, 4), 72);
  EXPECT_EQ(ce::quant_row_stride(5, 8), 16);
  EXPECT_EQ(ce::quant_row_stride(5, 4), 16);
  EXPECT_EQ(ce::quant_row_stride(16, 4), 16);
  RowQuantRows q;
  q.rows = 2;
  q.dim = 5;
  q.bits = 8;
  q.codes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  q.scale = {0.5f, 0.25f};
  q.bias = {-1.f, 2.f};
  std::vector<uint8_t> rows(32, 0xee);
  ce::pack_quant_rows(q, 1, 1, rows.data());
  const std::vector<uint8_t> codes(rows.begin(), rows.begin() + 8);
  EXPECT_EQ(codes, (std::vector<uint8_t>{6, 7, 8, 9, 10, 0, 0, 0}));
  float sb[2];
  std::memcpy(sb, rows.data() + 8, sizeof sb);
  EXPECT_EQ(sb[0], 0.25f);
  EXPECT_EQ(sb[1], 2.f);
  EXPECT_EQ(rows[16], 0xee);  // one row written
#else
  GTEST_SKIP() << "built without CUDA: the device layout not built";
#endif
}

// The packed default (ld 0) is the layout [B, T, dim].
TEST(EmbeddingCuda, PackedForwardIsStrideTimesDim) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  Problem p({6, 30}, 5, 40, 3);
  DevProblem d(p);
  const int64_t width = int64_t(p.T) * p.dim;
  Dev<float> packed(p.B * width), strided(p.B * width);
  ce::forward(d.tab, d.offsets->p, d.keys->p, p.B, true, packed.p, nullptr);
  ce::forward(d.tab, d.offsets->p, d.keys->p, p.B, true, strided.p, nullptr, width);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto a = packed.get();
  EXPECT_EQ(a, strided.get());
  for (int64_t b = 0; b < p.B; ++b)
    for (int t = 0; t < p.T; ++t) {
      const auto ref = p.pool(t, b, true);
      for (int k = 0; k < p.dim; ++k) ASSERT_EQ(a[(b * p.T + t) * p.dim + k], ref[k]);
    }
#endif
}

// The forward pools several consecutive bags per warp; with fewer samples than that, one warp's
// bags lie in several tables (and the last warp's run past the end).
TEST(EmbeddingCuda, ForwardWithFewSamplesPerTable) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  int checked = 0;
  for (int64_t B : {1, 2, 3, 5})
    for (int dim : {8, 3})
      for (bool mean : {false, true}) {
        Problem p({5, 40, 1000, 7, 9}, dim, B, 17 + B);
        DevProblem d(p);
        const int64_t width = int64_t(p.T) * p.dim;
        Dev<float> out(std::vector<float>(p.B * width, 99.f));
        ce::forward(d.tab, d.offsets->p, d.keys->p, p.B, mean, out.p, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto a = out.get();
        for (int64_t b = 0; b < p.B; ++b)
          for (int t = 0; t < p.T; ++t) {
            const auto ref = p.pool(t, b, mean);
            for (int k = 0; k < p.dim; ++k) {
              ASSERT_EQ(a[(b * p.T + t) * p.dim + k], ref[k])
                  << "B " << B << " dim " << dim << " bag (" << t << ", " << b << ")";
              ++checked;
            }
          }
      }
  EXPECT_EQ(checked, 2 * 5 * (1 + 2 + 3 + 5) * (8 + 3));
#endif
}

TEST(EmbeddingCuda, StrideBelowWidthIsAnError) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  Problem p({6, 30}, 4, 8, 3);
  DevProblem d(p);
  Dev<float> out(p.B * 8);
  EXPECT_THROW(ce::forward(d.tab, d.offsets->p, d.keys->p, p.B, false, out.p, nullptr, 7),
               std::exception);
  Dev<float> lr(std::vector<float>{0.1f});
  ce::backward_ids(d.tab, d.offsets->p, d.keys->p, p.B, p.nnz(), p.key_bits, d.scratch, nullptr);
  EXPECT_THROW(ce::backward_apply(d.tab, d.offsets->p, p.B, p.nnz(), false, out.p, 7,
                                  ce::Update::SGD, lr.p, 1e-8f, d.scratch, nullptr),
               std::exception);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d.tables(), p.w) << "a refused update must leave the tables alone";
#endif
}

// backward_ids + backward_apply reading a strided gradient (f32, or bf16 widened on load) give
// the same tables and accumulators bit for bit as backward_update on a packed f32 copy of the
// same values, and both follow the CPU's update (the gradient of each row summed over its
// occurrences, mean bags scaled by 1/len) within the rounding of the chunked sums.
TEST(EmbeddingCuda, StridedBackwardMatchesPackedAndCpu) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  int compared = 0;
  for (const Shape& sh : kShapes)
    for (bool mean : {false, true})
      for (auto kind : {ce::Update::SGD, ce::Update::Adagrad})
        for (bool bf16 : {false, true}) {
          Problem p(sh.rows, sh.dim, sh.B, 29 + sh.dim, sh.max_bag);
          const int64_t width = int64_t(p.T) * p.dim, ld = sh.col + width + sh.extra;
          // The gradient: random values in the pooled columns (bf16-representable, so the
          // packed f32 copy holds the very values the bf16 path widens), garbage elsewhere.
          Rng rng(5 + sh.dim + (mean ? 1 : 0));
          std::vector<float> g(p.B * ld), packed(p.B * width);
          for (int64_t b = 0; b < p.B; ++b)
            for (int64_t c = 0; c < ld; ++c) {
              float v = static_cast<float>(rng.uniform(-1, 1));
              if (bf16) v = from_bf16_bits(to_bf16_bits(v));
              const bool pooled = c >= sh.col && c < sh.col + width;
              g[b * ld + c] = pooled ? v : 1e30f;
              if (pooled) packed[b * width + (c - sh.col)] = v;
            }
          std::vector<uint16_t> g16(g.size());
          for (size_t i = 0; i < g.size(); ++i) g16[i] = to_bf16_bits(g[i]);
          Dev<float> lr(std::vector<float>{0.05f});
          const float eps = 1e-8f;

          DevProblem ref(p), strided(p);
          Dev<float> dpacked(packed);
          ce::backward_update(ref.tab, ref.offsets->p, ref.keys->p, p.B, p.nnz(), mean,
                              dpacked.p, kind, lr.p, eps, p.key_bits, ref.scratch, nullptr);
          Dev<float> d32(g);
          Dev<uint16_t> d16(g16);
          ce::backward_ids(strided.tab, strided.offsets->p, strided.keys->p, p.B, p.nnz(),
                           p.key_bits, strided.scratch, nullptr);
          if (bf16)
            ce::backward_apply(strided.tab, strided.offsets->p, p.B, p.nnz(), mean,
                               reinterpret_cast<const __nv_bfloat16*>(d16.p) + sh.col, ld, kind,
                               lr.p, eps, strided.scratch, nullptr);
          else
            ce::backward_apply(strided.tab, strided.offsets->p, p.B, p.nnz(), mean,
                               d32.p + sh.col, ld, kind, lr.p, eps, strided.scratch, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto wr = ref.tables(), ws = strided.tables();
          ASSERT_EQ(ws, wr) << "dim " << p.dim << " mean " << mean << " bf16 " << bf16;
          if (kind == ce::Update::Adagrad) {
            ASSERT_EQ(strided.states(), ref.states());
          }

          // The CPU's update, summing in double.
          for (int t = 0; t < p.T; ++t) {
            std::vector<double> gr(p.rows[t] * p.dim, 0.0);
            std::vector<bool> hit(p.rows[t], false);
            for (int64_t b = 0; b < p.B; ++b) {
              const int len = p.bag_len(t, b);
              const double sc = mean ? 1.0 / len : 1.0;
              for (int32_t q = p.offsets[t * p.B + b]; q < p.offsets[t * p.B + b + 1]; ++q) {
                const int64_t r = p.keys[q] - p.row_base[t];
                hit[r] = true;
                for (int k = 0; k < p.dim; ++k)
                  gr[r * p.dim + k] += sc * packed[b * width + int64_t(t) * p.dim + k];
              }
            }
            for (int64_t r = 0; r < p.rows[t]; ++r)
              for (int k = 0; k < p.dim; ++k) {
                const int64_t i = r * p.dim + k;
                double want = p.w[t][i];
                if (hit[r]) {
                  if (kind == ce::Update::SGD) {
                    want -= 0.05 * gr[i];
                  } else {
                    const double a = 0.1 + gr[i] * gr[i];
                    want -= 0.05 * gr[i] / (std::sqrt(a) + eps);
                  }
                } else {
                  ASSERT_EQ(ws[t][i], p.w[t][i]) << "a row the batch did not touch changed";
                }
                ASSERT_NEAR(ws[t][i], want, 1e-5 + 1e-5 * std::fabs(want))
                    << "table " << t << " row " << r << " col " << k;
                ++compared;
              }
          }
        }
  EXPECT_GT(compared, 100000);
#endif
}

// Rows that occur thousands of times (a 2-row and a 3-row table: runs of hundreds of 32-id
// chunks, the finalize's chunk search and batched loads) and rows that occur a few times, next
// to a table where most rows occur once: the update must equal, bit for bit, the order the
// header documents, computed here on the host in float: the ids sorted stably by row, cut into
// chunks of 32; each run's piece in a chunk summed in order (g += scale * x from 0), the pieces
// added in chunk order, except that a run's whole groups of 64 chunks (aligned to 64, after its
// first chunk and before its last) are first summed from 0 in chunk order and that sum added
// (the group pass of long runs); times gscale, then SGD or Adagrad in float. A gscale of 0 leaves
// the tables and accumulators alone. Row-wise Adagrad (one accumulator per row: the first rows_t
// values of the table's accumulator array here) sums each row the same way, then adds its
// squares in double (the warp's order, not the host's: within 1e-6 of the host's update).
// The first chunk at or after c0 + 1 that begins a group of 64 chunks.
int64_t k_group_first(int64_t c0) { return (c0 + 1 + 63) / 64 * 64; }

TEST(EmbeddingCuda, LongRunsFollowTheDocumentedOrderBitForBit) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  int64_t long_runs = 0, grouped_runs = 0, compared = 0;
  for (int dim : {8, 3})
    for (bool mean : {false, true})
      for (auto kind : {ce::Update::SGD, ce::Update::Adagrad, ce::Update::RowWiseAdagrad,
                        ce::Update::Adam, ce::Update::Momentum})
        for (float gscale : {1.f, 0.5f, 0.f}) {
          const bool rowwise = kind == ce::Update::RowWiseAdagrad;
          const bool adam = kind == ce::Update::Adam;
          const int64_t sw = 2 * int64_t(dim) + 1;  // Adam's state per row: m, v, t
          const float b1 = 0.8f, b2 = 0.99f;
          const bool momentum = kind == ce::Update::Momentum;
          const float mu = 0.9f;  // Nesterov's form when dim is 3
          Problem p({2, 3, 60, 5000}, dim, 6000, 71 + dim);
          Rng arng(5 + dim);
          for (int t = 0; t < p.T && adam; ++t) {  // m, v and step counts 0, 1, 2 (fresh rows too)
            p.acc[t].assign(p.rows[t] * sw, 0.f);
            for (int64_t r = 0; r < p.rows[t]; ++r)
              for (int64_t k = 0; k < sw; ++k)
                p.acc[t][r * sw + k] = static_cast<float>(k < dim       ? arng.uniform(-0.1, 0.1)
                                                          : k < 2 * dim ? arng.uniform(0, 0.2)
                                                                        : double(arng.below(3)));
          }
          const int64_t width = int64_t(p.T) * dim, col = 4, ld = col + width + 4;
          Rng rng(3 + dim);
          std::vector<uint16_t> g16(p.B * ld);
          for (auto& v : g16) v = to_bf16_bits(static_cast<float>(rng.uniform(-1, 1)));
          const float lr = 0.05f, eps = 1e-8f;
          Dev<float> d_lr(std::vector<float>{lr}), d_gs(std::vector<float>{gscale});
          Dev<uint16_t> d16(g16);
          DevProblem d(p);
          d.tab.beta1 = b1;
          d.tab.beta2 = b2;
          d.tab.momentum = mu;
          d.tab.nesterov = dim == 3;
          ce::backward_ids(d.tab, d.offsets->p, d.keys->p, p.B, p.nnz(), p.key_bits, d.scratch,
                           nullptr);
          ce::backward_apply(d.tab, d.offsets->p, p.B, p.nnz(), mean,
                             reinterpret_cast<const __nv_bfloat16*>(d16.p) + col, ld, kind,
                             d_lr.p, eps, d.scratch, nullptr, d_gs.p);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto ws = d.tables(), as = d.states();

          // Host: positions sorted stably by row.
          std::vector<int32_t> bag_of(p.nnz());
          for (int64_t bag = 0; bag < p.T * p.B; ++bag)
            for (int32_t q = p.offsets[bag]; q < p.offsets[bag + 1]; ++q)
              bag_of[q] = static_cast<int32_t>(bag);
          std::vector<int32_t> order(p.nnz());
          for (int64_t i = 0; i < p.nnz(); ++i) order[i] = static_cast<int32_t>(i);
          std::stable_sort(order.begin(), order.end(),
                           [&](int32_t x, int32_t y) { return p.keys[x] < p.keys[y]; });
          auto w = p.w;
          auto acc = p.acc;
          for (int64_t i = 0; i < p.nnz();) {
            int64_t j = i + 1;
            while (j < p.nnz() && p.keys[order[j]] == p.keys[order[i]]) ++j;
            if ((j - 1) / 32 - i / 32 >= 2) ++long_runs;
            const int32_t bag0 = bag_of[order[i]];
            const int t = static_cast<int>(bag0 / p.B);
            const int64_t r = p.keys[order[i]] - p.row_base[t];
            const int64_t c0 = i / 32, ce = (j - 1) / 32;
            constexpr int64_t kGroup = 64;
            if (k_group_first(c0) + kGroup < ce) ++grouped_runs;
            std::vector<float> row_g(dim);  // row-wise: the row's summed gradient
            for (int k = 0; k < dim; ++k) {
              std::vector<float> pieces;  // the run's piece in each of its chunks c0 .. ce
              float piece = 0.f;
              for (int64_t q = i; q < j; ++q) {
                const int32_t bag = bag_of[order[q]];
                const int64_t b = bag - int64_t(t) * p.B;
                const float sc =
                    mean ? 1.f / static_cast<float>(p.offsets[bag + 1] - p.offsets[bag]) : 1.f;
                const float x = from_bf16_bits(g16[b * ld + col + int64_t(t) * dim + k]);
                const float prod = sc * x;
                piece = piece + prod;
                if (q + 1 == j || (q + 1) % 32 == 0) {  // the piece ends with the run or chunk
                  pieces.push_back(piece);
                  piece = 0.f;
                }
              }
              float total = pieces[0];
              int64_t cc = c0 + 1;
              const int64_t gfirst = k_group_first(c0);
              if (gfirst + kGroup < ce) {
                for (; cc < gfirst; ++cc) total = total + pieces[cc - c0];
                for (; cc + kGroup < ce; cc += kGroup) {
                  float group = 0.f;
                  for (int64_t u = 0; u < kGroup; ++u) group = group + pieces[cc + u - c0];
                  total = total + group;
                }
              }
              for (; cc <= ce; ++cc) total = total + pieces[cc - c0];
              if (gscale == 0.f) continue;
              float gv = total;
              if (gscale != 1.f) gv = gv * gscale;
              float& wv = w[t][r * dim + k];
              if (rowwise) {
                row_g[k] = gv;
              } else if (adam) {  // nn/optimizer.cc's update_row, the row's old step count
                float* s = acc[t].data() + r * sw;
                float tt = s[2 * dim];
                if (tt < 16777216.f) tt += 1.f;
                const float c1 = 1.f - static_cast<float>(std::pow(double(b1), double(tt)));
                const float c2 = 1.f - static_cast<float>(std::pow(double(b2), double(tt)));
                const float step = lr / c1, rc2 = 1.f / std::sqrt(c2);
                s[k] = b1 * s[k] + (1.f - b1) * gv;
                s[dim + k] = b2 * s[dim + k] + (1.f - b2) * gv * gv;
                wv -= step * s[k] / (std::sqrt(s[dim + k]) * rc2 + eps);
              } else if (momentum) {  // the velocity starts at the problem's 0.1
                float& bv = acc[t][r * dim + k];
                const float prod = mu * bv;
                bv = prod + gv;
                const float u = dim == 3 ? gv + mu * bv : bv;
                const float step = lr * u;
                wv = wv - step;
              } else if (kind == ce::Update::SGD) {
                const float step = lr * gv;
                wv = wv - step;
              } else {
                float& av = acc[t][r * dim + k];
                const float sq = gv * gv;
                av = av + sq;
                const float num = lr * gv, den = std::sqrt(av) + eps;
                wv = wv - num / den;
              }
            }
            if (adam && gscale != 0.f) {
              float& tt = acc[t][r * sw + 2 * dim];
              if (tt < 16777216.f) tt += 1.f;
            }
            if (rowwise && gscale != 0.f) {
              double sq = 0;
              for (int k = 0; k < dim; ++k) sq += double(row_g[k]) * row_g[k];
              float& av = acc[t][r];
              av = av + static_cast<float>(sq / dim);
              const float mult = lr / (std::sqrt(av) + eps);
              for (int k = 0; k < dim; ++k) w[t][r * dim + k] -= mult * row_g[k];
            }
            i = j;
          }
          for (int t = 0; t < p.T && (rowwise || adam); ++t) {
            for (size_t x = 0; x < w[t].size(); ++x)
              ASSERT_NEAR(ws[t][x], w[t][x], 1e-6 * (1 + std::fabs(w[t][x])))
                  << (adam ? "Adam" : "row-wise") << " weights, table " << t << " value " << x
                  << " dim " << dim << " gscale " << gscale;
            for (size_t x = 0; x < acc[t].size(); ++x)  // past rows_t: untouched
              ASSERT_NEAR(as[t][x], acc[t][x], 1e-6 * (1 + std::fabs(acc[t][x])))
                  << (adam ? "Adam" : "row-wise") << " states, table " << t << " value " << x;
            compared += static_cast<int64_t>(w[t].size());
          }
          for (int t = 0; t < p.T && !rowwise && !adam; ++t) {
            ASSERT_EQ(ws[t], w[t]) << "weights, table " << t << " dim " << dim << " mean " << mean
                                   << " kind " << static_cast<int>(kind) << " gscale " << gscale;
            ASSERT_EQ(as[t], acc[t]) << "accumulators, table " << t;
            compared += static_cast<int64_t>(w[t].size());
          }
        }
  EXPECT_GT(long_runs, 100) << "the case must have runs over several chunks";
  EXPECT_GT(grouped_runs, 10) << "the case must have runs over whole groups of 64 chunks";
  EXPECT_GT(compared, 600000);
#endif
}

}  // namespace
}  // namespace dlrec::nn
