#include "dlrec/train/export.h"

#ifdef DLREC_WITH_CUDA
#include "dlrec/model/graph_cuda.h"
#endif

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "dlrec/compress/compressed_records.h"
#include "dlrec/compress/quantize.h"
#include "dlrec/compress/sparsity.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/io/text_reader.h"
#include "dlrec/store/gpu_cache.h"
#include "dlrec/train/onnx_export.h"
#include "dlrec/train/trainer.h"
#include "train/export_store.h"

namespace dlrec::train {

namespace fs = std::filesystem;

namespace {

// Refuses parameters holding NaN or Inf (a diverged run): a served model would answer NaN for
// every request. The error names the first such tensor, its count and first position.
void check_finite(const std::vector<model::NamedTensor>& params) {
  for (const auto& [name, t] : params) {
    if (!t.defined()) continue;
    const Tensor c = t.to(Device::cpu());
    const int64_t n = c.numel();
    int64_t bad = 0, first = -1;
    auto note = [&](int64_t i) {
      if (first < 0) first = i;
      ++bad;
    };
    if (c.dtype() == DType::F32) {
      const float* v = c.data<float>();
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(v[i])) note(i);
    } else if (c.dtype() == DType::BF16 || c.dtype() == DType::F16) {
      const uint16_t* v = static_cast<const uint16_t*>(c.raw());
      const uint16_t exp = c.dtype() == DType::BF16 ? 0x7F80 : 0x7C00;  // all-ones exponent
      for (int64_t i = 0; i < n; ++i)
        if ((v[i] & exp) == exp) note(i);
    }
    if (bad)
      fail("export: parameter tensor '", name, "' holds ", bad, " non-finite value(s) (NaN or Inf)",
           ", the first at element ", first, " of ", n,
           "; the training diverged (lower the learning rate or resume from an earlier "
           "checkpoint): nothing was exported");
  }
}

// Writes model.json, workflow.json and weights.dlrec into a staging directory
// ("<out_dir>.tmp.<pid>") and puts it in place with replace_dir (an existing out_dir is replaced
// only with `overwrite`): out_dir names a complete model, old or new, at every moment, even if
// the process is killed. Leftovers of a killed export are cleaned first (recover_dir).
// With tiers: the fixed tables go into the RocksDB store first (a failure there leaves no new
// model), then stay out of weights.dlrec, and model.json names the store.
// 16 hex digits, new for every export that writes a store.
std::string new_export_id() {
  std::random_device rd;
  const uint64_t v =
      (uint64_t{rd()} << 32) ^ rd() ^
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void write_model_dir(const std::string& out_dir, bool overwrite, json meta, model::Model& model,
                     const etl::Workflow& wf, OnnxExport onnx, const TierExport& tiers) {
  for (const std::string& line : recover_dir(out_dir))
    std::fprintf(stderr, "export: %s\n", line.c_str());
  if (fs::exists(out_dir) && !overwrite)
    fail("'", out_dir, "' already exists (use --overwrite to replace it)");
  std::vector<model::NamedTensor> params = model.parameters();
  check_finite(params);
  const auto quantized = model.quantized_tables();
  if (tiers.any() && !quantized.empty())
    fail("export: table '", quantized[0].first,
         "' is served from row-wise quantized codes, which an embedding store does not hold: "
         "export without --tiers");
  if (tiers.any()) {
    const std::vector<store::TableInfo> tables = detail::find_store_tables(
        model::RunConfig::from_json(meta.at("config")), wf.output_layout());
    std::vector<store::TableRows> rows;
    for (const store::TableInfo& t : tables)
      for (const auto& [name, tensor] : params)
        if (name == t.name) rows.push_back({t, tensor.data<float>()});
    const std::string dir = fs::absolute(tiers.rocksdb_dir).lexically_normal().string();
    const std::string out = fs::absolute(out_dir).lexically_normal().string();
    const fs::path rel = fs::path(dir).lexically_relative(out);
    DLREC_CHECK(rel.empty() || *rel.begin() == "..", "export: the store directory '", dir,
                "' is inside the model directory '", out,
                "', which an export replaces whole: put it beside (e.g. '", out, ".tables')");
    // The store and the model name one id: a model refuses a store another export wrote over
    // its path (an export that failed after writing the store, a store of another run).
    const std::string id = new_export_id();
    store::write_rocksdb_store(dir, rows, overwrite, id);
    meta["embedding_store"] = {{"rocksdb", {{"path", dir}, {"export_id", id}}}};
    std::vector<model::NamedTensor> dense;
    for (auto& p : params) {
      bool stored = false;
      for (const store::TableInfo& t : tables) stored |= p.first == t.name;
      if (!stored) dense.push_back(p);
    }
    params.swap(dense);
  }
  // Pruning masks beside their weights, named in the meta (docs/COMPRESSION.md).
  json weights_meta = {{"kind", "weights"}};
  for (auto& t : model.masks()) params.push_back(t);
  if (!model.masks().empty()) weights_meta["masks"] = compress::mask_names(model);
  // INT8 layers: their int8 weights and scales beside the fp32 ones (docs/COMPRESSION.md).
  json quant;
  for (auto& t : compress::quant_tensors(model, quant)) params.push_back(t);
  if (!quant.is_null()) weights_meta["quant"] = quant;
  // Row-wise quantized tables: their codes, scales and biases instead of the fp32 values.
  if (!quantized.empty()) {
    json list = json::array();
    for (const auto& table : quantized) {
      const std::string& name = table.first;
      params.erase(std::remove_if(params.begin(), params.end(),
                                  [&](const model::NamedTensor& p) { return p.first == name; }),
                   params.end());
      for (auto& t : compress::quantized_table_tensors(name, *table.second)) params.push_back(t);
      list.push_back(compress::quantized_table_meta(name, *table.second));
    }
    weights_meta["embedding_quant"] = list;
  }
  // Each version only where needed, so that a model stays readable by the oldest build that
  // can serve it: version 1 plain, 2 with masks, INT8 layers or tables in an embedding store
  // (which older builds would misread as missing tensors), 3 with quantized tables.
  const bool needs_v2 = weights_meta.contains("masks") || weights_meta.contains("quant") ||
                        meta.contains("embedding_store");
  meta["version"] = !quantized.empty() ? kModelFormatVersion
                    : needs_v2         ? kModelFormatMasks
                                       : kModelFormatOldest;
  const std::string tmp = staging_dir_for(out_dir);
  fs::remove_all(tmp);
  make_dirs(tmp);
  try {
    io::save_tensors(tmp + "/weights.dlrec", params, weights_meta);
    wf.save(tmp + "/workflow.json");
    write_file_atomic(tmp + "/model.json", meta.dump(2));
    if (onnx != OnnxExport::None) {
      const model::RunConfig cfg = model::RunConfig::from_json(meta.at("config"));
      write_onnx_model(
          tmp, cfg.model, wf.output_layout(), model,
          onnx == OnnxExport::ExternalData ? OnnxWeights::External : OnnxWeights::Auto);
    }
    replace_dir(tmp, out_dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace

void TierExport::add(const std::string& spec) {
  const size_t eq = spec.find('=');
  const std::string kind = spec.substr(0, eq);
  const std::string value = eq == std::string::npos ? "" : spec.substr(eq + 1);
  if (kind == "rocksdb") {
    DLREC_CHECK(!value.empty(), "--tiers '", spec, "': expected rocksdb=DIR");
    DLREC_CHECK(rocksdb_dir.empty(), "--tiers: rocksdb given twice");
    rocksdb_dir = value;
    return;
  }
  fail("--tiers '", spec, "': unknown tier '", kind,
       "' (export writes tables into: rocksdb=DIR; the host tier is a serving cache)");
}

void export_model(const std::string& run_dir, const std::string& out_dir, bool overwrite,
                  OnnxExport onnx, const TierExport& tiers) {
  const RunInfo info = load_run_info(run_dir);
  const model::RunConfig& cfg = info.config;
  const std::string data_dir = run_data_dir(run_dir, info.run);
  std::string ckpt = run_dir + "/checkpoint.dlrec";
  DLREC_CHECK(file_exists(ckpt), "no checkpoint at '", ckpt, "' (train first)");
  io::DatasetInfo data = io::DatasetInfo::load(data_dir);
  etl::Workflow wf = etl::Workflow::load(data_dir + "/workflow.json");
  DLREC_CHECK(wf.output_layout() == data.layout, "workflow.json of '", data_dir,
              "' does not match its dataset.json");
  auto model = model::build_model(cfg.model, cfg.optimizer, data.layout, Device::cpu(), 0);
  CheckpointState st = load_checkpoint(ckpt, *model);
  check_checkpoint_layout(ckpt, st, data.layout, data_dir);
  json meta = {{"format", "dlrec-model"},
               {"version", kModelFormatVersion},
               {"config", cfg.to_json()},
               {"layout", data.layout.to_json()},
               {"step", st.step}};
  write_model_dir(out_dir, overwrite, meta, *model, wf, onnx, tiers);
}

void export_initialized(const std::string& config_path, const std::string& data_dir,
                        const std::string& out_dir, uint64_t seed, bool overwrite, OnnxExport onnx,
                        const TierExport& tiers) {
  model::RunConfig cfg = model::RunConfig::load(config_path);
  io::DatasetInfo data = io::DatasetInfo::load(data_dir);
  etl::Workflow wf = etl::Workflow::load(data_dir + "/workflow.json");
  DLREC_CHECK(wf.output_layout() == data.layout, "workflow.json of '", data_dir,
              "' does not match its dataset.json");
  auto model = model::build_model(cfg.model, cfg.optimizer, data.layout, Device::cpu(), seed);
  json meta = {{"format", "dlrec-model"},
               {"version", kModelFormatVersion},
               {"config", cfg.to_json()},
               {"layout", data.layout.to_json()},
               {"step", 0}};
  write_model_dir(out_dir, overwrite, meta, *model, wf, onnx, tiers);
}

void export_loaded_model(model::Model& model, const model::RunConfig& config,
                         const io::ShardLayout& layout, int64_t step, const etl::Workflow& wf,
                         const std::string& out_dir, bool overwrite) {
  DLREC_CHECK(wf.output_layout() == layout, "export: the workflow does not match the layout");
  json meta = {{"format", "dlrec-model"},
               {"version", kModelFormatVersion},
               {"config", config.to_json()},
               {"layout", layout.to_json()},
               {"step", step}};
  write_model_dir(out_dir, overwrite, meta, model, wf, OnnxExport::None, TierExport{});
}

namespace {

// Which file a path named when it was read (device, inode, size, modification time).
struct WeightsFileId {
  uint64_t dev = 0, ino = 0;
  int64_t size = 0, mtime_ns = 0;
  bool operator==(const WeightsFileId& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
};

WeightsFileId weights_file_id(const std::string& path) {
  struct stat st {};
  DLREC_CHECK(::stat(path.c_str(), &st) == 0, "cannot read '", path, "': ", std::strerror(errno));
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

}  // namespace

struct Predictor::Impl {
  std::string dir;
  Device device;
  std::string precision;
  model::RunConfig cfg;
  io::ShardLayout layout;
  std::unique_ptr<etl::Workflow> wf;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<detail::StagedTables> staged;  // with an embedding store
  std::unique_ptr<store::GpuCache> gpu_cache;    // with a store on a GPU: its cache tier
  WeightsFileId weights_id;                      // of the weights.dlrec the model was loaded from
  int64_t quantized_bytes = 0;  // the row-wise quantized tables' codes, scales and biases
  // How a CUDA model chooses its compressed layers' kernels (kept across rebuilds).
  nn::kernel_choice::Policy policy = nn::kernel_choice::Policy::Fastest;
  // Builds the model for `layout` and loads its weights (those of weights.dlrec; with a store,
  // all but the stored tables).
  void build(const io::ShardLayout& for_layout);
  // With the GPU cache: builds the model with `staging` rows per stored feature after the
  // cache's, and binds the cache to its device tables.
  void build_gpu(int64_t staging);
};

void Predictor::Impl::build_gpu(int64_t staging) {
  // No background insert may write into the model (its tables, its stream) that build()
  // replaces: the queue is emptied first (predict() is the only producer, and it is here).
  gpu_cache->drain();
  io::ShardLayout l = staged->layout();
  const store::GpuCacheSizing& z = gpu_cache->sizing();
  for (size_t k = 0; k < z.features.size(); ++k)
    l.cardinalities[z.features[k]] = z.cache_rows[k] + staging;
  build(l);
  std::vector<float*> ptrs;
  std::vector<int64_t> dims, rows;
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model->parameters()) params[name] = t;
  for (const store::TableInfo& t : staged->store().tables()) {
    auto it = params.find(t.name);
    const int64_t want = l.cardinalities[t.feature];
    DLREC_CHECK(it != params.end() && it->second.shape() == Shape({want, t.dim}) &&
                    it->second.device().is_cuda(),
                "gpu cache: the model has no device table '", t.name, "' of ", want, " rows");
    ptrs.push_back(it->second.data<float>());
    dims.push_back(t.dim);
    rows.push_back(want);
  }
  // The rows' writes go on the model's serving stream, ahead of its forward.
  void* stream = nullptr;
#ifdef DLREC_WITH_CUDA
  if (auto* cm = dynamic_cast<model::CudaModel*>(model.get())) stream = cm->serving_stream();
#endif
  gpu_cache->bind(store::make_cuda_rows(device.index, std::move(ptrs), std::move(dims),
                                        std::move(rows), stream),
                  staging);
}

void Predictor::Impl::build(const io::ShardLayout& for_layout) {
  // Built and loaded aside, then swapped in: a failed rebuild (a larger batch with a store)
  // leaves the model that served before, never one with initial weights.
  std::unique_ptr<model::Model> fresh =
      model::build_model(cfg.model, cfg.optimizer, for_layout, device, 0, precision);
  // Weights that are NaN or infinite would score every row NaN: refused at load.
  io::TensorLoadOptions load;
  load.require_finite = true;
  const std::string weights = dir + "/weights.dlrec";
  // A rebuild reads weights.dlrec again: it must be the file the first build read, not a
  // model exported over this directory since (its dense weights would not match the rest).
  const WeightsFileId id = weights_file_id(weights);
  if (model) {
    DLREC_CHECK(id == weights_id, "'", weights,
                "' changed since this model was loaded (exported again over it?): reload the "
                "model");
  }
  model::Model& mdl = *fresh;
  // Masks are kept beside their (already zero) weights where the model can hold them (the CPU
  // engine); a CUDA model takes the masks and INT8 records as compressed layers
  // (Model::set_compressed: its kernels chosen per layer, docs/COMPRESSION.md).
  const json weights_meta = io::read_tensor_meta(weights);
  const bool cuda = mdl.device().is_cuda();
  if (cuda)
    load.allow_extra = weights_meta.is_object() &&
                       (weights_meta.contains("masks") || weights_meta.contains("quant"));
  else
    compress::prepare_masks(weights_meta, weights, mdl);
  const std::vector<model::NamedTensor> quant =
      cuda ? std::vector<model::NamedTensor>{}
           : compress::prepare_quant(weights_meta, weights, mdl);
  // Row-wise quantized tables are read from their codes, not as fp32 values.
  std::vector<model::QuantizedTable> qrecords =
      compress::read_quantized_tables(weights_meta, weights, mdl);
  std::vector<std::string> qtables;
  for (const auto& q : qrecords) qtables.push_back(q.name);
  DLREC_CHECK(qtables.empty() || !staged, "'", weights, "': table '",
              qtables.empty() ? "" : qtables[0],
              "' is served from row-wise quantized codes, which an embedding store does not hold: "
              "serve the model without one");
  if (!qtables.empty()) load.allow_extra = true;  // the codes, read above
  // Before parameters(): a CUDA model then never allocates those tables' fp32 rows.
  std::map<std::string, int64_t> qbytes_of;
  for (const auto& q : qrecords) qbytes_of[q.name] = q.rows.bytes();
  mdl.set_quantized_tables(std::move(qrecords));
  std::vector<model::NamedTensor> targets;
  for (auto& t : mdl.parameters()) {
    if (t.second.nbytes() > 0) qbytes_of.erase(t.first);  // its values, not its codes
    if ((!staged || !staged->is_table(t.first)) &&
        std::find(qtables.begin(), qtables.end(), t.first) == qtables.end())
      targets.push_back(t);
  }
  int64_t qbytes = 0;  // the tables served from their codes
  for (const auto& [name, b] : qbytes_of) qbytes += b;
  for (auto& t : mdl.masks()) targets.push_back(t);
  targets.insert(targets.end(), quant.begin(), quant.end());
  if (staged) load.allow_extra = true;  // a model exported without tiers holds the tables too
  io::load_tensors(weights, targets, load);
  compress::apply_loaded_masks(weights, mdl);
  compress::apply_loaded_quant(quant, weights, mdl);
  // The CPU engine's fp32 layers on packed weights (the INT8 ones keep their records).
  if (!cuda) mdl.prepare_cpu_inference();
  if (cuda)
    mdl.set_compressed(compress::read_compressed_weights(weights_meta, weights, mdl), policy);
  if (staged && !gpu_cache) staged->bind(mdl);  // all or nothing: the old one stays on failure
  model = std::move(fresh);
  weights_id = id;
  quantized_bytes = qbytes;
}

Predictor::Predictor(const std::string& dir, Device device, const std::string& precision,
                     const store::StoreConfig* store)
    : impl_(new Impl) {
  json meta = read_json_file(dir + "/model.json");
  DLREC_CHECK(meta.value("format", "") == "dlrec-model", "'", dir,
              "/model.json' is not a dlrec model (format field)");
  int version = meta.value("version", 0);
  DLREC_CHECK(version <= kModelFormatVersion, "'", dir, "' has model format version ", version,
              ", newer than this dlrec reads (", kModelFormatOldest, " .. ", kModelFormatVersion,
              "): it was written by a newer dlrec (compressed models); use that build");
  DLREC_CHECK(version >= kModelFormatOldest, "'", dir, "' has model format version ", version,
              "; this dlrec reads versions ", kModelFormatOldest, " .. ", kModelFormatVersion);
  impl_->dir = dir;
  impl_->device = device;
  impl_->precision = precision;
  impl_->cfg = model::RunConfig::from_json(meta.at("config"));
  impl_->layout = io::ShardLayout::from_json(meta.at("layout"));
  impl_->wf = std::make_unique<etl::Workflow>(etl::Workflow::load(dir + "/workflow.json"));
  DLREC_CHECK(impl_->wf->output_layout() == impl_->layout, "'", dir,
              "': workflow.json does not match the model's input layout");
  // A model exported with --tiers names its store; a config given here takes precedence.
  store::StoreConfig from_meta, given;
  if (meta.contains("embedding_store"))
    from_meta = store::StoreConfig::from_json(meta["embedding_store"], dir,
                                              dir + "/model.json: embedding_store");
  if (!store && meta.contains("embedding_store")) {
    store = &from_meta;
  } else if (store && store->rocksdb && store->rocksdb_export_id.empty() && from_meta.rocksdb &&
             fs::path(store->rocksdb_path).lexically_normal() ==
                 fs::path(from_meta.rocksdb_path).lexically_normal()) {
    given = *store;  // the model's own store, named by a serving config: its id is checked too
    given.rocksdb_export_id = from_meta.rocksdb_export_id;
    store = &given;
  }
  if (store) {
    auto tables = detail::find_store_tables(impl_->cfg, impl_->layout);
    store::GpuCacheSizing sizing;
    if (device.is_cuda()) {  // sized before anything is opened: a cache too large is refused
      DLREC_CHECK(impl_->cfg.train.loss != "mse", "'", dir,
                  "': the GPU cache tier serves classification models (train.loss \"mse\" is "
                  "served through the store on the CPU only)");
      int64_t free_b = 0, total_b = 0;
      store::cuda_memory_info(device.index, &free_b, &total_b);
      sizing = store::size_gpu_cache(*store, tables, free_b, total_b);
    } else {
      DLREC_CHECK(!store->gpu_cache, "'", dir,
                  "': embedding_store.gpu_cache is for GPU instances (KIND_GPU, --device cuda); "
                  "this one runs on ",
                  device.str());
    }
    impl_->staged = std::make_unique<detail::StagedTables>(
        store::EmbeddingStore::open(*store, tables), impl_->layout, store->staging_rows);
    if (device.is_cuda()) {
      impl_->gpu_cache =
          std::make_unique<store::GpuCache>(impl_->staged->store(), *store, std::move(sizing));
      impl_->build_gpu(store->staging_rows);
    } else {
      impl_->build(impl_->staged->staging_layout());
    }
  } else {
    impl_->build(impl_->layout);
  }
}

void Predictor::set_kernel_policy(const std::string& policy) {
  impl_->policy = nn::kernel_choice::parse_policy(policy, "kernel policy");
  impl_->model->set_kernel_policy(impl_->policy);
}

std::vector<std::string> Predictor::kernel_report() { return impl_->model->kernel_report(); }

std::vector<std::string> Predictor::serving_breakdown(const io::Batch& batch, int reps) {
#ifdef DLREC_WITH_CUDA
  auto* cm = dynamic_cast<model::CudaModel*>(impl_->model.get());
  if (cm && !impl_->gpu_cache) return cm->serving_breakdown(batch, reps);
#endif
  (void)batch;
  (void)reps;
  return {};
}

store::EmbeddingStore* Predictor::store() {
  return impl_->staged ? &impl_->staged->store() : nullptr;
}

store::GpuCache* Predictor::gpu_cache() { return impl_->gpu_cache.get(); }

std::string Predictor::memory_plan() {
  auto mib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
    return std::string(buf);
  };
  int64_t in_model = 0;
  for (const auto& [name, t] : impl_->model->parameters()) in_model += t.nbytes();
  std::string out;
  if (!impl_->staged) {
    const int64_t codes = impl_->quantized_bytes;  // tables served from row-wise codes
    out += "all in memory: parameters " + mib(in_model) +
           (codes ? " + row-wise quantized tables " + mib(codes) : "") + " (no embedding store)\n";
    return out;
  }
  detail::StagedTables& st = *impl_->staged;
  int64_t tables = 0;
  for (const store::TableInfo& t : st.store().tables()) tables += t.rows * t.row_bytes();
  out += "tables: " + std::to_string(st.store().tables().size()) + " in the store, " + mib(tables) +
         " (all in memory they would take this much)\n";
  int64_t total = in_model;
  if (impl_->gpu_cache) {  // the stored tables are the cache plus staging rows, on the device
    const store::GpuCache& c = *impl_->gpu_cache;
    const int64_t S = c.staging_rows();
    int64_t staging = 0;
    for (const store::TableInfo& t : st.store().tables()) staging += S * t.row_bytes();
    const int64_t cache = c.sizing().cache_bytes;
    int64_t rows = 0;
    for (int64_t r : c.sizing().cache_rows) rows += r;
    out += "model: " + mib(in_model - cache - staging) + " dense parameters on " +
           impl_->device.str() + "\n";
    char frac[32];
    std::snprintf(frac, sizeof frac, "%.4g", c.sizing().fraction);
    out += "tier gpu: " + mib(cache) + " on " + impl_->device.str() + " (" + std::to_string(rows) +
           " rows over " + std::to_string(c.sizing().features.size()) + " features, " + frac +
           " of each table; " + c.sizing().how + ") + " + mib(staging) + " staging (" +
           std::to_string(S) + " rows per feature; grows to a batch's misses of one feature)\n";
    total = 0;  // the device's bytes are not host memory
  } else {
    out += "model: " + mib(in_model - st.staging_bytes()) + " dense parameters + " +
           mib(st.staging_bytes()) + " staging (" + std::to_string(st.capacity()) +
           " rows per table; grows to a batch's distinct ids of one feature)\n";
  }
  for (const auto& tier : st.store().tiers()) {
    out += "tier " + tier->name() + ": at most " + mib(tier->memory_bound()) + " in memory";
    if (tier->disk_bytes() > 0) out += ", " + mib(tier->disk_bytes()) + " on disk";
    out += "\n";
    total += tier->memory_bound();
  }
  out += "total in memory: at most " + mib(total) + "\n";
  return out;
}

Predictor::~Predictor() = default;
const etl::Workflow& Predictor::workflow() const { return *impl_->wf; }
const model::RunConfig& Predictor::config() const { return impl_->cfg; }

Device Predictor::device() const { return impl_->model->device(); }

namespace {
// A score that is not a number is refused, never printed or served (finite weights can still
// overflow to infinity in the dense layers, and sigmoid(NaN) is NaN).
// (Raw rows only: the server's batches mix requests, and it answers per request.)
void check_scores(const std::vector<float>& p, int64_t first_line) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < p.size(); ++i)
    if (!std::isfinite(p[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  if (bad > 0)
    fail("the model scored ", bad, " of ", p.size(), " rows as NaN or infinity (first: row ",
         first + 1, " of those from line ", first_line,
         "); its weights or inputs are out of range");
}
}  // namespace

std::vector<float> Predictor::predict(const io::Batch& batch) {
  // train.loss "mse": the output is the prediction itself. The CUDA serving path applies the
  // sigmoid in its kernels, so such a model takes the plain forward.
  const bool regression = impl_->cfg.train.loss == "mse";
#ifdef DLREC_WITH_CUDA
  auto* cm = regression ? nullptr : dynamic_cast<model::CudaModel*>(impl_->model.get());
  if (cm) {
    std::vector<float> p(static_cast<size_t>(batch.rows));
    if (!impl_->gpu_cache) {
      cm->predict(batch, p.data());
      return p;
    }
    // Through the GPU cache; a batch needing more staging rows than the model has rebuilds it
    // with room for them (at least twice as many), and the cache starts over.
    store::GpuCache& cache = *impl_->gpu_cache;
    auto forward = [&](const io::Batch& b) {
      dynamic_cast<model::CudaModel&>(*impl_->model).predict(b, p.data());
    };
    for (int64_t need = cache.run(batch, forward); need > 0; need = cache.run(batch, forward))
      impl_->build_gpu(std::max(need, 2 * cache.staging_rows()));
    return p;
  }
#endif
  const io::Batch* run = &batch;
  if (impl_->staged) {  // the batch's rows from the store into the model's staged tables
    detail::StagedTables& st = *impl_->staged;
    const int64_t need = st.prepare(batch);
    if (need > st.capacity()) {  // a larger batch than before: rebuild with room for it
      const int64_t before = st.capacity();
      st.set_capacity(std::max(need, 2 * before));
      try {
        impl_->build(st.staging_layout());
      } catch (...) {
        st.set_capacity(before);  // the model of `before` rows still serves
        throw;
      }
    }
    run = &st.fill();
  }
  std::vector<float> p = impl_->model->forward(*run, false).to_vector<float>();
  if (!regression)
    for (float& v : p) v = 1.f / (1.f + std::exp(-v));
  return p;
}

std::vector<float> Predictor::predict(const io::RawChunk& raw) {
  io::Batch batch;
  impl_->wf->transform(raw, batch);
  std::vector<float> p = predict(batch);
  check_scores(p, raw.first_line);
  return p;
}

std::vector<float> Predictor::predict_lines(const std::vector<std::string>& lines,
                                            const std::string& source, int64_t batch_rows) {
  const io::Schema& schema = impl_->wf->schema();
  size_t first = 0;
  std::string header;
  if (schema.header) {
    DLREC_CHECK(!lines.empty(), source, ": empty input (a header line is expected)");
    header = lines[0];
    first = 1;
  }
  std::vector<int> mapping = io::field_mapping(schema, header, source);
  std::vector<float> out;
  io::RawChunk chunk;
  for (size_t i = first; i < lines.size();) {
    chunk.reset(schema.num_dense(), schema.num_cat());
    chunk.first_line = static_cast<int64_t>(i) + 1;
    for (; i < lines.size() && chunk.rows < batch_rows; ++i) {
      std::string_view l = lines[i];
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      if (l.empty()) continue;
      io::parse_line(l.data(), l.data() + l.size(), schema, mapping, chunk,
                     source + ":" + std::to_string(i + 1));
    }
    if (chunk.rows == 0) continue;
    std::vector<float> p = predict(chunk);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

}  // namespace dlrec::train
