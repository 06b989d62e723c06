// Deterministic random numbers for parameter initialisation.
//
// Everything is counter-based on splitmix64: the value at position i of a stream depends only on
// (seed, i), so initialisation fills tensors in parallel and still gives identical parameters on
// any thread count and any machine.
#pragma once

#include <cmath>
#include <cstdint>

namespace dlrec::nn {

// The splitmix64 finaliser applied to x + golden ratio: a good 64-bit mix of one word.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A stream seed for a named part of a model (e.g. layer k), so that adding a layer does not
// shift the numbers other layers get.
inline uint64_t derive_seed(uint64_t seed, uint64_t tag) {
  return splitmix64(splitmix64(seed) ^ splitmix64(tag * 0xD6E8FEB86659FD93ULL + 1));
}

// Uniform in [0, 1) with 53 random bits, the value at position i of stream `seed`.
inline double uniform_at(uint64_t seed, uint64_t i) {
  return static_cast<double>(splitmix64(seed ^ splitmix64(i)) >> 11) * 0x1.0p-53;
}

// Standard normal at position i of stream `seed` (Box-Muller on two independent uniforms).
inline double normal_at(uint64_t seed, uint64_t i) {
  const double u1 = 1.0 - uniform_at(seed, 2 * i);  // (0, 1]: log is finite
  const double u2 = uniform_at(seed, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A sequential generator for tests and synthetic data.
class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed) {}
  uint64_t next() { return splitmix64(seed_ ^ splitmix64(counter_++)); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() { return normal_at(seed_, counter_++); }
  int64_t below(int64_t n) { return static_cast<int64_t>(uniform() * static_cast<double>(n)); }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace dlrec::nn
