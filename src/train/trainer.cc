#include "dlrec/train/trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "dlrec/compress/sparsity.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/dist/planner.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/train/export.h"
#include "dlrec/train/tensorboard.h"
#include "dlrec/nn/loss.h"
#include "train/data_parallel.h"

namespace dlrec::train {

namespace {
std::vector<std::string> under(const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> r;
  for (const auto& n : names) r.push_back(dir + "/" + n);
  return r;
}
float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
}  // namespace

EvalResult evaluate_shards(model::Model& model, const std::vector<std::string>& shards,
                           int64_t batch_size, std::vector<float>* probs_out) {
  Timer timer;
  EvalResult r;
  DLREC_CHECK(!shards.empty(), "evaluation: no shards to evaluate");
  io::ShardLoader loader(shards, batch_size);
  DLREC_CHECK(loader.total_rows() > 0, "evaluation: the ", shards.size(),
              " validation shard(s) hold no rows: nothing to evaluate");
  const bool regression = model.loss() == nn::LossKind::Mse;
#ifdef DLREC_WITH_CUDA
  if (model.device().is_cuda() && !probs_out && !regression) {
    // On the GPU: logits and labels gathered in device memory, metrics computed there.
    const int64_t total = loader.total_rows();
    const Device dev = model.device();
    Tensor logits = Tensor::empty({std::max<int64_t>(total, 1)}, DType::F32, dev);
    Tensor labels = Tensor::empty({std::max<int64_t>(total, 1)}, DType::F32, dev);
    io::Batch batch;
    int64_t at = 0;
    while (loader.next(batch)) {
      DLREC_CHECK(at + batch.rows <= total, "evaluation: the shards hold more rows than counted");
      Tensor z = model.forward(batch, false);
      copy_bytes(logits.data<float>() + at, dev, z.raw(), dev, sizeof(float) * batch.rows);
      copy_bytes(labels.data<float>() + at, dev, batch.labels.data(), Device::cpu(),
                 sizeof(float) * batch.rows);
      at += batch.rows;
    }
    const DeviceMetrics dm =
        metrics_from_logits_cuda(logits.data<float>(), labels.data<float>(), at, dev.index);
    r.rows = at;
    r.auc = dm.auc;
    r.logloss = at ? dm.logloss : 0;
    r.positive_rate = at ? dm.positives / at : 0;
    r.seconds = timer.seconds();
    return r;
  }
#endif
  std::vector<float> probs, labels;
  probs.reserve(loader.total_rows());
  labels.reserve(loader.total_rows());
  io::Batch batch;
  while (loader.next(batch)) {
    std::vector<float> logits = model.forward(batch, false).to_vector<float>();
    for (float l : logits) probs.push_back(regression ? l : sigmoid(l));
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  r.rows = static_cast<int64_t>(probs.size());
  if (regression) {  // the outputs are the predictions: RMSE/MAE, no AUC
    const RegressionMetrics rm = regression_metrics(probs, labels);
    r.regression = true;
    r.rmse = rm.rmse;
    r.mae = rm.mae;
    r.label_mean = rm.label_mean;
    r.auc = r.logloss = r.positive_rate = std::nan("");
    r.seconds = timer.seconds();
    if (probs_out) *probs_out = std::move(probs);
    return r;
  }
  r.auc = roc_auc(probs, labels);
  r.logloss = log_loss(probs, labels);
  double pos = 0;
  for (float l : labels) pos += l;
  r.positive_rate = r.rows ? pos / r.rows : 0;
  r.seconds = timer.seconds();
  if (probs_out) *probs_out = std::move(probs);
  return r;
}

std::string run_data_dir(const std::string& run_dir, const json& run) {
  namespace fs = std::filesystem;
  const std::string where = "'" + run_dir + "/run.json'";
  if (!run.is_object() || !run.contains("data_dir") || !run.at("data_dir").is_string())
    fail(where, ": no data_dir string");
  const fs::path stored = run.at("data_dir").get<std::string>();
  if (stored.empty()) fail(where, ": empty data_dir");
  if (stored.is_absolute()) return stored.string();
  // An older run.json: relative to where training ran, which is not recorded.
  fs::path run_abs = fs::absolute(run_dir).lexically_normal();
  if (!run_abs.has_filename()) run_abs = run_abs.parent_path();  // "run/" -> "run"
  const fs::path beside_run = run_abs.parent_path() / stored;
  for (const fs::path& p : {stored, beside_run})
    if (file_exists((p / "dataset.json").string())) return p.string();
  fail(where, " (written by an older dlrec) holds the data directory '", stored.string(),
       "' relative to where training ran; it has no dataset.json from here nor beside the run ('",
       beside_run.string(), "'): run from that directory, give the data directory (--data "
       "where the command has it), or set data_dir in run.json to an absolute path");
}

RunInfo load_run_info(const std::string& run_dir) {
  const std::string path = run_dir + "/run.json";
  RunInfo r;
  r.run = read_json_file(path);
  if (!r.run.is_object() || !r.run.contains("config")) fail("'", path, "': no config");
  try {
    r.config = model::RunConfig::from_json(r.run.at("config"));
  } catch (const Error& e) {
    fail("'", path, "': ", e.what());
  }
  return r;
}

void save_checkpoint(const std::string& path, model::Model& model, const model::RunConfig& config,
                     const io::ShardLayout& layout, const CheckpointState& state) {
  auto tensors = model.parameters();
  for (auto& t : model.optimizer_state()) tensors.push_back(t);
  for (auto& t : model.masks()) tensors.push_back(t);
  json qat;  // QAT input ranges (docs/COMPRESSION.md)
  for (auto& t : compress::qat_tensors(model, qat)) tensors.push_back(t);
  json meta = {{"kind", "checkpoint"},
               {"step", state.step},
               {"position", state.position},
               {"config", config.to_json()},
               {"layout", layout.to_json()}};
  if (!model.masks().empty()) meta["masks"] = compress::mask_names(model);
  if (!qat.is_null()) meta["qat"] = qat;
  io::save_tensors(path, tensors, meta);
}

CheckpointState load_checkpoint(const std::string& path, model::Model& model,
                                bool allow_extra_tensors) {
  // Pruning masks (docs/COMPRESSION.md): named in the meta; a checkpoint without them loads
  // as before.
  const json file_meta = io::read_tensor_meta(path);
  compress::prepare_masks(file_meta, path, model);
  const std::vector<model::NamedTensor> qat = compress::prepare_qat(file_meta, path, model);
  auto tensors = model.parameters();
  for (auto& t : model.optimizer_state()) tensors.push_back(t);
  for (auto& t : model.masks()) tensors.push_back(t);
  tensors.insert(tensors.end(), qat.begin(), qat.end());
  io::TensorLoadOptions lo;
  lo.allow_extra = allow_extra_tensors;
  json meta = io::load_tensors(path, tensors, lo);
  compress::apply_loaded_masks(path, model);
  compress::apply_loaded_qat(qat, path, model);
  DLREC_CHECK(meta.value("kind", "") == "checkpoint", "'", path, "' is not a checkpoint");
  CheckpointState s;
  for (const char* key : {"step", "position"}) {
    const bool count = meta.contains(key) && meta.at(key).is_number_integer() &&
                       meta.at(key).get<int64_t>() >= 0;
    if (!count)
      fail("checkpoint '", path, "': meta key '", key, "' is missing or not a count (",
           meta.contains(key) ? dump_json_safe(meta.at(key)).substr(0, 40) : "absent", ")");
  }
  s.step = meta.at("step").get<int64_t>();
  s.position = meta.at("position").get<int64_t>();
  if (meta.contains("layout")) {
    try {
      s.layout = io::ShardLayout::from_json(meta.at("layout"));
    } catch (const Error& e) {
      fail("checkpoint '", path, "': meta: ", e.what());
    }
  }
  return s;
}

void check_checkpoint_layout(const std::string& path, const CheckpointState& st,
                             const io::ShardLayout& data_layout, const std::string& data_dir) {
  if (st.layout && !(*st.layout == data_layout))
    fail("checkpoint '", path, "' was trained on the data layout ", st.layout->to_json().dump(),
         "; the dataset '", data_dir, "' has ", data_layout.to_json().dump());
}

struct Trainer::Impl {
  model::RunConfig cfg;
  TrainerOptions opt;
  io::DatasetInfo data;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<compress::Pruner> pruner;  // the "compress.sparsity" section; null without
  // compress.distill: the dense teacher (a Predictor on the student's device) and the loss's
  // alpha and temperature.
  std::unique_ptr<Predictor> teacher;
  compress::DistillConfig distill;
  CheckpointState state;
  // TensorBoard event file in the run directory (rank 0 only); null without a run directory.
  std::unique_ptr<EventFileWriter> events;
  // Data-parallel (opt.comm with more than one rank).
  int rank = 0, ranks = 1;
  std::unique_ptr<dist::Communicator> gpu_comm;  // NCCL, for a model on a GPU (before reducer)
  std::unique_ptr<DataParallelReducer> reducer;
  bool sharded = false;  // the embedding tables are sharded over the ranks (cfg.sharding)
  // The same on GPUs (table-wise): each GPU holds its tables only; gather streams the others
  // to rank 0's host for a checkpoint.
  bool device_sharded = false;
  // Inside a training step: the QAT records' range collectives run (data-parallel on the CPU).
  bool in_step = false;
  // A checkpoint of the whole model: a sharded model gathers its tables first (every rank).
  void checkpoint() {
    if (sharded || device_sharded) model->gather_sharded_tables();
    if (leader()) save_checkpoint(checkpoint_path(), *model, cfg, data.layout, state);
    if (sharded || device_sharded) model->release_sharded_tables();
  }

  std::string checkpoint_path() const { return opt.run_dir + "/checkpoint.dlrec"; }
  bool parallel() const { return ranks > 1; }
  bool leader() const { return rank == 0; }
  // One data-parallel step on this rank's `batch` of the global batch of `global_rows` rows;
  // returns this rank's share of the global batch's mean loss (the sum over the ranks is it).
  double parallel_step(const io::Batch& batch, int64_t global_rows, double lr_scale);
  // The backward and update of this rank's dlogits (`rows` rows, of its mean loss `local`) as
  // its share of the global batch of `global_rows` (the step is of the global batch's mean
  // loss); returns the rank's share of that loss.
  double update_as_share(Tensor& dlogits, double local, int64_t rows, int64_t global_rows,
                         double lr_scale);
  // One step with the distillation loss (compress.distill) against the teacher's logits: in
  // the engine's step where it can (Model::distills_in_step), else the loss on the host
  // (data-parallel: this rank's share of the global batch of `global_rows`, as parallel_step).
  double distill_step(const io::Batch& batch, int64_t global_rows, double lr_scale,
                      bool want_loss);
  // The mean loss of a logging window: this process's sum over `n` steps (of shares, summed
  // over the ranks when data-parallel).
  double window_loss(double sum, int64_t n) const {
    return (parallel() ? opt.comm->all_reduce_value(sum) : sum) / n;
  }
  EvalResult evaluate_parallel();
  void log_metrics(const json& line) const {
    if (!leader() || opt.metrics_log.empty()) return;
    FILE* f = std::fopen(opt.metrics_log.c_str(), "a");
    DLREC_CHECK(f, "cannot append to the metrics log '", opt.metrics_log, "'");
    std::fprintf(f, "%s\n", line.dump().c_str());
    std::fclose(f);
  }
};

double Trainer::Impl::distill_step(const io::Batch& batch, int64_t global_rows, double lr_scale,
                                   bool want_loss) {
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows, "train_step: the batch has ",
              batch.labels.size(), " labels for ", batch.rows, " rows");
  // The teacher's logits from its probabilities, clamped to (1e-7, 1 - 1e-7): +-16.1 at most.
  std::vector<float> t = teacher->predict(batch);
  for (float& p : t) {
    const double q = std::min(1.0 - 1e-7, std::max(1e-7, static_cast<double>(p)));
    p = static_cast<float>(std::log(q / (1.0 - q)));
  }
  if (model->distills_in_step() && !parallel())
    return model->train_step_distill(batch, t.data(), distill.alpha, distill.temperature,
                                     lr_scale, want_loss);
  Tensor logits = model->forward(batch, true).to(Device::cpu());
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  const double loss =
      compress::distill_loss(logits.data<float>(), batch.labels.data(), t.data(), batch.rows,
                             distill.alpha, distill.temperature, dlogits.data<float>());
  if (!parallel()) {
    model->backward_and_update(dlogits, lr_scale);
    return loss;
  }
  return update_as_share(dlogits, loss, batch.rows, global_rows, lr_scale);
}

double Trainer::Impl::update_as_share(Tensor& dlogits, double local, int64_t rows,
                                      int64_t global_rows, double lr_scale) {
  const float share = static_cast<float>(rows) / static_cast<float>(global_rows);
  float* d = dlogits.data<float>();
  for (int64_t i = 0; i < rows; ++i) d[i] *= share;
  if (model->device().is_cuda()) dlogits = dlogits.to(model->device());
  model->backward_and_update(dlogits, lr_scale);
  return local * rows / global_rows;
}

double Trainer::Impl::parallel_step(const io::Batch& batch, int64_t global_rows,
                                    double lr_scale) {
  Tensor logits = model->forward(batch, true).to(Device::cpu());
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows, "train_step: the batch has ",
              batch.labels.size(), " labels for ", batch.rows, " rows");
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  const double local = nn::loss_and_grad(model->loss(), logits.data<float>(), batch.labels.data(),
                                         batch.rows, dlogits.data<float>());
  return update_as_share(dlogits, local, batch.rows, global_rows, lr_scale);
}

