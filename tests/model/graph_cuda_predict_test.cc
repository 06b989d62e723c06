// predict() of the CUDA graph engine (every model: DCNv2, DLRM as a graph, DeepFM, Wide&Deep):
// the bucketed inference graphs with host packing give the probabilities of the eager forward
// for batch sizes across buckets (1, 3, 64, 300) and in chunks (9000 rows: two chunks through
// the two alternating buckets), in fp32, bf16 and fp16; they follow the parameters after
// training steps (graphs captured before); multi-hot batches (empty bags too) likewise through
// their own buckets' graphs, whose offsets and ids travel with each chunk (a bucket's graph
// serves any chunk whose ids fit it; 9000 rows: two chunks; a batch whose second chunk holds a
// multi-hot row; a chunk of 332,000 ids, packed and copied in phases); the serving breakdown of
// a multi-hot batch; bad ids are clear errors and
// leave the model usable.
//
// Without a GPU the device tests skip visibly.
#include <gtest/gtest.h>

#include "test_errors.h"

#include "model/graph_cases.h"
#include "model/test_batches.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/gpu_resources.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/model/graph_cuda.h"
#endif

namespace dlrec::model {
namespace {

using namespace testing;  // the graph cases (graph_cases.h) and the batch helpers
using dlrec::testing::expect_error;

#define SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                        \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: graph predict not run"; \
  } while (0)

#ifdef DLREC_WITH_CUDA
RunConfig graph_config(const std::string& layers, const std::string& opt) {
  return RunConfig::from_json(json::parse(R"({"model": {"arch": "graph", "layers": [)" + layers +
                                          R"(]}, "optimizer": )" + opt + "}"));
}

std::vector<float> sigmoid_of(const Tensor& z) {
  std::vector<float> p = z.to_vector<float>();
  for (float& x : p) x = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
  return p;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double w = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    w = std::max(w, std::fabs(static_cast<double>(a[i]) - b[i]));
  return w;
}

// predict() against sigmoid(forward()) of the same model: the bucket pads rows (GEMMs of
// another width may sum in another order), so fp32 agrees to rounding and the 16-bit
// precisions to a rounding step of the logit.
void predict_matches_forward(const char* layers, const char* precision) {
  const io::ShardLayout layout = make_layout(4, {50, 7, 100, 3, 20});
  RunConfig c = graph_config(layers, kAdagrad);
  auto m = build_model(c.model, c.optimizer, layout, Device::cuda(0), 5, precision);
  auto* cm = dynamic_cast<CudaModel*>(m.get());
  ASSERT_NE(cm, nullptr);
  const double tol = std::string(precision) == "fp32" ? 1e-5 : 2e-2;
  auto check = [&](int64_t rows, uint64_t seed, bool multi_hot) {
    io::Batch b = make_batch(layout, rows, seed, multi_hot, 0.0);
    std::vector<float> got(rows, -1.f);
    cm->predict(b, got.data());
    const std::vector<float> want = sigmoid_of(m->forward(b, false));
    EXPECT_LE(max_abs_diff(got, want), tol)
        << layers << " " << precision << " rows " << rows << " multi-hot " << multi_hot;
  };
  for (int64_t rows : {1, 3, 64, 300, 3}) check(rows, 10 + rows, false);
  check(9000, 11, false);  // two chunks
  const int64_t graphs = gpu::live_counts().graphs;
  check(37, 12, true);  // multi-hot: its bucket's graph captured on the first call
  EXPECT_GT(gpu::live_counts().graphs, graphs) << "the multi-hot batch ran eagerly";
  check(40, 17, true);  // the same rows' bucket, other ids (the same capacity or the next)
  check(300, 18, true);
  check(9000, 19, true);  // two chunks through the two parities' buckets
  check(1, 20, true);
  // Training changes the parameters; the captured graphs read them in place.
  for (int i = 0; i < 3; ++i) m->train_step(make_batch(layout, 64, 100 + i, true, 0.3), 1.0, false);
  check(64, 13, false);
  check(300, 14, false);
  // A bad id is a clear error, and the model serves on.
  io::Batch bad = make_batch(layout, 5, 15, false, 0.0);
  bad.cat_indices[2][3] = 100;
  std::vector<float> out(5);
  expect_error([&] { cm->predict(bad, out.data()); }, {"out of range", "100"});
  check(5, 16, false);
  io::Batch bad_multi = make_batch(layout, 9, 21, true, 0.0);
  bad_multi.cat_indices[2][4] = -3;
  std::vector<float> out9(9);
  expect_error([&] { cm->predict(bad_multi, out9.data()); }, {"out of range", "-3"});
  io::Batch decreasing = make_batch(layout, 9, 23, true, 0.0);
  decreasing.cat_offsets[1][4] = decreasing.cat_offsets[1][9] + 1;  // above row 4's end
  expect_error([&] { cm->predict(decreasing, out9.data()); },
               {"categorical feature 1", "offsets decrease"});
  check(37, 22, true);
  // One-hot rows first, a row of two ids in the second chunk: the first chunk goes out through
  // the one-hot bucket, then the whole batch through the multi-hot ones.
  io::Batch late = make_batch(layout, 9000, 24, false, 0.0);
  late.cat_indices[0].push_back(3);
  late.cat_offsets[0].back() += 1;
  std::vector<float> got(9000, -1.f);
  cm->predict(late, got.data());
  EXPECT_LE(max_abs_diff(got, sigmoid_of(m->forward(late, false))), tol)
      << layers << " " << precision << ": a multi-hot row in the second chunk";
  // A chunk of 332,000 ids (40 per row in tables 1 and 3): packed and copied in 4 phases; a bad
  // id in the last phase is a clear error, and the model serves on.
  io::Batch big = make_batch(layout, 4000, 26, false, 0.0);
  for (int t : {1, 3}) {
    nn::Rng rng(40 + t);
    auto& off = big.cat_offsets[t];
    auto& idx = big.cat_indices[t];
    off.clear();
    idx.clear();
    for (int64_t r = 0; r < big.rows; ++r) {
      off.push_back(static_cast<int64_t>(idx.size()));
      for (int j = 0; j < 40; ++j) idx.push_back(rng.below(layout.cardinalities[t]));
    }
    off.push_back(static_cast<int64_t>(idx.size()));
  }
  std::vector<float> pbig(big.rows, -1.f);
  cm->predict(big, pbig.data());
  EXPECT_LE(max_abs_diff(pbig, sigmoid_of(m->forward(big, false))), tol)
      << layers << " " << precision << ": 40 ids per row in two tables";
  big.cat_indices[3].back() = 3;  // table 3 has 3 rows
  expect_error([&] { cm->predict(big, pbig.data()); }, {"out of range", "3"});
  check(37, 27, true);
  // `dlrec bench infer --breakdown` of a multi-hot batch: its bucket's packing, copy, layers
  // and captured graph.
  io::Batch mh = make_batch(layout, 300, 25, true, 0.0);
  std::vector<float> p300(300, -1.f);
  cm->predict(mh, p300.data());  // captures the bucket's graph
  std::string all;
  for (const std::string& l : cm->serving_breakdown(mh, 2)) all += l + "\n";
  for (const char* want : {"B=300: 1 chunk(s) of 300 rows (bucket 512, multi-hot: ", "host pack",
                           "copy in", "sigmoid, copy out", "device, captured graph"})
    EXPECT_NE(all.find(want), std::string::npos) << want << " missing in\n" << all;
  EXPECT_EQ(all.find("n/a (not captured"), std::string::npos) << all;
  EXPECT_EQ(std::count(p300.begin(), p300.end(), -1.f), 0);
  std::vector<float> again(300);
  cm->predict(mh, again.data());  // the breakdown left the bucket as predict() needs it
  EXPECT_EQ(again, p300);
}

TEST(GraphCudaPredict, MatchesForwardInEveryPrecision) {
  SKIP_WITHOUT_GPU();
  for (const char* precision : {"fp32", "bf16", "fp16"})
    for (const char* layers : {kDcnStacked, kDlrm, kDeepFm, kWideDeep}) {
      SCOPED_TRACE(std::string(precision) + " " + layers);
      predict_matches_forward(layers, precision);
    }
}

// With the engine's graphs off (GraphCudaOptions::cuda_graphs), predict runs eagerly: same
// probabilities as with them.
TEST(GraphCudaPredict, EagerOptionGivesTheSameProbabilities) {
  SKIP_WITHOUT_GPU();
  const io::ShardLayout layout = make_layout(4, {50, 7, 100, 3, 20});
  RunConfig c = graph_config(kDcnStacked, kSgd);
  GraphCudaOptions eager;
  eager.cuda_graphs = false;
  auto a = make_graph_cuda(c.model, c.optimizer, layout, Device::cuda(0), 5, "fp32");
  auto b = make_graph_cuda(c.model, c.optimizer, layout, Device::cuda(0), 5, "fp32", eager);
  io::Batch batch = make_batch(layout, 100, 3, false, 0.0);
  std::vector<float> pa(100), pb(100);
  a->predict(batch, pa.data());
  b->predict(batch, pb.data());
  EXPECT_LE(max_abs_diff(pa, pb), 1e-5);
}

}  // namespace
// The fused small-batch kernel's launch counter (src/model/infer_small_cuda.h, an internal
// header): tests check that the path they mean to test ran.
namespace fused_infer {
int64_t launches();
namespace prog {
int64_t rows_limit(int max_k);  // the most rows a program with inputs max_k wide fuses
}  // namespace prog
}  // namespace fused_infer
namespace {

std::string dlrm_layers(int64_t dim, const std::vector<int64_t>& bottom,
                        const std::vector<int64_t>& top) {
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
    return "[" + s + "]";
  };
  return R"({"name": "dense", "type": "dense"},
    {"name": "bottom", "type": "mlp", "input": "dense", "sizes": )" + list(bottom) +
         R"(, "relu_last": true},
    {"name": "emb", "type": "embedding", "dim": )" + std::to_string(dim) + R"(},
    {"name": "inter", "type": "dot", "inputs": ["bottom", "emb"]},
    {"name": "top", "type": "mlp", "input": "inter", "sizes": )" + list(top) + R"(},
    {"name": "logit", "type": "output", "input": "top"})";
}

