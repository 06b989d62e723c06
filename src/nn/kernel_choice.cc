// The per-layer kernel choice of compressed models (include/dlrec/nn/kernel_choice.h).
#include "dlrec/nn/kernel_choice.h"

#include <algorithm>
#include <cstdio>

#include "dlrec/core/error.h"
#include "dlrec/nn/cusparselt_version.h"

namespace dlrec::nn::kernel_choice {

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::Dense:
      return "dense";
    case Kernel::Sparse24:
      return "2:4";
    case Kernel::Int8:
      return "int8";
    case Kernel::Sparse24Int8:
      return "2:4-int8";
  }
  return "?";
}

std::string cusparselt_version_error(int major, int minor, int patch, const std::string& where) {
  if (major == 0 && minor >= kCusparseltMinMinor) return "";
  return "cuSPARSELt at " + where + " is version " + std::to_string(major) + "." +
         std::to_string(minor) + "." + std::to_string(patch) + "; the 2:4 kernels need 0." +
         std::to_string(kCusparseltMinMinor) + " or a later 0.x";
}

Policy parse_policy(const std::string& s, const std::string& what) {
  if (s == "fastest") return Policy::Fastest;
  if (s == "compressed") return Policy::Compressed;
  if (s == "dense") return Policy::Dense;
  fail(what, ": unknown kernel policy '", s, "' (choose fastest, compressed or dense)");
}

const char* policy_name(Policy p) {
  return p == Policy::Fastest ? "fastest" : p == Policy::Compressed ? "compressed" : "dense";
}

std::vector<Candidate> candidates(bool masked, bool quantized, bool half_engine, bool sparse_ok,
                                  const std::string& sparse_why) {
  std::vector<Candidate> c;
  c.push_back({Kernel::Dense, true, "", -1});
  if (masked) {
    Candidate s{Kernel::Sparse24, true, "", -1};
    if (!half_engine) {
      s.available = false;
      s.why = "the engine computes in fp32 (2:4 runs in bf16/fp16)";
    } else if (!sparse_ok) {
      s.available = false;
      s.why = sparse_why;
    }
    c.push_back(s);
  }
  if (quantized) c.push_back({Kernel::Int8, true, "", -1});
  if (masked && quantized) {
    Candidate s{Kernel::Sparse24Int8, true, "", -1};
    if (!sparse_ok) {
      s.available = false;
      s.why = sparse_why;
    }
    c.push_back(s);
  }
  return c;
}

size_t choose(const std::vector<Candidate>& c, Policy p) {
  DLREC_CHECK(!c.empty() && c[0].kernel == Kernel::Dense && c[0].available,
              "kernel choice: the first candidate must be the available dense kernel");
  if (p == Policy::Dense) return 0;
  if (p == Policy::Compressed) {
    const Kernel order[] = {Kernel::Sparse24Int8, Kernel::Int8, Kernel::Sparse24};
    for (Kernel k : order)
      for (size_t i = 0; i < c.size(); ++i)
        if (c[i].kernel == k && c[i].available) return i;
    return 0;
  }
  // Nothing timed for dense: keep dense (never an unmeasured comparison).
  if (c[0].ms < 0) return 0;
  size_t best = 0;
  for (size_t i = 1; i < c.size(); ++i) {
    if (!c[i].available || c[i].ms < 0) continue;
    if (best == 0 || c[i].ms < c[best].ms) best = i;  // the fastest compressed candidate
  }
  // It replaces dense only by a clear margin (kMinGain): ties and near-ties keep dense.
  return best != 0 && c[best].ms <= (1.0 - kMinGain) * c[0].ms ? best : 0;
}

void check_mask_2_4(const std::string& layer, const float* mask, int64_t out, int64_t in) {
  for (int64_t r = 0; r < out; ++r)
    for (int64_t g = 0; g < in; g += 4) {
      int kept = 0;
      for (int64_t k = g; k < std::min(in, g + 4); ++k) kept += mask[r * in + k] != 0.f;
      if (kept > 2)
        fail("'", layer, "': its mask is not 2:4 (row ", r, ", the group of columns ", g, "..",
             std::min(in, g + 4) - 1, " keeps ", kept,
             " values; cuSPARSELt needs at most 2 of every 4 along the input)");
    }
}

std::string describe(const std::string& layer, int64_t rows, const std::vector<Candidate>& c,
                     size_t chosen) {
  std::string s = layer + " [B=" + std::to_string(rows) + "]: ";
  for (size_t i = 0; i < c.size(); ++i) {
    if (i) s += ", ";
    s += kernel_name(c[i].kernel);
    if (!c[i].available) {
      s += " n/a (" + c[i].why + ")";
      continue;
    }
    if (c[i].ms >= 0) {
      char b[32];
      std::snprintf(b, sizeof b, " %.4f ms", c[i].ms);
      s += b;
    }
    if (!c[i].why.empty()) s += " (" + c[i].why + ")";  // an available one's note
    if (i == chosen) s += " *";
  }
  return s;
}

}  // namespace dlrec::nn::kernel_choice
