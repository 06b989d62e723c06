// Random encoded batches for benchmarks and tests (not the datagen text generator): one id per
// categorical feature, uniform or log-uniform ("zipf": P(id) ~ 1 / (id + 1)), dense values
// shaped like Criteo's after log(1 + x), labels positive with probability 0.25.
#pragma once

#include <cstdint>
#include <vector>

#include "dlrec/io/batch.h"
#include "dlrec/io/shard.h"

namespace dlrec::io {

// The 26 categorical cardinalities of the Criteo Kaggle (Display Advertising Challenge) data,
// as used by the MLPerf DLRM v1 benchmark.
const std::vector<int64_t>& criteo_kaggle_cardinalities();

// Deterministic for a seed, whatever the thread count.
Batch random_batch(const ShardLayout& layout, int64_t rows, bool zipf, uint64_t seed);

}  // namespace dlrec::io
