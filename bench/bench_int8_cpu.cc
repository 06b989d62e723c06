// Speed of the CPU's quantized Linear (issue 21: INT8 on the CPU) against the fp32 Linear the CPU
// engine runs (OpenBLAS sgemm in row blocks on dlrec's thread pool), on the MLP and cross shapes
// of the MLPerf DLRM and DCNv2 models: every int8 kernel this CPU has (src/compress/int8_gemm.cc,
// int8_gemm_packed.cc), the whole layer each time (quantize the input, int8 GEMM, dequantize, bias,
// ReLU), and a check that every kernel's output equals the scalar reference's bit for bit. Beside
// them, the fp32 Linear that serving runs on packed weights (nn/linear_packed.h, each kernel this
// CPU has; its first 64 rows checked bit for bit against the scalar fma reference).
//
//   bench_int8_cpu [--batches 256,2048,8192] [--threads N] [--reps 5] [--model all|dlrm|dcnv2]
//
// Each time is the median over --reps of the mean of enough back-to-back calls to fill ~0.2 s.
// One line per shape and batch, and a line `RESULT {json}` for scripts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compress/int8_gemm_packed.h"
#include "dlrec/compress/quantize.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/linear.h"
#include "dlrec/nn/linear_packed.h"
#include "mlperf_gemm_shapes.h"

namespace {

using namespace dlrec;

using dlrec_bench::GemmShape;
const auto& kShapes = dlrec_bench::kMlperfGemms;

template <class F>
double time_ms(F&& f, int reps) {
  f();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int iters = std::max(1, static_cast<int>(0.2 / std::max(once, 1e-6)));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a)
                     .count() /
                 iters);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  nn::prepare_single_threaded_blas();
  std::vector<int64_t> batches = {256, 2048, 8192};
  int reps = 5, threads = 0;
  std::string model = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--batches" && v) batches = dlrec_bench::parse_positive_list(argv[++i], "bench_int8_cpu");
    else if (a == "--reps" && v) reps = std::atoi(argv[++i]);
    else if (a == "--threads" && v) threads = std::atoi(argv[++i]);
    else if (a == "--model" && v) model = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--batches 256,2048,8192] [--threads N] [--reps 5] "
                   "[--model all|dlrm|dcnv2]\n",
                   argv[0]);
      return 2;
    }
  }
  if (threads > 0) set_num_threads(threads);
  nn::use_single_threaded_blas();
  std::vector<compress::Int8Kernel> kernels;
  for (auto k : {compress::Int8Kernel::Avx2, compress::Int8Kernel::Avx512Vnni})
    if (compress::int8_kernel_available(k)) kernels.push_back(k);
  std::printf("threads %d; int8 kernels on this CPU:", num_threads());
  for (auto k : kernels) std::printf(" %s", compress::int8_kernel_name(k));
  std::printf(" (best: %s)\n", compress::int8_kernel_name(compress::int8_best_kernel()));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  bool all_equal = true;
  for (const GemmShape& s : kShapes) {
    if (model != "all" && model != s.model) continue;
    nn::Linear lin(s.in, s.out, nn::Activation::ReLU);
    lin.init(11);
    const compress::QuantWeight q = compress::quantize_weight(lin.weight().value);
    const float x_scale = 4.f / 127;
    for (const int64_t B : batches) {
      Tensor x = Tensor::empty({B, s.in}, DType::F32, Device::cpu());
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = nd(rng);
      const double fp32 = time_ms([&] { lin.forward(x); }, reps);
      Tensor y_ref;
      compress::int8_linear(x, x_scale, q, lin.bias().value, true, y_ref,
                            compress::Int8Kernel::Reference);
      std::printf("%-6s %-9s out %5lld in %5lld batch %6lld: fp32 %8.3f ms", s.model, s.layer,
                  static_cast<long long>(s.out), static_cast<long long>(s.in),
                  static_cast<long long>(B), fp32);
      std::string json = std::string("{\"model\": \"") + s.model + "\", \"layer\": \"" + s.layer +
                         "\", \"out\": " + std::to_string(s.out) + ", \"in\": " +
                         std::to_string(s.in) + ", \"batch\": " + std::to_string(B) +
                         ", \"fp32_ms\": " + std::to_string(fp32);
      for (auto k : {nn::Fp32Kernel::Avx2, nn::Fp32Kernel::Avx512}) {
        if (!nn::fp32_kernel_available(k)) continue;
        const auto packed = nn::pack_weight(lin.weight().value, k);
        Tensor y = Tensor::zeros({B, s.out}, DType::F32);
        const double ms =
            time_ms([&] { nn::packed_linear(x, *packed, lin.bias().value, true, y); }, reps);
        const int64_t rows = std::min<int64_t>(B, 64);
        Tensor xs = Tensor::empty({rows, s.in}, DType::F32, Device::cpu());
        std::memcpy(xs.data<float>(), x.data<float>(), sizeof(float) * rows * s.in);
        Tensor yr = Tensor::zeros({rows, s.out}, DType::F32);
        nn::packed_linear(xs, *nn::pack_weight(lin.weight().value, nn::Fp32Kernel::Reference),
                          lin.bias().value, true, yr);
        const bool equal = std::memcmp(y.data<float>(), yr.data<float>(),
                                       sizeof(float) * static_cast<size_t>(yr.numel())) == 0;
        all_equal &= equal;
        const std::string name = std::string("fp32-") + nn::fp32_kernel_name(k);
        std::printf("  %s %8.3f ms (%.2fx)%s", name.c_str(), ms, fp32 / ms,
                    equal ? "" : " OUTPUT DIFFERS FROM THE REFERENCE");
        json += ", \"" + name + "_ms\": " + std::to_string(ms) + ", \"" + name +
                "_equal\": " + (equal ? "true" : "false");
      }
      for (auto k : kernels) {
        // The layer as dlrec predict runs it: the weight packed once (Int8Linear does it at
        // load for the fastest kernel; here for each kernel).
        compress::QuantWeight qk = q;
        qk.packed = compress::pack_int8(q, k);
        Tensor y;
        const double ms = time_ms(
            [&] { compress::int8_linear(x, x_scale, qk, lin.bias().value, true, y, k); }, reps);
        const bool equal = y.numel() == y_ref.numel() &&
                           std::memcmp(y.data<float>(), y_ref.data<float>(),
                                       sizeof(float) * static_cast<size_t>(y.numel())) == 0;
        all_equal &= equal;
        std::printf("  %s %8.3f ms (%.2fx fp32)%s", compress::int8_kernel_name(k), ms, fp32 / ms,
                    equal ? "" : " OUTPUT DIFFERS FROM THE REFERENCE");
        json += std::string(", \"") + compress::int8_kernel_name(k) + "_ms\": " +
                std::to_string(ms) + ", \"" + compress::int8_kernel_name(k) +
                "_equal\": " + (equal ? "true" : "false");
      }
      std::printf("\n");
      std::printf("RESULT %s}\n", json.c_str());
      std::fflush(stdout);
    }
  }
  return all_equal ? 0 : 1;
}