// Shapes of the program form beyond graph_cases.h: DCNv2 with a full-rank cross network over
// an x0 of 1288 values (weight rows over the 1024 a warp holds in registers: taken in chunks),
// and DeepFM at configs/deepfm.json's embedding width 10 (not a multiple of 8: the rows land
// at odd columns of the concat, which fm reads in place) with three deep layers.
constexpr const char* kDcnWideFullRank = R"(
  {"name": "dense", "type": "dense"},
  {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [16, 8], "relu_last": true},
  {"name": "emb", "type": "embedding", "dim": 256},
  {"name": "x0", "type": "concat", "inputs": ["bottom", "emb"]},
  {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2},
  {"name": "top", "type": "mlp", "input": "cross", "sizes": [64, 1]},
  {"name": "logit", "type": "output", "input": "top"})";
constexpr const char* kDeepFmDim10 = R"(
  {"name": "dense", "type": "dense"},
  {"name": "first_order", "type": "wide", "features": "all"},
  {"name": "emb", "type": "embedding", "dim": 10},
  {"name": "fm", "type": "fm", "inputs": ["emb"]},
  {"name": "deep_in", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [40, 40, 40, 1]},
  {"name": "sum", "type": "add", "inputs": ["first_order", "fm", "deep"]},
  {"name": "logit", "type": "output", "input": "sum"})";