EvalResult Trainer::Impl::evaluate_parallel() {
  Timer timer;
  const int64_t bs = cfg.train.eval_batch_size;
  const int64_t total = data.valid_rows;
  io::ShardLoader loader(under(opt.data_dir, data.valid_shards), bs, 0, rank, ranks);
  std::vector<float> probs, labels;
  io::Batch batch;
  while (loader.next(batch)) {
    // A sharded model's forward is a collective: every rank runs it, with rows or without.
    if (batch.rows == 0 && !sharded && !device_sharded) continue;
    std::vector<float> logits = model->forward(batch, false).to_vector<float>();
    const bool regression = model->loss() == nn::LossKind::Mse;
    for (float l : logits) probs.push_back(regression ? l : sigmoid(l));
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  // Every rank's scores, then back into row order (rank r holds piece r of each global batch).
  const std::vector<int64_t> counts = opt.comm->all_gather_counts(probs.size());
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  DLREC_CHECK(n == total, "evaluation across ranks: the ranks scored ", n, " rows of ", total);
  std::vector<float> all_probs(n), all_labels(n);
  opt.comm->all_gather_v(probs.data(), all_probs.data(), counts, dist::Elem::F32);
  opt.comm->all_gather_v(labels.data(), all_labels.data(), counts, dist::Elem::F32);
  std::vector<float> ordered_probs(n), ordered_labels(n);
  int64_t from = 0;
  for (int r = 0; r < ranks; ++r)
    for (int64_t g = 0; g < total; g += bs * ranks) {
      const RowPiece p = batch_piece(std::min(bs * ranks, total - g), bs, r, ranks);
      for (int64_t i = p.begin; i < p.end; ++i, ++from) {
        ordered_probs[g + i] = all_probs[from];
        ordered_labels[g + i] = all_labels[from];
      }
    }
  EvalResult res;
  res.rows = n;
  if (model->loss() == nn::LossKind::Mse) {  // the outputs are the predictions
    const RegressionMetrics rm = regression_metrics(ordered_probs, ordered_labels);
    res.regression = true;
    res.rmse = rm.rmse;
    res.mae = rm.mae;
    res.label_mean = rm.label_mean;
    res.auc = res.logloss = res.positive_rate = std::nan("");
    res.seconds = timer.seconds();
    return res;
  }
  res.auc = roc_auc(ordered_probs, ordered_labels);
  res.logloss = log_loss(ordered_probs, ordered_labels);
  double pos = 0;
  for (float l : ordered_labels) pos += l;
  res.positive_rate = n ? pos / n : 0;
  res.seconds = timer.seconds();
  return res;
}

Trainer::Trainer(model::RunConfig config, TrainerOptions options) : impl_(new Impl) {
  Impl& m = *impl_;
  m.cfg = std::move(config);
  m.opt = std::move(options);
  m.data = io::DatasetInfo::load(m.opt.data_dir);
  m.data.verify(m.opt.data_dir);  // the counts and layout that the epochs and model rely on
  if (m.opt.comm && m.opt.comm->size() > 1) {
    m.rank = m.opt.comm->rank();
    m.ranks = m.opt.comm->size();
    DLREC_CHECK(m.opt.rank < 0, "training one rank's rows (--rank) and a data-parallel job of ",
                m.ranks, " ranks exclude each other");
    // A dataset prepared for ranks (dlrec etl --ranks N) must be prepared for this job's N.
    if (file_exists(m.opt.data_dir + "/ranks.json"))
      io::load_rank_shards(m.opt.data_dir, m.rank, m.ranks);
  }
  if (m.opt.rank >= 0) {  // this rank's part of the training rows only
    io::RankShards part = io::load_rank_shards(m.opt.data_dir, m.opt.rank, m.opt.ranks);
    for (const auto& s : part.shards) {
      io::ShardReader r(m.opt.data_dir + "/" + s);
      DLREC_CHECK(r.layout() == m.data.layout, "'", m.opt.data_dir, "/ranks.json': shard '", s,
                  "' has another layout than dataset.json");
    }
    m.data.train_shards = part.shards;
    m.data.train_rows = part.rows;
  }
  DLREC_CHECK(m.data.train_rows > 0, "dataset '", m.opt.data_dir, "' has no training rows");
  m.model = model::build_model(m.cfg.model, m.cfg.optimizer, m.data.layout,
                               Device::parse(m.cfg.train.device), m.cfg.train.seed,
                               m.cfg.train.precision, m.cfg.train.deterministic);
  // Validated before anything is written (masks on the GPU: one process).
  const compress::CompressConfig compress_cfg = compress::CompressConfig::from_json(m.cfg.compress);
  if (compress_cfg.sparsity.on && m.model->device().is_cuda() && m.parallel())
    fail("compress.sparsity: 2:4 masks train on one GPU in this build (not across processes; "
         "train with --gpus 1 or on the CPU)");
  if (compress_cfg.qat.on && m.model->device().is_cuda() && m.parallel())
    fail("compress.qat: QAT trains on one GPU in this build (not across processes: each rank "
         "would keep its own input ranges; train with --gpus 1 or on the CPU)");
  if (compress_cfg.distill.on) {
    DLREC_CHECK(!m.parallel() || !m.model->device().is_cuda(), "compress.distill: distillation "
                "trains on one GPU in this build (not across GPU processes; train with --gpus 1 "
                "or on the CPU)");
    DLREC_CHECK(m.cfg.train.loss == "bce", "compress.distill: needs train.loss \"bce\", got \"",
                m.cfg.train.loss, "\"");
    m.distill = compress_cfg.distill;
    // The teacher scores each batch where the student trains (fp32 on a GPU); the loss and its
    // gradient are computed in the GPU engine's step, or on the host (distill_step).
    m.teacher = std::make_unique<Predictor>(m.distill.teacher, m.model->device(), "fp32");
    const io::ShardLayout tl = m.teacher->workflow().output_layout();
    if (!(tl == m.data.layout))
      fail("compress.distill.teacher: the model '", m.distill.teacher, "' takes the layout ",
           tl.to_json().dump(), ", but the training data '", m.opt.data_dir, "' has ",
           m.data.layout.to_json().dump(), " (the teacher must be trained on this data's ETL)");
  }
  m.model->set_loss(nn::parse_loss(m.cfg.train.loss));
  if (m.parallel()) {
    // A model on a GPU exchanges inside its step through NCCL over the same ranks.
    if (m.model->device().is_cuda()) {
      dist::CommOptions co;
      co.timeout_seconds = m.opt.comm_timeout_seconds;
      m.gpu_comm = dist::make_nccl_communicator(*m.opt.comm, m.model->device().index, co);
    }
    m.reducer = std::make_unique<DataParallelReducer>(*m.opt.comm, m.gpu_comm.get());
    m.model->set_gradient_reducer(m.reducer.get());
    if (!m.cfg.sharding.is_null()) {
      ConfigReader r(m.cfg.sharding, "sharding");
      dist::PlannerOptions po = dist::read_planner_options(r, m.ranks);
      po.batch_per_rank = m.cfg.train.batch_size;
      // Expected ids per sample of each feature from the ETL's statistics, when present.
      std::vector<double> ids;
      const std::string stats = m.opt.data_dir + "/stats.json";
      if (file_exists(stats) && !m.data.cat_names.empty()) {
        const auto by_name = dist::read_ids_per_sample(stats);
        for (const std::string& name : m.data.cat_names) {
          auto it = by_name.find(name);
          ids.push_back(it == by_name.end() ? 1.0 : it->second);
        }
      }
      // The ids' frequency summaries for hybrid tables: table "<layer>.<f>" has feature f's (the
      // planner looks them up by table name only). The CUDA engine takes them by feature
      // (parameters() would allocate its tables before sharding).
      if (file_exists(stats) && m.model->device().is_cuda()) {
        const auto freq = dist::read_frequency_summaries(stats);
        for (const std::string& name : m.data.cat_names) {
          auto it = freq.find(name);
          po.frequency_by_feature.push_back(it == freq.end() ? dist::FrequencySummary{}
                                                             : it->second);
        }
      } else if (file_exists(stats)) {
        const auto freq = dist::read_frequency_summaries(stats);
        for (const auto& [param, value] : m.model->parameters()) {
          const std::string name =  // "emb.3" (a table may be listed as "emb.3.weight")
              param.size() > 7 && param.compare(param.size() - 7, 7, ".weight") == 0
                  ? param.substr(0, param.size() - 7)
                  : param;
          const size_t dot = name.rfind('.');
          if (dot == std::string::npos || dot + 1 == name.size() ||
              name.find_first_not_of("0123456789", dot + 1) != std::string::npos)
            continue;
          const size_t f = std::stoul(name.substr(dot + 1));
          if (f >= m.data.cat_names.size()) continue;
          auto it = freq.find(m.data.cat_names[f]);
          if (it != freq.end()) po.frequency[name] = it->second;
        }
      }
      m.model->shard_tables(*m.opt.comm, po, ids, m.leader() ? stderr : nullptr);
      // On GPUs each rank holds the tables it owns only; its evaluation forward is a collective
      // (as on the CPU) and a checkpoint streams the tables to rank 0 (gather_sharded_tables).
      (m.model->device().is_cuda() ? m.device_sharded : m.sharded) = true;
    } else if (m.model->device().is_cuda() && m.leader()) {
      std::fprintf(stderr,
                   "[dist] every embedding table is replicated on each GPU (no \"sharding\" "
                   "section); \"sharding\": {} lets the planner place them (faster for large "
                   "tables: docs/DISTRIBUTED.md)\n");
    }
  }
  if (!m.opt.run_dir.empty()) {
    make_dirs(m.opt.run_dir);
    if (m.opt.resume && file_exists(m.checkpoint_path())) {
      // Whole tables to load into: on the CPU every table; on the GPUs each row-wise table
      // (every rank loads it and keeps its range: scatter_sharded_tables).
      if (m.sharded || m.device_sharded) m.model->gather_sharded_tables();
      // GPU shards: each rank loads the tables it owns (the others are in the file for theirs).
      m.state = load_checkpoint(m.checkpoint_path(), *m.model, m.device_sharded);
      if (m.sharded || m.device_sharded) m.model->scatter_sharded_tables();
      check_checkpoint_layout(m.checkpoint_path(), m.state, m.data.layout, m.opt.data_dir);
      if (m.leader())
        std::fprintf(stderr, "[train] resumed from %s at step %lld\n",
                     m.checkpoint_path().c_str(), static_cast<long long>(m.state.step));
    }
    // The data directory absolute, so that eval and export find it from anywhere.
    const std::string data_abs =
        std::filesystem::absolute(m.opt.data_dir).lexically_normal().string();
    if (m.leader())
      write_file_atomic(m.opt.run_dir + "/run.json",
                      json{{"config", m.cfg.to_json()}, {"data_dir", data_abs}}.dump(2));
  }
  m.pruner = compress::make_pruner(m.cfg, *m.model);  // after a checkpoint brought its masks
  // QAT records: the section's (keeping the ranges a checkpoint brought); a run without the
  // section trains fp32 again.
  if (compress_cfg.qat.on) {
    const int64_t n = compress::install_qat(compress_cfg.qat, *m.model);
    if (m.leader())
      std::fprintf(stderr, "[compress] QAT: %lld layers fake-quantized to int8\n",
                   static_cast<long long>(n));
    // Data-parallel on the CPU: every rank keeps the global batch's input ranges.
    if (m.parallel() && !m.model->device().is_cuda()) {
      Impl* im = &m;
      for (const auto& w : m.model->prunable_weights())
        if (auto* q = w.param ? dynamic_cast<compress::QatLinear*>(w.param->quant.get()) : nullptr)
          q->set_range_reducer([im](double v) {
            return im->in_step ? im->opt.comm->all_reduce_value(v, dist::ReduceOp::Max) : v;
          });
    }
  } else {
    for (const auto& w : m.model->prunable_weights())
      if (w.param && dynamic_cast<compress::QatLinear*>(w.param->quant.get()))
        w.param->quant.reset();
  }
}

Trainer::~Trainer() {
  // Never throws: a device that failed (the error already raised to the caller, or unwinding
  // now) reports it again on the reducer's synchronisation.
  try {
    if (impl_ && impl_->model) impl_->model->set_gradient_reducer(nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[train] closing the model: %s\n", e.what());
  }
}
model::Model& Trainer::model() { return *impl_->model; }
int64_t Trainer::step() const { return impl_->state.step; }

EvalResult Trainer::evaluate(std::vector<float>* probs) {
  Impl& m = *impl_;
  DLREC_CHECK(m.data.valid_rows > 0, "dataset '", m.opt.data_dir,
              "' has no validation rows (dataset.json: valid_rows 0): nothing to evaluate");
  if (m.parallel()) {
    DLREC_CHECK(!probs, "evaluation across ranks returns metrics only");
    return m.evaluate_parallel();
  }
  return evaluate_shards(*m.model, under(m.opt.data_dir, m.data.valid_shards),
                         m.cfg.train.eval_batch_size, probs);
}

TrainResult Trainer::train() {
  Impl& m = *impl_;
  const auto& tc = m.cfg.train;
  const int64_t bs = tc.batch_size;
  const int64_t global_bs = bs * m.ranks;  // data-parallel: per-rank batch x ranks
  const int64_t rows = m.data.train_rows;
  const int64_t steps_per_epoch = (rows + global_bs - 1) / global_bs;
  int64_t total_steps = steps_per_epoch * tc.epochs;
  if (tc.max_steps >= 0) total_steps = std::min(total_steps, tc.max_steps);
  auto train_shards = under(m.opt.data_dir, m.data.train_shards);

  TrainResult res;
  std::optional<Progress> progress;  // rank 0 prints for the job
  if (m.leader()) progress.emplace("train", total_steps * global_bs, "samples", 2.0);
  Timer timer;
  if (!m.opt.run_dir.empty() && m.opt.rank <= 0 && m.leader() && !m.events)
    m.events = std::make_unique<EventFileWriter>(m.opt.run_dir);
  // Throughput over each logging window (samples/s in the event file).
  double window_start = 0;
  int64_t window_samples = 0;
  auto log_scalars = [&](double loss) {
    if (!m.events) return;
    const int64_t step = m.state.step;
    const double now = timer.seconds();
    m.events->scalar("train/loss", step, loss);
    if (now > window_start)
      m.events->scalar("train/samples_per_sec", step, window_samples / (now - window_start));
    m.events->scalar("train/learning_rate", step,
                     m.cfg.optimizer.lr * m.cfg.optimizer.schedule.factor(step - 1, total_steps));
    const double scale = m.model->loss_scale();
    if (scale > 0) m.events->scalar("train/loss_scale", step, scale);
    window_start = now;
    window_samples = 0;
  };
  auto log_eval = [&](const EvalResult& e) {
    if (!m.events) return;
    if (e.regression) {
      m.events->scalar("eval/rmse", m.state.step, e.rmse);
      m.events->scalar("eval/mae", m.state.step, e.mae);
      return;
    }
    m.events->scalar("eval/auc", m.state.step, e.auc);
    m.events->scalar("eval/logloss", m.state.step, e.logloss);
  };
  double loss_sum = 0;
  int64_t loss_n = 0;
  io::Batch batch;
  std::unique_ptr<io::ShardLoader> loader;
  int64_t steps_here = 0;
  while (m.state.step < total_steps) {
    if (!loader || !loader->next(batch)) {
      // (Re)open at the current position within the epoch.
      loader = std::make_unique<io::ShardLoader>(train_shards, bs, m.state.position % rows,
                                                 m.rank, m.ranks);
      if (!loader->next(batch)) fail("training shards yielded no rows");
    }
    // The rows of the global batch (every rank knows them without communicating).
    const int64_t global_rows = std::min(global_bs, rows - m.state.position % rows);
    if (global_rows < m.ranks) {
      // A last global batch with fewer rows than ranks leaves a rank without rows: skipped on
      // every rank (docs/DISTRIBUTED.md).
      m.state.position += global_rows;
      loader.reset();
      continue;
    }
    // Read the loss back only where it is logged (and at the end): a model on a GPU then runs
    // the other steps without a host synchronisation. A diverged run is caught there.
    const bool log_now = tc.log_every > 0 && (m.state.step + 1) % tc.log_every == 0;
    const bool want_loss = log_now || m.state.step + 1 == total_steps;
    if (m.pruner) m.pruner->before_step(m.state.step);
    const double lr_scale = m.cfg.optimizer.schedule.factor(m.state.step, total_steps);
    double loss;
    {
      // The QAT records' range collectives (data-parallel on the CPU) run in steps only.
      struct InStep {
        bool& f;
        explicit InStep(bool& x) : f(x) { f = true; }
        ~InStep() { f = false; }
      } in_step(m.in_step);
      loss = m.teacher       ? m.distill_step(batch, global_rows, lr_scale, want_loss)
             : !m.parallel() ? m.model->train_step(batch, lr_scale, want_loss)
             : m.model->trains_parts_on_device()
                 ? m.model->train_step_part(batch, global_rows, lr_scale, want_loss)
                 : m.parallel_step(batch, global_rows, lr_scale);
    }
    if (want_loss || !std::isnan(loss))
      DLREC_CHECK(std::isfinite(loss), "training diverged at step ", m.state.step + 1,
                  ": loss is ", loss, " (lower the learning rate)");
    m.state.step++;
    m.state.position += m.parallel() ? global_rows : batch.rows;
    res.samples += batch.rows;
    window_samples += m.parallel() ? global_rows : batch.rows;
    steps_here++;
    if (!std::isnan(loss)) {
      loss_sum += loss;
      loss_n++;
    }
    if (tc.log_every > 0 && m.state.step % tc.log_every == 0) {
      res.last_loss = loss_n ? m.window_loss(loss_sum, loss_n) : res.last_loss;
      res.logged_losses.emplace_back(m.state.step, res.last_loss);
      m.log_metrics({{"step", m.state.step}, {"loss", res.last_loss}});
      char buf[64];
      std::snprintf(buf, sizeof buf, "step %lld loss %.5f", static_cast<long long>(m.state.step),
                    res.last_loss);
      log_scalars(res.last_loss);
      if (progress) progress->update(m.state.step * global_bs, buf);
      loss_sum = 0;
      loss_n = 0;
    }
    if (tc.eval_every > 0 && m.state.step % tc.eval_every == 0 && m.state.step < total_steps &&
        m.data.valid_rows > 0) {
      EvalResult e = evaluate();
      log_eval(e);
      window_start += e.seconds;  // samples/s counts training time only
      if (m.leader())
        std::fprintf(stderr, "[eval] step %lld %s (%.1fs)\n", static_cast<long long>(m.state.step),
                     format_eval(e).c_str(), e.seconds);
    }
    if ((m.opt.stop_after_steps >= 0 && steps_here >= m.opt.stop_after_steps) ||
        (m.opt.cancel && m.opt.cancel->load(std::memory_order_relaxed))) {
      res.stopped_early = true;
      break;
    }
    if (!m.opt.run_dir.empty() && tc.checkpoint_every > 0 &&
        m.state.step % tc.checkpoint_every == 0)
      m.checkpoint();
  }
  m.model->synchronize();
  res.seconds = timer.seconds();
  res.steps = m.state.step;
  if (loss_n > 0) {
    res.last_loss = loss_sum / loss_n;
    log_scalars(res.last_loss);  // the steps after the last logging point
  }
  if (loss_n > 0) res.last_loss = m.window_loss(loss_sum, loss_n);
  char buf[64];
  std::snprintf(buf, sizeof buf, "step %lld loss %.5f", static_cast<long long>(m.state.step),
                res.last_loss);
  if (progress) progress->finish(buf);
  if (res.stopped_early) return res;
  if (!m.opt.run_dir.empty()) m.checkpoint();
  if (m.data.valid_rows > 0) {
    res.eval = evaluate();
    log_eval(res.eval);
    m.log_metrics({{"step", m.state.step},
                   {"auc", res.eval.auc},
                   {"logloss", res.eval.logloss},
                   {"rows", res.eval.rows}});
  }
  return res;
}

}  // namespace dlrec::train
