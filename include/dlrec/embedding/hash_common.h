// Hashing and row initialisation shared by the CPU and the GPU hashed tables (host and device).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DLREC_HD __host__ __device__
#else
#define DLREC_HD
#endif

namespace dlrec::embedding {

// splitmix64's finaliser: a bijective 64-bit mix.
DLREC_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The hash of a key for the tables' indices.
DLREC_HD inline uint64_t key_hash(int64_t key) { return mix64(static_cast<uint64_t>(key)); }

// Element k of the initial row of `key`: uniform in [-scale, scale) from (seed, key, k) only.
// 24 random bits make the float exactly (no rounding differences between host and device).
DLREC_HD inline float init_value(uint64_t seed, int64_t key, int64_t k, float scale) {
  const uint64_t row_seed = mix64(mix64(seed) ^ mix64(static_cast<uint64_t>(key) + 0x632BE59BD9B4E019ULL));
  const uint64_t r = mix64(row_seed ^ mix64(static_cast<uint64_t>(k)));
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), exact
  return scale * (2.0f * u - 1.0f);
}

}  // namespace dlrec::embedding
