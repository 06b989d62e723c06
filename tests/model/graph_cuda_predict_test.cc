// predict() of the CUDA graph engine (every model: DCNv2, DLRM as a graph, DeepFM, Wide&Deep):
// the bucketed inference graphs with host packing give the probabilities of the eager forward
// for batch sizes across buckets (1, 3, 64, 300) and in chunks (9000 rows: two chunks through
// the two alternating buckets), in fp32, bf16 and fp16; they follow the parameters after
// training steps (graphs captured before); multi-hot batches run eagerly with the same
// results; bad ids are clear errors and leave the model usable.
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
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/model/model.h"
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
  check(37, 12, true);     // multi-hot: eager
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
#endif

}  // namespace
}  // namespace dlrec::model
