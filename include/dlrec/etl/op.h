// ETL ops: the per-column steps of a Workflow, and the registry that builds them from JSON.
//
// An op instance belongs to one column (a pipeline step listing three columns makes three
// instances), so its fitted state is that column's. The families:
//   DenseOp             float -> float, element-wise, in place (FillMissing, FillMedian, Clip,
//                       LogOp, Normalize, NormalizeMinMax). NaN marks a missing value.
//   CategoricalEncoder  64-bit keys -> ids in [0, cardinality) (Categorify, HashBucket). Id 0
//                       is reserved for a missing value by every encoder; the Workflow assigns it.
//   DenseEncoder        float -> id, ending a dense column's chain and turning it into a
//                       categorical feature (Bucketize). NaN -> id 0.
//   ColumnOp            changes how the column appears in the output, not its values (Rename,
//                       DropLowCardinality).
//   FeatureOp           step-level: reads raw columns (keys, dense values, labels) and adds new
//                       output features (HashedCross, TargetEncoding, JoinGroupby).
//   RowFilter           step-level: a predicate on a raw column's value that drops rows (Filter).
// Ops that learn from data implement the fit_* calls: fit_begin(), then fit_chunk() for every
// chunk of training rows (values already transformed by the ops before it in the column's
// chain), then fit_end(). Fitting is serial per instance; transform is const and thread-safe.
//
// Adding an op: subclass one of the families, give it a factory, and register it in the
// family's register_*_ops() function (docs/ETL.md lists the ops and their JSON).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/raw_chunk.h"

namespace dlrec::etl {

// Any: the op applies to both kinds of column (Rename).
enum class ColumnType { Dense, Categorical, Any };
const char* column_type_name(ColumnType t);  // "dense" | "categorical" | "any"

class Op {
 public:
  virtual ~Op() = default;
  virtual std::string name() const = 0;  // the "op" value in JSON
  virtual ColumnType input_type() const = 0;
  virtual bool needs_fit() const { return false; }
  virtual bool fitted() const { return true; }
  // {"op": name, parameters..., fitted state...}; the registry's from-JSON path reads it back.
  virtual json to_json() const = 0;
  // Statistics of the last fit for stats.json (null when there are none).
  virtual json fit_summary() const { return nullptr; }
};

class DenseOp : public Op {
 public:
  ColumnType input_type() const override { return ColumnType::Dense; }
  virtual void fit_begin() {}
  virtual void fit_chunk(const float* values, int64_t n) {}
  virtual void fit_end() {}
  // Transforms n values spaced `stride` floats apart, in place.
  virtual void transform(float* values, int64_t n, int64_t stride) const = 0;
};

// Memory shared by the encoders of one workflow while fitting (Workflow::set_fit_memory):
// their count tables grow only while `available` allows, and spill sorted runs to
// `spill_dir` otherwise.
struct FitMemory {
  std::atomic<int64_t> available{0};  // bytes the count tables may still grow by
  std::string spill_dir;
  std::atomic<int64_t> spilled_runs{0}, spilled_bytes{0};  // what went to disk
  bool take(int64_t bytes) {  // reserves `bytes` if that many are left
    int64_t a = available.load();
    while (a >= bytes)
      if (available.compare_exchange_weak(a, a - bytes)) return true;
    return false;
  }
  void give_back(int64_t bytes) { available += bytes; }
};

class CategoricalEncoder : public Op {
 public:
  ColumnType input_type() const override { return ColumnType::Categorical; }
  // Bounds the memory of the next fit (encoders without a fit ignore it).
  virtual void set_fit_memory(std::shared_ptr<FitMemory> memory) {}
  // Joint vocabularies: whether this encoder wants one vocabulary with the other columns of
  // its step, and the call (by the Workflow, on each column's instance but the first) that
  // makes it fit together with `first`.
  virtual bool joint() const { return false; }
  virtual void join_fit(CategoricalEncoder& first) {}
  virtual void fit_begin() {}
  virtual void fit_chunk(const uint64_t* keys, int64_t n) {}
  virtual void fit_end() {}
  // A fit split across the processes of a job (etl/fit_merge.h): whether the state between
  // fit_chunk and fit_end (its partial fit) can be saved as bytes and added to another
  // instance's so that fit_end gives exactly the fit of both instances' keys, and the calls.
  virtual bool partial_fit_mergeable() const { return false; }
  virtual void save_partial_fit(std::string& out) const {}
  // The bytes save_partial_fit would append (without writing them).
  virtual size_t partial_fit_bytes() const { return 0; }
  virtual void add_partial_fit(const char* data, size_t size) {}
  // Number of distinct output ids, including the reserved ones. Valid once fitted.
  virtual int64_t cardinality() const = 0;
  // ids[i] = id of keys[i] (never 0: that id means "missing" and is assigned by the caller).
  virtual void encode(const uint64_t* keys, int64_t n, int64_t* ids) const = 0;
};

class DenseEncoder : public Op {
 public:
  ColumnType input_type() const override { return ColumnType::Dense; }
  // Number of distinct output ids, including id 0 (missing).
  virtual int64_t cardinality() const = 0;
  // ids[i] = id of values[i * stride]; a NaN gets 0.
  virtual void encode(const float* values, int64_t n, int64_t stride, int64_t* ids) const = 0;
};

class ColumnOp : public Op {
 public:
  // The output feature's name, given the name it would have otherwise.
  virtual std::string rename(const std::string& name) const { return name; }
  // Whether a categorical feature of this fitted cardinality leaves the output.
  virtual bool drops(int64_t cardinality) const { return false; }
};

// The columns a FeatureOp reads, as resolved by the Workflow: indices into a RawChunk's
// categorical and dense columns.
struct FeatureInputs {
  std::vector<std::string> cat_names;
  std::vector<int> cat;  // chunk categorical column index of each cat_names entry
  std::vector<bool> cat_multi_hot;
  std::vector<std::string> dense_names;  // extra dense columns the op asked for
  std::vector<int> dense;
  std::string label_name;  // "" when the schema has no label
};

// The training rows of a chunk being transformed (run_etl): rows [0, rows) of the chunk are
// training rows number first, first + 1, ... in fit order (after filtering). Ops that encode
// training rows differently from other rows (k-fold TargetEncoding) use it.
struct TrainRows {
  int64_t first = 0;
  int64_t rows = 0;
};

class FeatureOp : public Op {
 public:
  // One instance per listed column (TargetEncoding, JoinGroupby) or one for all the step's
  // columns together (HashedCross).
  virtual bool per_column() const { return true; }
  // Dense columns it reads besides the step's categorical columns (JoinGroupby's cont_cols).
  virtual std::vector<std::string> dense_inputs() const { return {}; }
  // Receives its resolved inputs; throws (naming `where`) when they do not fit the op.
  virtual void bind(const FeatureInputs& in, const std::string& where) = 0;
  const FeatureInputs& inputs() const { return inputs_; }

