// ServedModel: the tensor contract (docs/SERVING.md) and one model version's inference path.
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <algorithm>
#include <string_view>

#include "dlrec/io/schema.h"
#include "dlrec/serve/model_repository.h"
#include "dlrec/serve/request_error.h"
#include "dlrec/store/gpu_cache.h"

namespace dlrec::serve {

namespace {

constexpr const char* kOutput = "probability";

[[noreturn]] void bad(const std::string& msg) { request_fail(Status::InvalidArgument, msg); }

template <class T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Checks the shape is [rows] or [rows, width] (width 1 also for the per-column tensors) and the
// data size matches a fixed-size datatype; returns the element count.
int64_t check_tensor(const InputTensor& t, int64_t rows, int64_t width, bool allow_flat) {
  bool ok = (t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == width) ||
            (allow_flat && t.shape.size() == 1 && t.shape[0] == rows);
  if (!ok) {
    std::string s;
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
    bad(detail::concat("input '", t.name, "' has shape [", s, "]; expected [", rows, ", ", width,
                       "]", allow_flat ? detail::concat(" or [", rows, "]") : ""));
  }
  int64_t n = rows * width;
  int sz = datatype_size(t.datatype);
  if (sz > 0 && static_cast<int64_t>(t.data.size()) != n * sz)
    bad(detail::concat("input '", t.name, "': ", t.data.size(), " bytes of data for ", n, " ",
                       t.datatype, " elements (", n * sz, " bytes expected)"));
  return n;
}

// Element i of a numeric tensor as double.
double number_at(const InputTensor& t, int64_t i) {
  const char* p = t.data.data();
  if (t.datatype == "FP32") return load_le<float>(p + 4 * i);
  if (t.datatype == "FP64") return load_le<double>(p + 8 * i);
  if (t.datatype == "INT32") return load_le<int32_t>(p + 4 * i);
  if (t.datatype == "INT64") return static_cast<double>(load_le<int64_t>(p + 8 * i));
  bad("unreachable");
}

int64_t int_at(const InputTensor& t, int64_t i) {
  const char* p = t.data.data();
  if (t.datatype == "INT32") return load_le<int32_t>(p + 4 * i);
  return load_le<int64_t>(p + 8 * i);
}

void require_type(const InputTensor& t, std::initializer_list<const char*> types) {
  std::string list;
  for (const char* ty : types) {
    if (t.datatype == ty) return;
    list += list.empty() ? ty : std::string(", ") + ty;
  }
  bad(detail::concat("input '", t.name, "' has datatype '", t.datatype, "'; expected one of ",
                     list));
}

// One categorical field as the text reader parses it (hex or hashed string; multi-hot items
// separated by list_sep; empty = missing).
void parse_category(std::string_view f, const io::Schema& schema, bool multi_hot,
                    const std::string& col, std::vector<uint64_t>& vals) {
  auto one = [&](std::string_view v) {
    if (schema.cat_encoding == io::CatEncoding::String) {
      vals.push_back(io::hash_category(v));
      return;
    }
    if (v.size() > 16)
      bad(detail::concat("input '", col, "': '", std::string(v.substr(0, 40)),
                         "' is not a hexadecimal category (more than 16 digits)"));
    uint64_t x = 0;
    for (char ch : v) {
      unsigned d;
      if (ch >= '0' && ch <= '9') d = static_cast<unsigned>(ch - '0');
      else if (ch >= 'a' && ch <= 'f') d = static_cast<unsigned>(ch - 'a' + 10);
      else if (ch >= 'A' && ch <= 'F') d = static_cast<unsigned>(ch - 'A' + 10);
      else
        bad(detail::concat("input '", col, "': '", std::string(v.substr(0, 40)),
                           "' is not a hexadecimal category"));
      x = (x << 4) | d;
    }
    vals.push_back(x);
  };
  if (f.empty()) return;
  if (!multi_hot) return one(f);
  size_t p = 0;
  while (p <= f.size()) {
    size_t q = f.find(schema.list_sep, p);
    if (q == std::string_view::npos) q = f.size();
    if (q > p) one(f.substr(p, q - p));
    p = q + 1;
  }
}

// The encoded inputs' copy-and-check loops, one pass each; compiled for AVX2 too (picked at
// run time where the CPU has it: 4 ids per instruction instead of 1).
// Copies n ids (or checks them in place when src == dst); whether any is outside [0, card).
__attribute__((target_clones("avx2", "default"))) bool copy_ids(const char* src, int64_t* dst,
                                                                  int64_t n, uint64_t card) {
  uint64_t out = 0;
  if (src == reinterpret_cast<const char*>(dst)) {
    for (int64_t r = 0; r < n; ++r) out |= static_cast<uint64_t>(static_cast<uint64_t>(dst[r]) >= card);
  } else {
    for (int64_t r = 0; r < n; ++r) {
      int64_t v;
      std::memcpy(&v, src + 8 * r, 8);
      dst[r] = v;
      out |= static_cast<uint64_t>(static_cast<uint64_t>(v) >= card);
    }
  }
  return out != 0;
}

// Copies n floats (or checks them in place); whether any is not finite (exponent bits all set).
__attribute__((target_clones("avx2", "default"))) bool copy_floats(const char* src, float* dst,
                                                                     size_t n) {
  uint32_t bad = 0;
  char* d = reinterpret_cast<char*>(dst);
  if (src == d) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, src + 4 * i, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, src + 4 * i, 4);
      std::memcpy(d + 4 * i, &bits, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
  }
  return bad != 0;
}

// t of an encoded input named "cat_<t>", else -1.
int cat_index(const std::string& name) {
  if (name.rfind("cat_", 0) != 0 || name.size() <= 4 || name.size() >= 12) return -1;
  int idx = 0;
  for (size_t k = 4; k < name.size(); ++k) {
    if (name[k] < '0' || name[k] > '9') return -1;
    idx = idx * 10 + (name[k] - '0');
  }
  return idx;
}

}  // namespace

