// Internal: helpers shared by the embedding kernels (embedding_cuda.cu, embedding_backward_cuda.cu,
// embedding_quant_cuda.cu; layout in nn/embedding_cuda.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dlrec::nn::cuda_emb {

// The spans of N consecutive bags bag0 .. bag0 + N - 1: beg[u] the first id's position and
// len[u] the id count of bag bag0 + u (0 and 0 past the last bag, `bags`); returns the largest
// count.
template <int N>
__device__ __forceinline__ int32_t bag_spans(const int32_t* __restrict__ offsets, int64_t bag0,
                                             int64_t bags, int32_t* beg, int32_t* len) {
  int32_t maxlen = 0;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const int64_t bag = bag0 + u;
    beg[u] = 0;
    len[u] = 0;
    if (bag < bags) {
      beg[u] = offsets[bag];
      len[u] = offsets[bag + 1] - beg[u];
      maxlen = max(maxlen, len[u]);
    }
  }
  return maxlen;
}

template <class P>
bool vec4_ok(const P* p, int d, int64_t ld) {
  return d % 4 == 0 && ld % 4 == 0 && reinterpret_cast<uintptr_t>(p) % (4 * sizeof(P)) == 0;
}

}  // namespace dlrec::nn::cuda_emb
