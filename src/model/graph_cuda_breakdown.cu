// GraphCuda::serving_breakdown (graph_cuda_impl.h): where one chunk of predict() spends its
// time (`dlrec bench infer --breakdown`; docs/COMPRESSION.md, bench/RESULTS.md).
#include <algorithm>
#include <cstdio>
#include <map>

#include "dlrec/core/progress.h"
#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {
namespace {

std::string fmt(const char* f, double a, double b = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

}  // namespace

// One chunk (the rows predict() packs and launches at once: min(B, infer_chunk), rounded up to
// its power-of-two bucket) measured `reps` times, means per chunk:
//  - host pack: infer_pack (multi-hot: multihot_pack) on this thread and the packing team
//    (host clock);
//  - copy in: the inputs' host-to-device copy (events on the main stream);
//  - per layer and per dense layer of an mlp/cross (its kernel at this batch size: the
//    compressed kernel chosen, or dense), the serving forward run eagerly on the main stream
//    alone (the embedding lookup not beside the dense layers), events between them: a dense
//    layer's time includes its quantize kernel; then the sigmoid and the copy out;
//  - graph: the captured inference graph of the bucket (what predict() launches: the
//    embedding beside the bottom MLP), events around its launch; absent when predict() has not
//    captured this bucket (call predict() with the batch first).
// Nothing here changes what predict() computes or chooses.
std::vector<std::string> GraphCuda::serving_breakdown(const io::Batch& batch, int reps) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(reps >= 1, "serving breakdown: reps must be >= 1, got ", reps);
  materialize_tables();
  check_batch(batch);
  const int64_t B = batch.rows;
  if (B == 0) return {};
  attach_qat();
  DLREC_CHECK(graphs_ && !profile_ && !qat_on_,
              "serving breakdown: this model serves eagerly (QAT layers, cuda_graphs off or "
              "DLREC_PROFILE=1), not through the bucketed graphs it measures");
  if (hashed_cuda::HashedTables* hashed = emb_ ? emb_->hashed() : nullptr)
    hashed->prepare(batch, false, /*own_slot=*/false);
  const int64_t chunk = std::min(B, opts_.infer_chunk);
  int64_t R = 1;
  while (R < chunk) R *= 2;
  ensure_capacity(R, R * T_);
  if (exposed_) {
    DLREC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    exposed_ = false;
  }
  if (shadows_stale_) refresh_shadows();
  for (auto& n : nodes_) {  // names for the dense layers' labels
    std::vector<std::pair<std::string, Lin*>> v;
    n->compressible(v);
    for (auto& [name, l] : v) l->name = name.substr(0, name.rfind(".weight"));
  }
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  const int64_t n = chunk;
  InferBucket* bkp = &infer_bucket(R, 0);
  std::vector<int64_t> start;  // several ids per row somewhere: each table's first id's place
  if (!infer_pack(batch, 0, n, *bkp)) {
    start = multihot_starts(batch, 0, n);
    bkp = &multihot_bucket_for(R, start[T_], 0);
  }
  InferBucket& bk = *bkp;
  auto pack = [&] {
    if (start.empty()) infer_pack(batch, 0, n, bk);
    else multihot_pack(batch, 0, n, start, bk, nullptr);  // the copy timed on its own below
  };
  pack();
  const size_t in_bytes = bucket_copy_bytes(bk);  // what predict() copies in

  // The labelled events of one eager run, on the main stream.
  std::vector<gpu::Event> ev;
  std::vector<std::string> label;
  auto mark_at = [&](const std::string& what) {
    if (label.size() == ev.size()) ev.emplace_back(dev_index_, /*timing=*/true);
    DLREC_CUDA_CHECK(cudaEventRecord(ev[label.size()], e_.st));
    label.push_back(what);
  };
  std::vector<std::pair<std::string, double>> sums;  // label -> ms summed over reps
  double pack_s = 0;
  const bool overlap = overlap_;
  overlap_ = false;
  e_.mark = mark_at;
  e_.mark_lins = true;
  auto restore = [&] {
    overlap_ = overlap;
    e_.mark = nullptr;
    e_.mark_lins = false;
  };
  try {
    for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up (first-use choices, plans)
      Timer t;
      pack();
      if (rep >= 0) pack_s += t.seconds();
      label.clear();
      mark_at("start");
      DLREC_CUDA_CHECK(
          cudaMemcpyAsync(bk.d_in.raw(), bk.in.get(), in_bytes, cudaMemcpyHostToDevice, e_.st));
      mark_at("copy in");
      infer_body(bk);
      mark_at("sigmoid, copy out");
      DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
      if (rep < 0) continue;
      for (size_t i = 1; i < label.size(); ++i) {
        float ms = 0;
        DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i - 1], ev[i]));
        auto it = std::find_if(sums.begin(), sums.end(),
                               [&](const auto& p) { return p.first == label[i]; });
        if (it == sums.end())
          sums.emplace_back(label[i], ms);
        else
          it->second += ms;
      }
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  // The captured graph, as predict() launches it (inputs already on the device).
  double graph_ms = -1;
  if (bk.graph) {
    gpu::Event a(dev_index_, true), b(dev_index_, true);
    graph_ms = 0;
    for (int rep = -1; rep < reps; ++rep) {
      DLREC_CUDA_CHECK(cudaEventRecord(a, e_.st));
      DLREC_CUDA_CHECK(cudaGraphLaunch(bk.graph.get(), e_.st));
      DLREC_CUDA_CHECK(cudaEventRecord(b, e_.st));
      DLREC_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (rep >= 0) graph_ms += ms;
    }
    graph_ms /= reps;
  }
  std::vector<std::string> out;
  const int64_t chunks = (B + chunk - 1) / chunk;
  double dev_ms = 0;
  for (auto& [l, ms] : sums)
    if (l != "copy in") dev_ms += ms / reps;
  out.push_back("B=" + std::to_string(B) + ": " + std::to_string(chunks) + " chunk(s) of " +
                std::to_string(chunk) + " rows (bucket " + std::to_string(R) +
                (bk.id_cap ? ", multi-hot: " + std::to_string(bk.nnz) + " ids, room for " +
                                 std::to_string(bk.id_cap)
                           : std::string()) +
                "), ms per chunk, " + std::to_string(reps) + " reps");
  // predict()'s own test for the fused small-batch kernel (graph_cuda_infer.cu), once planned.
  if (!bk.id_cap && chunks == 1 && chunk <= opts_.infer_fused_rows && e_.lowp && fused_ == Fused::On &&
      (compressed_.empty() || kernel_policy_ != nn::kernel_choice::Policy::Compressed))
    out.push_back(
        "  (predict() serves this batch size with the fused small-batch kernel, timed end to "
        "end above; the layer rows below are the bucketed path's)");
  out.push_back(fmt("  host pack                      %8.4f", 1e3 * pack_s / reps));
  for (auto& [l, ms] : sums) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "  %-30s %8.4f  %5.1f%%", l.c_str(), ms / reps,
                  l == "copy in" ? 0.0 : 100.0 * ms / reps / std::max(dev_ms, 1e-9));
    out.push_back(buf);
  }
  out.push_back(fmt("  device, eager (sum, no copy in) %8.4f", dev_ms));
  if (graph_ms >= 0)
    out.push_back(fmt("  device, captured graph          %8.4f", graph_ms));
  else
    out.push_back("  device, captured graph          n/a (not captured for this bucket)");
  return out;
}

}  // namespace dlrec::model::graph_cuda_impl
