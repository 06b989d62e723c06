// Fuzz target: every JSON document dlrec reads, through dlrec::parse_json (depth and value
// limits) and then each typed reader in turn, on the document and on each of its top-level
// members (model.json carries "config" and "layout", run.json "config", a checkpoint's
// metadata "config" and "layout"):
//   model::RunConfig (configs/*.json, model graphs included), etl::Workflow::from_config (ETL
//   pipelines, for the Criteo schema) and Workflow::from_json (fitted workflow.json; a workflow
//   that loads also transforms a few rows, whose ids must fall inside its output layout),
//   io::Schema, io::DatasetInfo (dataset.json), io::ShardLayout, io::DatagenConfig and
//   serve::ModelConfig (a served model's config.json).
// Input: the JSON text.
#include <cmath>
#include <string_view>

#include "dlrec/core/config.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/schema.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/model.h"
#ifdef DLREC_FUZZ_SERVE_CONFIG
#include "dlrec/serve/model_config.h"
#endif
#include "fuzz_util.h"

namespace {

using namespace dlrec;
constexpr const char* kTarget = "json";

// A few rows for a fitted workflow's schema: present, missing and repeated values.
io::RawChunk sample_rows(const io::Schema& s) {
  io::RawChunk c;
  const int nd = s.num_dense(), nc = s.num_cat();
  c.reset(nd, nc);
  c.rows = 3;
  c.first_line = 1;
  c.label = {0.f, 1.f, 0.f};
  const float dense[3] = {1.5f, std::nanf(""), -7.f};
  for (int r = 0; r < 3; ++r)
    for (int d = 0; d < nd; ++d) c.dense.push_back(dense[(r + d) % 3]);
  const std::vector<bool> multi = s.cat_multi_hot();
  for (int k = 0; k < nc; ++k) {
    auto& off = c.cat_offsets[k];
    auto& val = c.cat_values[k];
    off.assign(1, 0);
    for (int r = 0; r < 3; ++r) {
      if (r != 1) val.push_back(0x1234u * (k + 1) + r);
      if (r == 2 && multi[k]) val.push_back(7);
      off.push_back(static_cast<int64_t>(val.size()));
    }
  }
  return c;
}

// What a transform promises its consumers (the shard writer and the models index with it).
void check_batch(const io::Batch& b, const io::ShardLayout& layout) {
  if (b.num_dense != layout.num_dense || b.num_cat() != static_cast<int>(layout.cardinalities.size()))
    fuzz::finding(kTarget, "transform output does not match the workflow's output layout");
  if (b.dense.size() != static_cast<size_t>(b.rows * b.num_dense))
    fuzz::finding(kTarget, "transform output: dense size does not match the rows");
  for (float v : b.dense)
    if (!std::isfinite(v)) fuzz::finding(kTarget, "transform output: a dense value is not finite");
  for (int t = 0; t < b.num_cat(); ++t) {
    const auto& off = b.cat_offsets[t];
    const auto& ids = b.cat_indices[t];
    if (off.size() != static_cast<size_t>(b.rows) + 1 || off.front() != 0 ||
        off.back() != static_cast<int64_t>(ids.size()))
      fuzz::finding(kTarget, "transform output: CSR offsets do not match the ids");
    for (int64_t id : ids)
      if (id < 0 || id >= layout.cardinalities[t])
        fuzz::finding(kTarget, "transform output: an id outside its feature's cardinality");
  }
}

void fitted_workflow(const json& j) {
  fuzz::guarded(kTarget, [&] {
    etl::Workflow wf = etl::Workflow::from_json(j);
    if (!wf.fitted()) return;
    const io::ShardLayout layout = wf.output_layout();
    io::Batch b;
    wf.transform(sample_rows(wf.schema()), b);
    check_batch(b, layout);
  });
}

void typed_readers(const json& j) {
  fuzz::guarded(kTarget, [&] { model::RunConfig::from_json(j); });
  fuzz::guarded(kTarget, [&] { etl::Workflow::from_config(j, io::Schema::criteo()); });
  fitted_workflow(j);
  fuzz::guarded(kTarget, [&] { io::Schema::from_json(j); });
  fuzz::guarded(kTarget, [&] { io::DatasetInfo::from_json(j); });
  fuzz::guarded(kTarget, [&] { io::ShardLayout::from_json(j); });
  fuzz::guarded(kTarget, [&] { io::DatagenConfig::from_json(j); });
#ifdef DLREC_FUZZ_SERVE_CONFIG
  fuzz::guarded(kTarget, [&] { serve::ModelConfig::from_json(j, serve::BatchingConfig{}); });
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  json j;
  if (!fuzz::guarded(kTarget, [&] { j = parse_json(text, "fuzz input"); })) return 0;
  typed_readers(j);
  if (j.is_object())
    for (const auto& [key, value] : j.items()) typed_readers(value);
  return 0;
}