ServedModel::ServedModel(std::string name, int64_t version, const std::string& dir,
                         const BatchingConfig& batching, std::shared_ptr<ModelStats> stats,
                         const InstanceGroup& instances)
    : name_(std::move(name)), version_(version), batching_(batching), stats_(std::move(stats)) {
  auto device_of = [&](int64_t i) {
    if (!instances.gpu) return Device::cpu();
    return Device::cuda(static_cast<int>(instances.gpus[i % instances.gpus.size()]));
  };
  const store::StoreConfig* store = instances.store.get();  // null: model.json's, or none
  predictor_ = std::make_unique<train::Predictor>(dir, device_of(0), instances.precision, store);
  for (int64_t i = 1; i < instances.count; ++i)
    more_.push_back(
        std::make_unique<train::Predictor>(dir, device_of(i), instances.precision, store));
  layout_ = predictor_->workflow().output_layout();
  int di = 0, ci = 0;
  for (const auto& c : predictor_->workflow().schema().columns) {
    if (c.kind == io::ColumnKind::Dense) raw_col_[c.name] = di++;
    if (c.kind == io::ColumnKind::Categorical) raw_col_[c.name] = ~(ci++);
  }
  batcher_ = std::make_unique<DynamicBatcher>(
      batching_, static_cast<int>(instances.count),
      [this](const io::Batch& b, int worker) {
        return worker == 0 ? predictor_->predict(b) : more_[worker - 1]->predict(b);
      },
      [this](int64_t rows, uint64_t ns) { stats_->add_execution(rows, ns); });
  // The store's counters for the metrics endpoint, published last: a constructor that throws
  // before this point never leaves pointers into its freed predictors there.
  ModelStats::StoreTiers tiers;
  for (int64_t i = 0; i < instances.count; ++i) {
    train::Predictor& p = i == 0 ? *predictor_ : *more_[i - 1];
    if (p.gpu_cache()) tiers.emplace_back("gpu", &p.gpu_cache()->stats);
    if (p.store())
      for (const auto& t : p.store()->tiers()) tiers.emplace_back(t->name(), &t->stats);
  }
  if (!tiers.empty()) stats_->set_store_tiers(this, std::move(tiers));
}

ServedModel::~ServedModel() {
  batcher_.reset();  // finishes queued requests first
  stats_->clear_store_tiers(this);
}

std::vector<TensorInfo> ServedModel::raw_inputs() const {
  const io::Schema& s = predictor_->workflow().schema();
  // A dense column the label is derived from ("label") is not an input of the model.
  const std::string label_col = predictor_->workflow().derived_label_column();
  std::vector<TensorInfo> out;
  for (const auto& c : s.columns) {
    if (c.kind == io::ColumnKind::Dense && c.name != label_col)
      out.push_back({c.name, "FP32", {-1, 1}});
    if (c.kind == io::ColumnKind::Categorical) out.push_back({c.name, "BYTES", {-1, 1}});
  }
  return out;
}

