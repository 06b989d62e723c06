// Which cuSPARSELt versions the 2:4 kernels (src/nn/gemm_2_4_cuda.h) take. Plain C++, so that
// the check and its message are tested in CPU builds too.
#pragma once

#include <string>

namespace dlrec::nn::kernel_choice {

// 0.8 (the version the kernels were built and tested with: the nvidia-cusparselt-cu13 wheel,
// the GPU hosts' copy) up to any later 0.x; 1.x may change the ABI.
constexpr int kCusparseltMinMinor = 8;
// "" when `major.minor.patch` of the library loaded from `where` is one of those, else why not
// (the found and the required version).
std::string cusparselt_version_error(int major, int minor, int patch, const std::string& where);

}  // namespace dlrec::nn::kernel_choice
