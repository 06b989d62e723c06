// ETL ops: the per-column steps of a Workflow, and the registry that builds them from JSON.
//
// An op instance belongs to one column (a pipeline step listing three columns makes three
// instances), so its fitted state is that column's. Two families exist:
//   DenseOp             float -> float, element-wise, in place (FillMissing, Clip, LogOp,
//                       Normalize). NaN marks a missing value.
//   CategoricalEncoder  64-bit keys -> ids in [0, cardinality) (Categorify). Id 0 is reserved
//                       for a missing value by every encoder; the Workflow assigns it.
// Ops that learn from data implement the fit_* calls: fit_begin(), then fit_chunk() for every
// chunk of training rows (values already transformed by the ops before it in the column's
// chain), then fit_end(). Fitting is serial per instance; transform is const and thread-safe.
//
// Adding an op: subclass one of the families, give it a factory, and register it in the
// family's register_*_ops() function (docs/ETL.md lists the ops and their JSON).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"

namespace dlrec::etl {

enum class ColumnType { Dense, Categorical };
const char* column_type_name(ColumnType t);  // "dense" | "categorical"

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

class CategoricalEncoder : public Op {
 public:
  ColumnType input_type() const override { return ColumnType::Categorical; }
  virtual void fit_begin() {}
  virtual void fit_chunk(const uint64_t* keys, int64_t n) {}
  virtual void fit_end() {}
  // Number of distinct output ids, including the reserved ones. Valid once fitted.
  virtual int64_t cardinality() const = 0;
  // ids[i] = id of keys[i] (never 0: that id means "missing" and is assigned by the caller).
  virtual void encode(const uint64_t* keys, int64_t n, int64_t* ids) const = 0;
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

}  // namespace dlrec::etl
