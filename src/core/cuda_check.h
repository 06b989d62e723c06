// Internal: CUDA error checking for .cu files.
#pragma once

#include <cuda_runtime.h>

#include "dlrec/core/error.h"

#define DLREC_CUDA_CHECK(expr)                                                         \
  do {                                                                                 \
    cudaError_t _e = (expr);                                                           \
    if (_e != cudaSuccess)                                                             \
      ::dlrec::fail("CUDA error in ", #expr, " at ", __FILE__, ":", __LINE__, ": ",   \
                    cudaGetErrorString(_e));                                           \
  } while (0)

// Checks the last kernel launch.
#define DLREC_CUDA_LAUNCH_CHECK() DLREC_CUDA_CHECK(cudaGetLastError())