std::vector<TensorInfo> ServedModel::encoded_inputs() const {
  std::vector<TensorInfo> out;
  if (layout_.num_dense > 0) out.push_back({"dense", "FP32", {-1, layout_.num_dense}});
  for (size_t t = 0; t < layout_.cardinalities.size(); ++t)
    out.push_back({"cat_" + std::to_string(t), "INT64", {-1, 1}});
  return out;
}

std::vector<TensorInfo> ServedModel::outputs() const { return {{kOutput, "FP32", {-1, 1}}}; }

io::Batch ServedModel::encode(const InferRequest& req) const {
  io::Batch batch;
  encode_into(req, batch);
  return batch;
}

// Long (~180 lines) on purpose: the per-request hot path validates and copies each input in one
// pass over the request, so nothing is allocated, copied twice or checked twice between stages.
void ServedModel::encode_into(const InferRequest& req, io::Batch& batch) const {
  // Encoded inputs reuse `batch`'s buffers: nothing is allocated or zero-filled when it held a
  // request of as many rows before. What this path leaves in a batch it marks one_id_per_row
  // (set last, after every check): its labels are all 0 and each feature's offsets hold
  // offsets[r] == r over their whole length, so the next request only extends them.
  const bool reusable = batch.one_id_per_row;
  batch.one_id_per_row = false;
  if (req.inputs.empty()) bad("the request has no inputs");
  const io::Schema& schema = predictor_->workflow().schema();
  const int nd = schema.num_dense(), nc = schema.num_cat();

  // Which contract: raw (schema column names) or encoded ("dense", "cat_<t>").
  const auto& raw_col = raw_col_;
  bool raw = raw_col.count(req.inputs[0].name) > 0;

  const InputTensor& first = req.inputs[0];
  if (first.shape.empty()) bad(detail::concat("input '", first.name, "' has no dimensions"));
  const int64_t rows = first.shape[0];
  if (rows < 1) bad(detail::concat("input '", first.name, "': the batch dimension is ", rows));
  if (rows > batching_.max_batch_size)
    bad(detail::concat("the request has ", rows, " rows; this model accepts at most ",
                       batching_.max_batch_size, " (max_batch_size)"));

  {
    std::vector<std::string_view> names;  // sorted, so a repeated name is adjacent
    names.reserve(req.inputs.size());
    for (const auto& t : req.inputs) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end()) bad(detail::concat("input '", *dup, "' appears twice"));
  }
  auto has_input = [&](std::string_view name) {  // error paths only
    for (const auto& t : req.inputs)
      if (t.name == name) return true;
    return false;
  };

  if (raw) {
    io::RawChunk chunk;
    chunk.reset(nd, nc);
    chunk.rows = rows;
    chunk.first_line = 1;
    chunk.label.clear();  // no labels: the workflow leaves them 0 (a derived one is not computed)
    chunk.dense.assign(static_cast<size_t>(rows * nd), NAN);
    const std::vector<bool> multi = schema.cat_multi_hot();
    for (const auto& t : req.inputs) {
      auto it = raw_col.find(t.name);
      if (it == raw_col.end())
        bad(detail::concat("unknown input '", t.name, "' (raw inputs are the schema's dense and "
                           "categorical columns; do not mix them with encoded inputs)"));
      if (it->second >= 0) {
        const int d = it->second;
        require_type(t, {"FP32", "FP64", "INT32", "INT64"});
        check_tensor(t, rows, 1, true);
        for (int64_t r = 0; r < rows; ++r) {
          double v = number_at(t, r);
          if (std::isinf(v) || (!std::isnan(v) && !std::isfinite(static_cast<float>(v))))
            bad(detail::concat("input '", t.name, "' row ", r, ": the value is not finite"));
          chunk.dense[static_cast<size_t>(r * nd + d)] = static_cast<float>(v);
        }
      } else {
        const int c = ~it->second;
        auto& vals = chunk.cat_values[c];
        auto& offs = chunk.cat_offsets[c];
        offs.assign(1, 0);
        require_type(t, {"BYTES", "INT64", "INT32"});
        check_tensor(t, rows, 1, true);
        if (t.datatype == "BYTES") {
          std::vector<std::string_view> items = split_bytes(t.data, rows, t.name);
          for (int64_t r = 0; r < rows; ++r) {
            parse_category(items[static_cast<size_t>(r)], schema, multi[c], t.name, vals);
            offs.push_back(static_cast<int64_t>(vals.size()));
          }
        } else {
          for (int64_t r = 0; r < rows; ++r) {
            int64_t k = int_at(t, r);
            if (k >= 0) vals.push_back(static_cast<uint64_t>(k));  // negative: missing
            offs.push_back(static_cast<int64_t>(vals.size()));
          }
        }
      }
    }
    // A dense column the label is derived from ("label") is not needed to predict.
    const std::string label_col = predictor_->workflow().derived_label_column();
    // (A label derived from a side table's column (join_external) is no raw input at all.)
    const int optional = !label_col.empty() && raw_col.count(label_col) && !has_input(label_col)
                             ? 1 : 0;
    if (static_cast<int>(req.inputs.size()) + optional != nd + nc) {
      std::string missing;
      for (const auto& c : schema.columns)
        if ((c.kind == io::ColumnKind::Dense || c.kind == io::ColumnKind::Categorical) &&
            c.name != label_col && !has_input(c.name))
          missing += (missing.empty() ? "" : ", ") + c.name;
      bad("missing raw inputs: " + missing);
    }
    io::Batch encoded;
    try {
      predictor_->workflow().transform(chunk, encoded);
    } catch (const Error& e) {
      bad(std::string("raw features: ") + e.what());
    }
    batch = std::move(encoded);
    batch.one_id_per_row = false;  // the invariant above does not hold for these offsets
    return;
  }

  const int ncat = static_cast<int>(layout_.cardinalities.size());
  batch.rows = rows;
  batch.num_dense = layout_.num_dense;
  if (reusable) batch.labels.resize(static_cast<size_t>(rows));  // new elements are 0
  else batch.labels.assign(static_cast<size_t>(rows), 0.f);
  if (layout_.num_dense == 0) batch.dense.clear();  // else resized and overwritten below
  batch.cat_offsets.resize(static_cast<size_t>(ncat));
  batch.cat_indices.resize(static_cast<size_t>(ncat));
  for (const auto& t : req.inputs) {
    if (t.name == "dense" && layout_.num_dense > 0) {
      require_type(t, {"FP32"});
      check_tensor(t, rows, layout_.num_dense, layout_.num_dense == 1);
      const size_t n = static_cast<size_t>(rows * layout_.num_dense);
      batch.dense.resize(n);
      // Copied and checked in one pass; the data may already lie in the batch (input_buffer):
      // then it is only checked.
      if (copy_floats(t.data.data(), batch.dense.data(), n))
        for (size_t i = 0; i < n; ++i)
          if (!std::isfinite(batch.dense[i]))
            bad(detail::concat("input 'dense' row ", static_cast<int64_t>(i) / layout_.num_dense,
                               ": the value is not finite"));
      continue;
    }
    const int idx = cat_index(t.name);
    if (idx < 0 || idx >= ncat)
      bad(detail::concat("unknown input '", t.name, "' (encoded inputs: 'dense' and 'cat_0'..'cat_",
                         ncat - 1, "'; raw inputs: the schema's columns)"));
    require_type(t, {"INT64", "INT32"});
    check_tensor(t, rows, 1, true);
    auto& ids = batch.cat_indices[idx];
    auto& offs = batch.cat_offsets[idx];
    ids.resize(static_cast<size_t>(rows));  // overwritten below
    // offsets[r] = r: only the part the last request did not cover is written.
    const size_t have = reusable ? std::min(offs.size(), static_cast<size_t>(rows + 1)) : 0;
    offs.resize(static_cast<size_t>(rows + 1));
    for (size_t r = have; r < offs.size(); ++r) offs[r] = static_cast<int64_t>(r);
    const int64_t card = layout_.cardinalities[static_cast<size_t>(idx)];
    // The type is checked once; the values are copied (little-endian hosts) and range-checked
    // in the same pass (one unsigned compare: a negative id is a huge unsigned one).
    const uint64_t ucard = static_cast<uint64_t>(card);
    bool out_of_range = false;
    const char* src = t.data.data();
    int64_t* dst = ids.data();
    if (t.datatype == "INT64") {
      out_of_range = copy_ids(src, dst, rows, ucard);  // or only checked, when in place
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        int32_t v;
        std::memcpy(&v, src + 4 * r, 4);
        dst[r] = v;
        out_of_range |= static_cast<uint64_t>(int64_t{v}) >= ucard;
      }
    }
    if (out_of_range)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t id = ids[static_cast<size_t>(r)];
        if (id < 0 || id >= card)
          bad(detail::concat("input '", t.name, "' row ", r, ": id ", id, " is outside [0, ",
                             card, ")"));
      }
  }
  if (static_cast<int>(req.inputs.size()) != ncat + (layout_.num_dense > 0 ? 1 : 0)) {
    std::string missing;
    if (layout_.num_dense > 0 && !has_input("dense")) missing = "dense";
    for (int t = 0; t < ncat; ++t)
      if (!has_input("cat_" + std::to_string(t)))
        missing += (missing.empty() ? "cat_" : ", cat_") + std::to_string(t);
    bad("missing encoded inputs: " + missing);
  }
  // Every encoded cat_<t> is [rows] (checked above), each feature was written once (names are
  // distinct) and all are present: one id per row, and the invariant above holds.
  batch.one_id_per_row = true;
}

