// The MLP and cross GEMMs of the MLPerf DLRM and DCNv2 models, shared by the GEMM benchmarks
// (bench_gemm_compress.cc on the GPU, bench_int8_cpu.cc on the CPU), and their list parser.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace dlrec_bench {

struct GemmShape {
  const char* model;
  const char* layer;
  int64_t out, in;
};

// DLRM: Criteo dims 128, 26 tables, so the top MLP's input is 128 + 27*26/2 = 479; DCNv2: 27
// features of 128 = 3456, cross layers of low rank 512. The first bottom layer (13 inputs) and
// the last top layer (1 output) are too thin for tensor cores and left out.
inline constexpr GemmShape kMlperfGemms[] = {
    {"dlrm", "bottom.1", 256, 512},  {"dlrm", "bottom.2", 128, 256},
    {"dlrm", "top.0", 1024, 479},    {"dlrm", "top.1", 1024, 1024},
    {"dlrm", "top.2", 512, 1024},    {"dlrm", "top.3", 256, 512},
    {"dcnv2", "cross.v", 512, 3456}, {"dcnv2", "cross.u", 3456, 512},
    {"dcnv2", "top.0", 1024, 3456},  {"dcnv2", "top.1", 1024, 1024},
    {"dcnv2", "top.2", 512, 1024},   {"dcnv2", "top.3", 256, 512},
};

// "256,2048": positive integers separated by commas; anything else ends the program (exit 2).
inline std::vector<int64_t> parse_positive_list(const char* s, const char* program) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p || x <= 0 || (*end != ',' && *end != '\0')) {
      std::fprintf(stderr, "%s: bad list '%s'\n", program, s);
      std::exit(2);
    }
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

}  // namespace dlrec_bench
