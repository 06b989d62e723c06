// DotInteraction's forward with AVX-512 where the CPU has it (interaction.cc dispatches): the
// same values as the scalar loop, bit for bit. Each <Z_i, Z_j> is summed over k in order with
// one accumulator, products and sums rounded separately (no FMA); the vectors run across j.
#pragma once

#include <cstdint>

namespace dlrec::nn {

bool dot_avx512_available();
// out [B, d + n (n - 1) / 2] (n = tables + 1) from dense [B, d] and embeddings [B, tables, d].
void dot_forward_avx512(const float* dense, const float* emb, int64_t B, int64_t tables,
                        int64_t d, float* out);

}  // namespace dlrec::nn
