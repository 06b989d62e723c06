// Synthetic Criteo-like click logs with a planted, learnable signal.
//
// Rows: label, num_dense integer features, num_cat categorical features written as 8 hex
// digits (tab-separated, empty = missing), optionally multi-hot categorical columns.
// Category frequencies follow a power law (Zipf with exponent `zipf_s`); dense features are
// count-like (log-normal-ish, some negative) with a fraction missing. The click probability is
// sigmoid(bias + sum of per-category weights + weighted log-dense terms), so a model that learns
// per-category effects reaches an AUC near `signal_auc()`; the label is drawn from that
// probability. The same seed gives the same bytes on every machine.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/schema.h"

namespace dlrec::io {

struct DatagenConfig {
  int64_t rows = 1000000;
  uint64_t seed = 42;
  int num_dense = 13;
  int num_cat = 26;
  // Cardinality per categorical column; shorter lists repeat their last value, longer ones are
  // cut to num_cat. The default mimics Criteo's mix of tiny, medium and huge columns (the
  // largest scaled down to <= 1e6).
  std::vector<int64_t> cardinalities = {1460,  583,   1000000, 400000, 305,    24,    12517,
                                        633,   3,     93145,   5683,   600000, 3194,  27,
                                        14992, 500000, 10,     5652,   2173,   4,     700000,
                                        18,    15,    286181,  105,    142572};
  double zipf_s = 1.1;
  double dense_missing = 0.1;  // probability a dense value is missing
  double cat_missing = 0.03;   // probability a categorical value is missing
  int num_multi_hot = 0;       // the last this many categorical columns are multi-hot
  int max_hotness = 4;         // values per multi-hot field: uniform in [1, max_hotness]
  // Fixed values per field, one per categorical column (empty: num_multi_hot/max_hotness
  // apply). A column with hotness h > 1 is multi-hot with exactly h values in every field that
  // is not missing (repeats possible); h = 1 is a plain one-valued column. Excludes
  // num_multi_hot > 0.
  std::vector<int> hotness;
  double signal_strength = 1.0;  // scales the planted weights
  double base_ctr = 0.25;        // approximate positive rate

  // `dlrec datagen --schema mlperf_dcnv2`: the MLPerf DLRM-DCNv2 benchmark's 13 dense and 26
  // multi-hot categorical columns (io::mlperf_dcnv2_cardinalities / _hotness), power-law ids,
  // no missing categories (every field has its fixed number of values).
  static DatagenConfig mlperf_dcnv2();
  static DatagenConfig from_json(const json& j);
  json to_json() const;
  Schema schema() const;  // the schema of the generated file (Criteo-like, hex)
  int64_t cardinality(int c) const;  // of categorical column c, after the repeat rule
  bool is_multi_hot(int c) const;    // categorical column c
  int fixed_hotness(int c) const;    // values per field of column c when fixed, else 0
};

struct DatagenResult {
  int64_t rows = 0;
  int64_t bytes = 0;
  double positive_rate = 0;
  // Exact AUC (ties count one half) of the true click probability against the drawn labels,
  // over the first min(rows, 2^24) rows: the ceiling a perfect model of this data reaches.
  // 0.5 when those rows hold only one class.
  double signal_auc = 0;
};

// Writes the rows to `out` (parallel generation, deterministic output order).
DatagenResult generate(const DatagenConfig& config, std::ostream& out);
// Writes the rows to a file atomically.
DatagenResult generate_file(const DatagenConfig& config, const std::string& path);

// ---- The ratings example (`dlrec datagen --schema ratings`) --------------------------------
//
// A ratings log (user, item, rating 1-5, timestamp; CSV with a header, after `comment_lines`
// lines starting with '#') with two side tables: users.csv (user, age, country) and items.csv
// (item, category, price). The planted signal lives in the side tables: a rating is above 3
// with probability sigmoid(logit), logit = bias + w(country) + w(category) + a(country) *
// b(category) + age and log(price) terms; a missing side value (an age left empty, an item
// absent from items.csv: one in `missing_item_every`) contributes 0. A model learns it only
// through the join of both side tables (configs/ratings_etl.json). Same seed, same bytes.
struct RatingsConfig {
  int64_t rows = 400000;
  uint64_t seed = 42;
  int64_t users = 10000;
  int64_t items = 3000;
  int countries = 20;
  int categories = 30;
  int64_t missing_item_every = 100;  // items i with i % this == this - 1 are not in items.csv
  int comment_lines = 2;             // '#' lines before the header of ratings.csv
};

struct RatingsResult {
  int64_t rows = 0, bytes = 0;
  double positive_rate = 0;  // rating > 3
  // Exact AUC of the true probability against rating > 3 over all rows (the planted signal's
  // oracle), and over the last 10 % of rows (the validation split of `--valid-ratio 0.1`).
  double signal_auc = 0, signal_auc_last_tenth = 0;
  std::string ratings, users, items;  // the files written
};

// Writes ratings.csv, users.csv and items.csv into `dir` (created if needed), atomically.
RatingsResult generate_ratings(const RatingsConfig& config, const std::string& dir);

}  // namespace dlrec::io
