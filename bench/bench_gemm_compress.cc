// Speed of the MLP and cross GEMMs of the MLPerf DLRM and DCNv2 models in the compressed forms
// of issue 21, against the dense bf16 cuBLASLt GEMM the engine runs today, on one GPU:
//   dense bf16 / fp16 / int8 (cuBLASLt: src/nn/lt_gemm.h; int8 with int32 accumulation and an
//   int8 output requantized in the epilogue) and 2:4 sparse bf16 / fp16 / int8 (cuSPARSELt:
//   src/nn/gemm_2_4_cuda.h), every GEMM Y [batch, out] = X [batch, in] W^T with W 2:4-pruned.
//
//   bench_gemm_compress [--batches 8192,32768,65536] [--iters 30] [--reps 5] [--model all]
//
// Each figure is the median over --reps of the mean time of --iters back-to-back GEMMs (CUDA
// events), after the plans are chosen by timing (both libraries) and a warm-up. A check per
// shape compares the sparse outputs with the dense ones on the same pruned weights (bf16: max
// relative difference; int8: the count of differing outputs). One line per shape and batch,
// and a line `RESULT {json}` for scripts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mlperf_gemm_shapes.h"

#ifdef DLREC_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dlrec/core/gpu_resources.h"
#include "nn/gemm_2_4_cuda.h"
#include "nn/lt_gemm.h"
#endif

namespace {

using GemmShape = dlrec_bench::GemmShape;
const auto& kShapes = dlrec_bench::kMlperfGemms;

#ifdef DLREC_WITH_CUDA

using dlrec::nn::cuda_lt::Epi;
using dlrec::nn::cuda_lt::Gemm;
using dlrec::nn::cuda_lt::Lt;
namespace sp = dlrec::nn::cuda_sparse;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gemm_compress: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// W [out, in] with the 2 smallest |w| of each group of 4 along `in` zeroed (the tail of a row
// shorter than 4 kept dense: such shapes have no 2:4 form and are reported as such).
std::vector<float> pruned_weight(int64_t out, int64_t in, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f / std::sqrt(float(in)));
  std::vector<float> w(out * in);
  for (auto& x : w) x = nd(rng);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t g = 0; g + 4 <= in; g += 4) {
      float* q = &w[r * in + g];
      int idx[4] = {0, 1, 2, 3};
      std::sort(idx, idx + 4, [&](int a, int b) { return std::fabs(q[a]) < std::fabs(q[b]); });
      q[idx[0]] = q[idx[1]] = 0.f;
    }
  return w;
}