  virtual std::vector<std::string> dense_outputs() const { return {}; }
  virtual std::vector<std::string> cat_outputs() const { return {}; }
  virtual int64_t cat_cardinality(size_t output) const { return 0; }

  virtual void fit_begin() {}
  // Rows of the (filtered) training chunk: raw keys, raw dense values, labels.
  virtual void fit_chunk(const io::RawChunk& c) {}
  virtual void fit_end() {}
  // Rows [lo, hi) of `c`: dense output j of row r goes to dense[j][(r - lo) * stride], one-hot
  // categorical output j to ids[j][r - lo] (0 = missing). `train`: which rows of `c` are
  // training rows (nullptr: none, e.g. serving).
  virtual void transform(const io::RawChunk& c, int64_t lo, int64_t hi, float* const* dense,
                         int64_t stride, int64_t* const* ids, const TrainRows* train) const = 0;

 protected:
  FeatureInputs inputs_;
};

class RowFilter : public Op {
 public:
  ColumnType input_type() const override { return ColumnType::Dense; }
  // keep[r] &= predicate(values[r * stride]) for r in [0, n).
  virtual void apply(const float* values, int64_t n, int64_t stride, uint8_t* keep) const = 0;
};

// Builds an op from its JSON object. `r` wraps the object (its "op" key is already read);
// with `fitted` the fitted state is required too (reloading workflow.json), otherwise it is
// an unknown key (a user config).
using OpFactory = std::function<std::unique_ptr<Op>(ConfigReader& r, bool fitted)>;

class OpRegistry {
 public:
  static OpRegistry& global();  // holds every built-in op
  void add(const std::string& name, ColumnType input, OpFactory factory);
  bool has(const std::string& name) const;
  ColumnType input_type(const std::string& name) const;
  // `spec` is {"op": name, ...}; `where` locates it in messages ("pipeline[0].ops[1]").
  // Unknown op names and keys are errors naming the nearest valid one.
  std::unique_ptr<Op> create(const json& spec, const std::string& where, bool fitted) const;
  std::vector<std::string> names() const;

 private:
  struct Entry {
    ColumnType input;
    OpFactory factory;
  };
  std::map<std::string, Entry> ops_;
};

// The built-in families (called by OpRegistry::global()).
void register_dense_ops(OpRegistry& registry);
void register_categorical_ops(OpRegistry& registry);
void register_column_ops(OpRegistry& registry);   // Rename, DropLowCardinality
void register_feature_ops(OpRegistry& registry);  // HashedCross, TargetEncoding, JoinGroupby,
                                                  // Filter

// Stable 64-bit mixing (MurmurHash3's fmix64), the hash of HashBucket, Categorify's
// num_buckets and HashedCross: fixed forever, since fitted workflows depend on it.
inline uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

}  // namespace dlrec::etl
