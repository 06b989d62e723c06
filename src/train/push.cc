// dlrec push: diffs two weight files' tables and publishes the changed rows (include/dlrec/train/
// push.h).
#include "dlrec/train/push.h"

#include "dlrec/core/error.h"
#include "dlrec/io/shard.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/model/model.h"
#include "export_store.h"

namespace dlrec::train {

std::vector<store::TableInfo> model_store_tables(const std::string& model_dir) {
  const json meta = read_json_file(model_dir + "/model.json");
  DLREC_CHECK(meta.value("format", "") == "dlrec-model", "'", model_dir,
              "/model.json' is not a dlrec model (format field)");
  return detail::find_store_tables(model::RunConfig::from_json(meta.at("config")),
                                   io::ShardLayout::from_json(meta.at("layout")));
}

namespace {
// The tables' tensors read from `path` ([rows, dim] f32 each, named as the model names them).
std::vector<Tensor> load_tables(const std::vector<store::TableInfo>& tables,
                                const std::string& path) {
  std::vector<Tensor> out;
  std::vector<io::NamedTensor> targets;
  for (const store::TableInfo& t : tables) {
    out.push_back(Tensor::empty({t.rows, t.dim}, DType::F32));
    targets.emplace_back(t.name, out.back());
  }
  io::TensorLoadOptions o;
  o.allow_extra = true;  // the dense parameters, a checkpoint's optimizer state
  o.require_finite = true;
  io::load_tensors(path, targets, o);
  return out;
}
}  // namespace

PushResult push_update(const std::vector<store::TableInfo>& tables, const std::string& base,
                       const std::string& next, const store::StreamAddress& at, int64_t chunk_rows,
                       uint64_t version) {
  DLREC_CHECK(!tables.empty(), "push: the model has no fixed embedding tables");
  const std::vector<Tensor> a = load_tables(tables, base);
  const std::vector<Tensor> b = load_tables(tables, next);
  std::vector<const float*> pa, pb;
  for (size_t t = 0; t < tables.size(); ++t) {
    pa.push_back(a[t].data<float>());
    pb.push_back(b[t].data<float>());
  }
  const std::vector<store::RowUpdate> updates = store::diff_tables(tables, pa, pb);
  PushResult r;
  for (const auto& u : updates) r.rows += static_cast<int64_t>(u.ids.size());
  if (r.rows == 0) return r;
  r.version = store::publish_update(at, tables, updates, chunk_rows, version);
  return r;
}

}  // namespace dlrec::train