char* ServedModel::input_buffer(io::Batch& batch, const InputTensor& t, size_t bytes) const {
  if (t.shape.empty() || t.shape[0] < 1 || t.shape[0] > batching_.max_batch_size ||
      raw_col_.count(t.name))
    return nullptr;
  const size_t rows = static_cast<size_t>(t.shape[0]);
  if (t.name == "dense" && layout_.num_dense > 0) {
    const size_t n = rows * static_cast<size_t>(layout_.num_dense);
    if (t.datatype != "FP32" || bytes != n * sizeof(float)) return nullptr;
    batch.dense.resize(n);  // as encode_into will
    return reinterpret_cast<char*>(batch.dense.data());
  }
  const int idx = cat_index(t.name);
  const size_t ncat = layout_.cardinalities.size();
  if (idx < 0 || static_cast<size_t>(idx) >= ncat || t.datatype != "INT64" ||
      bytes != rows * sizeof(int64_t))
    return nullptr;
  if (batch.cat_indices.size() < ncat) batch.cat_indices.resize(ncat);
  auto& ids = batch.cat_indices[static_cast<size_t>(idx)];
  ids.resize(rows);  // as encode_into will
  return reinterpret_cast<char*>(ids.data());
}

InferResponse ServedModel::infer(const InferRequest& req) {
  InferResponse out;
  std::exception_ptr failed;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  infer_async(req, [&](InferResponse* resp, std::exception_ptr err) {
    if (resp) out = std::move(*resp);
    failed = std::move(err);
    std::lock_guard<std::mutex> lk(mu);
    finished = true;
    cv.notify_one();  // under the lock: `cv` lives on the waiting thread's stack
  });
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return finished; });
  if (failed) std::rethrow_exception(failed);
  return out;
}