template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  check(cudaMalloc(&d, h.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

template <class T, class F>
std::vector<T> convert(const std::vector<float>& v, F f) {
  std::vector<T> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f(v[i]);
  return o;
}

int8_t to_i8(float x, float scale) {
  return static_cast<int8_t>(std::max(-127.f, std::min(127.f, std::nearbyint(x / scale))));
}

// Median over reps of the mean ms of `iters` calls of fn.
template <class F>
double time_ms(F fn, int iters, int reps, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(e0, s), "record");
    for (int i = 0; i < iters; ++i) fn();
    check(cudaEventRecord(e1, s), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    v.push_back(double(ms) / iters);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(int argc, char** argv) {
  std::vector<int64_t> batches = {8192, 32768, 65536};
  int iters = 30, reps = 5;
  std::string model = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--batches" && v)
      batches = dlrec_bench::parse_positive_list(argv[++i], "bench_gemm_compress");
    else if (a == "--iters" && v)
      iters = std::atoi(argv[++i]);
    else if (a == "--reps" && v)
      reps = std::atoi(argv[++i]);
    else if (a == "--model" && v)
      model = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: bench_gemm_compress [--batches 8192,32768,65536] "
                   "[--iters 30] [--reps 5] [--model all|dlrm|dcnv2]\n");
      return 2;
    }
  }
  if (iters <= 0 || reps <= 0 || (model != "all" && model != "dlrm" && model != "dcnv2")) {
    std::fprintf(stderr,
                 "bench_gemm_compress: --iters and --reps must be > 0, --model "
                 "all|dlrm|dcnv2\n");
    return 2;
  }
  std::string why;
  const bool sparse_ok = sp::available(&why);
  if (!sparse_ok) std::printf("2:4 GEMMs unavailable: %s\n", why.c_str());
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("device %s, batches", prop.name);
  for (auto b : batches) std::printf(" %lld", static_cast<long long>(b));
  std::printf(", %d iters x %d reps (median)\n", iters, reps);
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  auto res = dlrec::gpu::DeviceResources::get(0);
  Lt lt(res->blas_lt(), /*tune=*/true);
  // Which int8 epilogue forms cuBLASLt offers here (the engine's int8 layer uses the first
  // that exists: docs/COMPRESSION.md), on a 1024 x 1024 layer at 8192 rows.
  {
    struct Form {
      const char* name;
      cudaDataType_t d;
      bool vec;
      Epi epi;
    };
    const Form forms[] = {
        {"int8 out, scalar alpha", CUDA_R_8I, false, Epi::None},
        {"int8 out, scalar alpha, bias+relu", CUDA_R_8I, false, Epi::ReluBias},
        {"int8 out, alpha vector", CUDA_R_8I, true, Epi::None},
        {"int8 out, alpha vector, bias+relu", CUDA_R_8I, true, Epi::ReluBias},
        {"bf16 out, scalar alpha", CUDA_R_16BF, false, Epi::None},
        {"bf16 out, alpha vector", CUDA_R_16BF, true, Epi::None},
        {"bf16 out, alpha vector, f32 bias+relu", CUDA_R_16BF, true, Epi::ReluBias},
        {"f32 out, scalar alpha", CUDA_R_32F, false, Epi::None},
        {"int32 out", CUDA_R_32I, false, Epi::None}};
    for (const Form& f : forms) {
      Gemm g = Gemm::shape(true, false, 1024, 8192, 1024, 1024, 1024, 1024);
      g.ab_type = CUDA_R_8I;
      g.d_type = f.d;
      g.alpha_vector = f.vec;
      g.epi = f.epi;
      g.bias_f32 = f.epi != Epi::None && f.d != CUDA_R_8I;
      std::printf("cuBLASLt int8 form: %-40s %s\n", f.name, lt.supported(g) ? "yes" : "no");
    }
  }
  std::mt19937 rng(7);
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  std::printf("%-6s %-9s %5s %5s %6s | %8s %8s %8s | %8s %8s %8s | %5s %5s %5s %5s | check\n",
              "model", "layer", "out", "in", "batch", "bf16", "fp16", "int8", "24bf16", "24fp16",
              "24int8", "x24bf", "x24fp", "xi8", "x24i8");
  for (const GemmShape& sh : kShapes) {
    if (model != "all" && model != sh.model) continue;
    const int64_t N = sh.out, K = sh.in;
    const std::vector<float> wf = pruned_weight(N, K, rng);
    std::uniform_real_distribution<float> ud(-1.f, 1.f);
    std::vector<float> xf(max_batch * K);
    for (auto& x : xf) x = ud(rng);
    const float wscale = 3.f / std::sqrt(float(K)) / 127.f, xscale = 1.f / 127.f;
    auto* w_bf = upload(convert<__nv_bfloat16>(wf, [](float x) { return __float2bfloat16(x); }));
    auto* w_h = upload(convert<__half>(wf, [](float x) { return __float2half(x); }));
    auto* w_i8 = upload(convert<int8_t>(wf, [&](float x) { return to_i8(x, wscale); }));
    auto* x_bf = upload(convert<__nv_bfloat16>(xf, [](float x) { return __float2bfloat16(x); }));
    auto* x_h = upload(convert<__half>(xf, [](float x) { return __float2half(x); }));
    auto* x_i8 = upload(convert<int8_t>(xf, [&](float x) { return to_i8(x, xscale); }));
    void *y1 = nullptr, *y2 = nullptr;
    check(cudaMalloc(&y1, max_batch * N * 2), "cudaMalloc");
    check(cudaMalloc(&y2, max_batch * N * 2), "cudaMalloc");
    // The int8 outputs' requantizing scale: y = acc * wscale * xscale / yscale, yscale such that
    // a typical output (|y| ~ 1) spans a good part of int8.
    const float alpha = wscale * xscale / (2.f / 127.f);
    std::unique_ptr<sp::Gemm24> g_bf, g_h, g_i8;
    // [0]: feature-major activations, [1]: row-major in, feature-major out (sp::Layout)
    std::unique_ptr<sp::Gemm24> f_bf[2], f_h[2], f_i8[2], f_i8b[2];  // f_i8b: int8 -> bf16
    std::string sparse_note;
    if (sparse_ok && K % 16 == 0) {
      try {
        g_bf = std::make_unique<sp::Gemm24>(N, K, sp::Type::BF16);
        {
          // The library's own 2:4 pruning of a copy must leave our pruned weight unchanged
          // (same direction of the groups): count the values it changes.
          std::vector<__nv_bfloat16> mine(N * K), lib(N * K);
          void* w2 = nullptr;
          check(cudaMalloc(&w2, N * K * 2), "cudaMalloc");
          check(cudaMemcpy(w2, w_bf, N * K * 2, cudaMemcpyDeviceToDevice), "copy");
          g_bf->prune(w2, s);
          check(cudaMemcpy(mine.data(), w_bf, N * K * 2, cudaMemcpyDeviceToHost), "download");
          check(cudaMemcpy(lib.data(), w2, N * K * 2, cudaMemcpyDeviceToHost), "download");
          cudaFree(w2);
          int64_t changed = 0;
          for (int64_t i = 0; i < N * K; ++i)
            changed += __bfloat162float(mine[i]) != __bfloat162float(lib[i]);
          std::printf("%s %s: cuSPARSELt's pruning changes %lld of %lld values of ours\n", sh.model,
                      sh.layer, static_cast<long long>(changed), static_cast<long long>(N * K));
        }
        g_bf->set_weight(w_bf, s);
        g_h = std::make_unique<sp::Gemm24>(N, K, sp::Type::FP16);
        g_h->set_weight(w_h, s);
        g_i8 = std::make_unique<sp::Gemm24>(N, K, sp::Type::INT8);
        g_i8->set_weight(w_i8, s);
        for (int l = 0; l < 2; ++l) {
          const sp::Layout lay = l == 0 ? sp::Layout::FeatureMajor : sp::Layout::FeatureMajorOut;
          f_bf[l] = std::make_unique<sp::Gemm24>(N, K, sp::Type::BF16, lay);
          f_bf[l]->set_weight(w_bf, s);
          f_h[l] = std::make_unique<sp::Gemm24>(N, K, sp::Type::FP16, lay);
          f_h[l]->set_weight(w_h, s);
          f_i8[l] = std::make_unique<sp::Gemm24>(N, K, sp::Type::INT8, lay);
          f_i8[l]->set_weight(w_i8, s);
          f_i8b[l] = std::make_unique<sp::Gemm24>(N, K, sp::Type::INT8, lay, true);
          f_i8b[l]->set_weight(w_i8, s);
        }
      } catch (const std::exception& e) {
        sparse_note = e.what();
        g_bf.reset();
        g_h.reset();
        g_i8.reset();
        for (int l = 0; l < 2; ++l)
          f_bf[l].reset(), f_h[l].reset(), f_i8[l].reset(), f_i8b[l].reset();
      }
    } else {
      sparse_note = sparse_ok ? "in % 16 != 0: no 2:4 kernel" : "no cuSPARSELt";
    }
    for (int64_t B : batches) {
      auto dense = [&](cudaDataType_t t, cudaDataType_t dt) {
        Gemm g = Gemm::shape(true, false, N, B, K, K, K, N);
        g.ab_type = t;
        g.d_type = dt;
        return g;
      };
      const Gemm gbf = dense(CUDA_R_16BF, CUDA_R_16BF), gh = dense(CUDA_R_16F, CUDA_R_16F),
                 gi8 = dense(CUDA_R_8I, CUDA_R_8I);
      double t_bf = NAN, t_h = NAN, t_i8 = NAN, s_bf = NAN, s_h = NAN, s_i8 = NAN;
      t_bf = time_ms([&] { lt.run(gbf, w_bf, x_bf, y1, nullptr, nullptr, s); }, iters, reps, s);
      t_h = time_ms([&] { lt.run(gh, w_h, x_h, y1, nullptr, nullptr, s); }, iters, reps, s);
      if (lt.supported(gi8))
        t_i8 = time_ms([&] { lt.run(gi8, w_i8, x_i8, y1, nullptr, nullptr, s, nullptr, alpha); },
                       iters, reps, s);
      std::string chk = sparse_note;
      if (g_bf) {
        s_bf = time_ms([&] { g_bf->run(x_bf, y2, B, s); }, iters, reps, s);
        s_h = time_ms([&] { g_h->run(x_h, y2, B, s); }, iters, reps, s);
        s_i8 = time_ms([&] { g_i8->run(x_i8, y2, B, s, alpha); }, iters, reps, s);
        // Same pruned weights, dense vs sparse: bf16 outputs, then int8 outputs.
        lt.run(gbf, w_bf, x_bf, y1, nullptr, nullptr, s);
        g_bf->run(x_bf, y2, B, s);
        check(cudaStreamSynchronize(s), "sync");
        const int64_t n = std::min<int64_t>(B * N, int64_t{1} << 20);
        std::vector<__nv_bfloat16> a(n), b(n);
        check(cudaMemcpy(a.data(), y1, n * 2, cudaMemcpyDeviceToHost), "download");
        check(cudaMemcpy(b.data(), y2, n * 2, cudaMemcpyDeviceToHost), "download");
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double p = __bfloat162float(a[i]), q = __bfloat162float(b[i]);
          worst = std::max(worst, std::fabs(p - q));
          scale = std::max(scale, std::fabs(p));
        }
        int64_t i8_diff = -1;
        if (!std::isnan(t_i8)) {
          lt.run(gi8, w_i8, x_i8, y1, nullptr, nullptr, s, nullptr, alpha);
          g_i8->run(x_i8, y2, B, s, alpha);
          check(cudaStreamSynchronize(s), "sync");
          std::vector<int8_t> c(n), d(n);
          check(cudaMemcpy(c.data(), y1, n, cudaMemcpyDeviceToHost), "download");
          check(cudaMemcpy(d.data(), y2, n, cudaMemcpyDeviceToHost), "download");
          i8_diff = 0;
          for (int64_t i = 0; i < n; ++i) i8_diff += c[i] != d[i];
        }
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "bf16 max|diff|/max|y| %.2e, int8 outputs differing %lld/%lld",
                      worst / std::max(scale, 1e-30), static_cast<long long>(i8_diff),
                      static_cast<long long>(n));
        chk = buf;
      }
      std::printf(
          "%-6s %-9s %5lld %5lld %6lld | %8.4f %8.4f %8.4f | %8.4f %8.4f %8.4f | %5.2f %5.2f %5.2f "
          "%5.2f | %s\n",
          sh.model, sh.layer, static_cast<long long>(N), static_cast<long long>(K),
          static_cast<long long>(B), t_bf, t_h, t_i8, s_bf, s_h, s_i8, t_bf / s_bf, t_h / s_h,
          t_bf / t_i8, t_bf / s_i8, chk.c_str());
      // The feature-major layouts (sp::Layout): dense bf16 through cuBLASLt and the 2:4 GEMMs,
      // checked against each other (the JSON line carries the last one's figures).
      double fd_bf = NAN, fs_bf = NAN, fs_h = NAN, fs_i8 = NAN;  // the layout of the last pass
      for (int l = 0; l < 2; ++l) {
        fd_bf = fs_bf = fs_h = fs_i8 = NAN;
        std::string fchk;
        // Dense reference in the same layout: column-major Y^T^T [batch, out] = X W^T, with X
        // feature-major (X^T [in, batch] row-major) or row-major.
        Gemm fg = l == 0 ? Gemm::shape(false, false, B, N, K, B, K, B)
                         : Gemm::shape(true, false, B, N, K, K, K, B);
        fg.ab_type = CUDA_R_16BF;
        fg.d_type = CUDA_R_16BF;
        fd_bf = time_ms([&] { lt.run(fg, x_bf, w_bf, y1, nullptr, nullptr, s); }, iters, reps, s);
        if (f_bf[l]) {
          // A layout and type the library refuses is reported, not fatal.
          auto attempt = [&](const char* what, auto fn) {
            try {
              return time_ms(fn, iters, reps, s);
            } catch (const std::exception& e) {
              fchk += std::string(what) + ": " + e.what() + "; ";
              return double(NAN);
            }
          };
          fs_bf = attempt("bf16", [&] { f_bf[l]->run(x_bf, y2, B, s); });
          fs_h = attempt("fp16", [&] { f_h[l]->run(x_h, y2, B, s); });
          fs_i8 = attempt("int8", [&] { f_i8[l]->run(x_i8, y2, B, s, alpha); });
          const double fs_i8b =
              attempt("int8->bf16", [&] { f_i8b[l]->run(x_i8, y2, B, s, wscale * xscale); });
          char b8[80];
          std::snprintf(b8, sizeof b8, "2:4 int8->bf16 %.4f ms (%.2fx); ", fs_i8b, fd_bf / fs_i8b);
          fchk += b8;
          lt.run(fg, x_bf, w_bf, y1, nullptr, nullptr, s);
          if (!std::isnan(fs_bf)) f_bf[l]->run(x_bf, y2, B, s);
          check(cudaStreamSynchronize(s), "sync");
          const int64_t n = std::min<int64_t>(B * N, int64_t{1} << 20);
          std::vector<__nv_bfloat16> a(n), b(n);
          check(cudaMemcpy(a.data(), y1, n * 2, cudaMemcpyDeviceToHost), "download");
          check(cudaMemcpy(b.data(), y2, n * 2, cudaMemcpyDeviceToHost), "download");
          double worst = 0, scale = 0;
          for (int64_t i = 0; i < n; ++i) {
            const double p = __bfloat162float(a[i]), q = __bfloat162float(b[i]);
            worst = std::max(worst, std::fabs(p - q));
            scale = std::max(scale, std::fabs(p));
          }
          char buf[96];
          std::snprintf(buf, sizeof buf, "bf16 max|diff|/max|y| %.2e",
                        worst / std::max(scale, 1e-30));
          fchk += buf;
        }
        std::printf(
            "%-6s %-9s %5s %5s %6s | %8.4f %8s %8s | %8.4f %8.4f %8.4f | %5.2f %5.2f %5s "
            "%5.2f | %s; %s\n",
            "", "", "", "", "", fd_bf, "", "", fs_bf, fs_h, fs_i8, fd_bf / fs_bf, fd_bf / fs_h, "",
            fd_bf / fs_i8, l == 0 ? "feature-major" : "row-major in, feature-major out",
            fchk.c_str());
      }
      std::printf(
          "RESULT {\"model\": \"%s\", \"layer\": \"%s\", \"out\": %lld, \"in\": %lld, \"batch\": "
          "%lld, \"ms\": {\"bf16\": %.5f, \"fp16\": %.5f, \"int8\": %.5f, \"sparse_bf16\": %.5f, "
          "\"sparse_fp16\": %.5f, \"sparse_int8\": %.5f, \"fmout_bf16\": %.5f, "
          "\"fmout_sparse_bf16\": %.5f, \"fmout_sparse_fp16\": %.5f, \"fmout_sparse_int8\": "
          "%.5f}}\n",
          sh.model, sh.layer, static_cast<long long>(N), static_cast<long long>(K),
          static_cast<long long>(B), t_bf, t_h, std::isnan(t_i8) ? -1.0 : t_i8,
          std::isnan(s_bf) ? -1.0 : s_bf, std::isnan(s_h) ? -1.0 : s_h,
          std::isnan(s_i8) ? -1.0 : s_i8, fd_bf, std::isnan(fs_bf) ? -1.0 : fs_bf,
          std::isnan(fs_h) ? -1.0 : fs_h, std::isnan(fs_i8) ? -1.0 : fs_i8);
      std::fflush(stdout);
    }
    g_bf.reset();
    g_h.reset();
    g_i8.reset();
    for (int l = 0; l < 2; ++l) f_bf[l].reset(), f_h[l].reset(), f_i8[l].reset(), f_i8b[l].reset();
    for (void* p :
         {static_cast<void*>(w_bf), static_cast<void*>(w_h), static_cast<void*>(w_i8),
          static_cast<void*>(x_bf), static_cast<void*>(x_h), static_cast<void*>(x_i8), y1, y2})
      cudaFree(p);
  }
  cudaStreamDestroy(s);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
#ifdef DLREC_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_gemm_compress: no CUDA device\n");
    return 1;
  }
  return run(argc, argv);
#else
  (void)argc;
  (void)argv;
  std::fprintf(stderr,
               "bench_gemm_compress: built without CUDA (configure with -DDLREC_CUDA=ON)\n");
  return 1;
#endif
}