// 16-bit predict() of 1..infer_fused_rows rows of a DLRM-shaped graph runs the whole forward
// as one kernel (model/infer_small_cuda.h), an engine feature; other graphs of the parts the
// program form knows (DCNv2, DeepFM, Wide&Deep) run as one kernel too. Against the layer-by-layer
// graph of the same weights (skinny layers up to 8 rows, cuBLASLt above) and against the rows
// inside a 64-row batch: equal up to 16-bit rounding (the interaction's dot products are summed
// in another order). Also: the boundary where the path switches, a grid of 2 blocks (every
// stage loops over its work), one-layer MLPs, a shape the kernel does not take and a graph of
// another shape (both fall back, same answers), and bad ids.
TEST(GraphCudaPredict, FusedSmallBatchMatchesTheLayerPath) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    std::string layers;
    bool fused;     // the kernel takes this shape
    int max_k = 0;  // the program form's widest Linear input (0: the DLRM kernel)
  };
  const std::vector<Shape> shapes = {
      {dlrm_layers(8, {16, 8}, {16, 1}), true},
      {dlrm_layers(32, {64, 32}, {1024, 512, 1}), true},  // a 1024-wide input: a register row
      {dlrm_layers(8, {8}, {1}), true},                    // one bottom and one top layer
      {dlrm_layers(8, {16, 8}, {1032, 1}), false},        // 1032 wide: over the kernel's limit
      // Not DLRM-shaped: the program form (fused_infer::prog).
      {kDcnStacked, true, 48},
      {kDcnWideFullRank, true, 1288},
      {kDeepFm, true, 48},
      {kDeepFmDim10, true, 56},
      {kWideDeep, true, 48},
      {kDcnParallel, false},  // the cross output goes into a concat: refused, layer path
      {kDeepFmGathered, false},  // fm over two inputs (gathered, not read in place): refused
  };
  const io::ShardLayout layout = make_layout(4, {50, 7, 100, 3, 20});
  for (const Shape& sh : shapes)
    for (const char* precision : {"bf16", "fp16"}) {
      SCOPED_TRACE(std::string(precision) + " " + sh.layers);
      RunConfig c = graph_config(sh.layers, kAdagrad);
      GraphCudaOptions off_o, wide_o;
      off_o.infer_fused_rows = 0;
      wide_o.infer_fused_rows = 16;
      wide_o.infer_fused_blocks = 2;  // every stage loops over its work
      auto off = make_graph_cuda(c.model, c.optimizer, layout, Device::cuda(0), 21, precision,
                                 off_o);
      auto on = make_graph_cuda(c.model, c.optimizer, layout, Device::cuda(0), 21, precision);
      auto wide = make_graph_cuda(c.model, c.optimizer, layout, Device::cuda(0), 21, precision,
                                  wide_o);
      io::Batch big = make_batch(layout, 64, 77, false, 0.0);
      std::vector<float> gemm(64, -1.f);
      off->predict(big, gemm.data());
      for (int rep = 0; rep < 2; ++rep)
        for (int64_t rows : {1, 2, 7, 8, 9, 12, 16, 1}) {
          io::Batch small;
          small.reset(big.num_dense, big.num_cat());
          small.append_rows(big, 10 + rep, 10 + rep + rows);
          std::vector<float> ref(rows, -1.f);
          off->predict(small, ref.data());
          for (CudaModel* m : {on.get(), wide.get()}) {
            const int64_t limit =
                std::min<int64_t>(m == wide.get() ? 16 : 8,
                                  sh.max_k > 0 ? fused_infer::prog::rows_limit(sh.max_k) : 64);
            const int64_t before = fused_infer::launches();
            std::vector<float> got(rows, -1.f);
            m->predict(small, got.data());
            EXPECT_EQ(fused_infer::launches() - before, sh.fused && rows <= limit ? 1 : 0)
                << "rows " << rows << " limit " << limit;
            for (int64_t i = 0; i < rows; ++i) {
              ASSERT_NEAR(got[i], ref[i], 2e-3) << "rows " << rows << " row " << i;
              ASSERT_NEAR(got[i], gemm[10 + rep + i], 4e-3) << "rows " << rows << " row " << i;
            }
          }
        }
      // An id out of range (or negative) is an error before anything is launched; the model
      // serves the next call as before.
      io::Batch three;
      three.reset(big.num_dense, big.num_cat());
      three.append_rows(big, 20, 23);
      std::vector<float> want(3), got(3);
      on->predict(three, want.data());
      for (int64_t bad_id : {int64_t{100}, int64_t{-1}}) {
        io::Batch bad = three;
        bad.cat_indices[2][1] = bad_id;  // table 2 has 100 rows
        const int64_t before = fused_infer::launches();
        expect_error([&] { on->predict(bad, got.data()); }, {"out of range"});
        EXPECT_EQ(fused_infer::launches(), before);
      }
      on->predict(three, got.data());
      EXPECT_EQ(got, want);
      // A training step of 64 rows grows the buffers (the kernel's plan is made again) and
      // changes the weights, which the kernel reads in place.
      on->train_step(make_batch(layout, 64, 101, false, 0.3), 1.0, false);
      off->train_step(make_batch(layout, 64, 101, false, 0.3), 1.0, false);
      std::vector<float> a(3), b(3);
      on->predict(three, a.data());
      off->predict(three, b.data());
      for (int i = 0; i < 3; ++i) EXPECT_NEAR(a[i], b[i], 2e-3);
    }
}