void ServedModel::infer_async(const InferRequest& req, InferDone done, int64_t inline_max_rows,
                              io::Batch* reuse) {
  const uint64_t t0 = now_ns();
  io::Batch own;
  io::Batch& batch = reuse ? *reuse : own;
  try {
    for (const auto& o : req.outputs)
      if (o.name != kOutput)
        bad(detail::concat("unknown output '", o.name, "' (the output is '", kOutput, "')"));
    encode_into(req, batch);
  } catch (...) {
    stats_->fail.add(now_ns() - t0);
    return done(nullptr, std::current_exception());
  }
  const uint64_t t1 = now_ns();
  DynamicBatcher::Done scored = [this, t0, t1, id = req.id, done = std::move(done)](
                                    DynamicBatcher::Result&& r, std::exception_ptr err) {
    if (err) {
      stats_->fail.add(now_ns() - t0);
      return done(nullptr, std::move(err));
    }
    InferResponse resp;
    resp.model = name_;
    resp.version = version_str();
    resp.id = id;
    resp.rows = static_cast<int64_t>(r.outputs.size());
    resp.probability = std::move(r.outputs);
    const uint64_t t2 = now_ns();
    stats_->compute_input.add(t1 - t0);
    stats_->queue.add(r.queue_ns);
    stats_->compute_infer.add(r.compute_ns);
    const uint64_t end = t1 + r.queue_ns + r.compute_ns;
    stats_->compute_output.add(t2 > end ? t2 - end : 0);
    stats_->success.add(t2 - t0);
    stats_->success_us.add(t2 - t0);
    stats_->last_inference_ms.store(wall_ms(), std::memory_order_relaxed);
    done(&resp, nullptr);
  };
  try {
    if (reuse) batcher_->submit_ref(batch, std::move(scored), inline_max_rows);
    else batcher_->submit(std::move(batch), std::move(scored), inline_max_rows);
  } catch (...) {
    // Rejected (queue full, unloading): `scored` was left as it was; it reports the failure.
    scored(DynamicBatcher::Result(), std::current_exception());
  }
}

}  // namespace dlrec::serve