// The fused forward against the CPU reference (f32, the same seed: the same weights): the
// logits within the bound the engine's 16-bit paths keep to the f32 CPU (max difference <= 3 %
// of the largest logit, as DlrmCuda.Bf16WideInteractionMatchesCpu), for the program form's
// shapes and the DLRM kernel's, in bf16 and fp16, after training steps too (the kernel reads
// the updated weights in place; the CPU model takes the same steps). Rows over a program's
// measured limit (prog::rows_limit) take the layer path, held to the same bound.
TEST(GraphCudaPredict, FusedSmallBatchMatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  const io::ShardLayout layout = make_layout(4, {50, 7, 100, 3, 20});
  const std::vector<std::pair<const char*, int>> shapes = {  // layers, widest input (0: DLRM)
      {kDcnStacked, 48}, {kDcnWideFullRank, 1288}, {kDeepFm, 48},
      {kDeepFmDim10, 56}, {kWideDeep, 48},         {kDlrm, 0}};
  for (const auto& shape : shapes)
    for (const char* precision : {"bf16", "fp16"}) {
      const char* layers = shape.first;
      const int max_k = shape.second;
      SCOPED_TRACE(std::string(precision) + " " + layers);
      RunConfig c = graph_config(layers, kSgd);
      auto cpu = build_model(c.model, c.optimizer, layout, Device::cpu(), 31);
      auto gpu = make_graph_cuda(c.model, c.optimizer, layout, Device::cuda(0), 31, precision);
      auto compare = [&](uint64_t seed) {
        // Rows of one 64-row batch: the bound's scale is its largest CPU logit.
        const io::Batch big = make_batch(layout, 64, seed, false, 0.0);
        const std::vector<float> want = cpu->forward(big, false).to_vector<float>();
        double scale = 1e-6;
        for (float z : want) scale = std::max(scale, std::fabs(static_cast<double>(z)));
        for (int64_t rows : {1, 3, 8}) {
          io::Batch b;
          b.reset(big.num_dense, big.num_cat());
          b.append_rows(big, 10, 10 + rows);
          std::vector<float> got(rows, -1.f);
          const int64_t before = fused_infer::launches();
          gpu->predict(b, got.data());
          const bool fused = max_k == 0 || rows <= fused_infer::prog::rows_limit(max_k);
          EXPECT_EQ(fused_infer::launches() - before, fused ? 1 : 0) << "rows " << rows;
          double diff = 0;
          for (int64_t i = 0; i < rows; ++i) {
            const double p = std::clamp(static_cast<double>(got[i]), 1e-12, 1 - 1e-12);
            diff = std::max(diff, std::fabs(std::log(p) - std::log1p(-p) - want[10 + i]));
          }
          EXPECT_LE(diff / scale, 0.03) << "rows " << rows << ": fused logits far from the CPU's"
                                        << " (max difference " << diff << ", scale " << scale
                                        << ")";
        }
      };
      compare(500);
      for (int i = 0; i < 2; ++i) {
        io::Batch b = make_batch(layout, 64, 600 + i, false, 0.3);
        Tensor dl;
        nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
        cpu->backward_and_update(dl, 1.0);
        gpu->train_step(b, 1.0, false);
      }
      compare(700);
    }
}

// The serving options are validated when the model is built.
TEST(GraphCudaPredict, ServingOptionsAreChecked) {
  SKIP_WITHOUT_GPU();
  const io::ShardLayout layout = make_layout(4, {50, 7, 100, 3, 20});
  RunConfig c = graph_config(kDlrm, kSgd);
  auto build = [&](GraphCudaOptions o) {
    make_graph_cuda(c.model, c.optimizer, layout, Device::cuda(0), 5, "bf16", o);
  };
  GraphCudaOptions o;
  o.infer_fused_rows = 65;
  expect_error([&] { build(o); }, {"infer_fused_rows", "65"});
  o = {};
  o.infer_pack_threads = -1;
  expect_error([&] { build(o); }, {"infer_pack_threads", "-1"});
  o = {};
  o.infer_fused_blocks = 70000;
  expect_error([&] { build(o); }, {"infer_fused_blocks", "70000"});
}
#endif

}  // namespace
}  // namespace dlrec::model
