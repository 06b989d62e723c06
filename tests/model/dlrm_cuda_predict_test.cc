// arch "dlrm" on CUDA, the serving side: predict() against forward() at every batch size and
// precision, the small-batch and fused small-batch paths against the GEMM path, instances
// predicting concurrently, chunked predict. Without a GPU (or built without CUDA) every test
// skips visibly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/model/model.h"
#include "model/dlrm_cuda_common.h"
#include "model/test_batches.h"

namespace dlrec::model {
namespace {

using namespace dlrm_cuda_test;  // SmallDlrm, make_batch, make_dlrm_cuda, fused_rows

#define SKIP_WITHOUT_GPU()                                                                 \
  do {                                                                                     \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU predict not run"; \
  } while (0)

#ifdef DLREC_WITH_CUDA
// Serving path: one-hot batches of any size (graph buckets, padded rows, chunks of 8192 rows
// through two alternating buckets) and multi-hot batches (eager) give sigmoid(forward logits);
// a bad id is an error and the next call still works.
TEST(DlrmCuda, PredictMatchesForward) {
  SKIP_WITHOUT_GPU();
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SmallDlrm s;
    auto m = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 13, precision);
    for (int64_t rows : {1, 3, 64, 100, 1, 64, 257, 20000, 9000}) {  // > 8192: chunked
      for (bool multi : {false, true}) {
        io::Batch b = make_batch(s.layout, rows, 50 + rows, multi);
        std::vector<float> p(rows, -1.f);
        m->predict(b, p.data());
        auto z = m->forward(b, false).to_vector<float>();
        for (int64_t i = 0; i < rows; ++i)
          ASSERT_NEAR(p[i], 1.f / (1.f + std::exp(-z[i])), 2e-3)
              << precision << " rows " << rows << " multi " << multi << " row " << i;
        if (multi) continue;
        // The producer's one-id-per-row promise skips reading the offsets: same result.
        b.one_id_per_row = true;
        std::vector<float> q(rows, -1.f);
        m->predict(b, q.data());
        ASSERT_EQ(p, q) << precision << " rows " << rows;
      }
    }
    {  // A false promise with too few ids is an error, not a read past the ids.
      io::Batch lie = make_batch(s.layout, 300, 7, false);
      lie.one_id_per_row = true;
      lie.cat_indices[1].resize(299);
      std::vector<float> p(300);
      EXPECT_THROW(m->predict(lie, p.data()), Error);
    }
    io::Batch bad = make_batch(s.layout, 8, 1, false);
    bad.cat_indices[2][3] = 100;  // = the cardinality
    std::vector<float> p(8);
    EXPECT_THROW(m->predict(bad, p.data()), Error);
    for (int64_t id : {int64_t{-1}, std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max()}) {
      io::Batch neg = make_batch(s.layout, 8, 1, false);
      neg.cat_indices[1][7] = id;
      EXPECT_THROW(m->predict(neg, p.data()), Error) << id;
    }
    // Fewer rows in the same bucket: the failed call's rows are padding now and must be valid.
    io::Batch ok = make_batch(s.layout, 5, 1, false);
    p.assign(5, -1.f);
    m->predict(ok, p.data());
    for (float v : p) EXPECT_TRUE(v > 0.f && v < 1.f);
  }
}
#endif

#ifdef DLREC_WITH_CUDA
// 16-bit inference of 1..8 rows runs the warp-per-output layer kernel (cd::skinny_linear)
// instead of cuBLASLt: the same rows inside a 64-row batch (cuBLASLt) give the same
// probabilities up to 16-bit rounding of the layer outputs.
TEST(DlrmCuda, SmallBatchInferenceMatchesTheGemmPath) {
  SKIP_WITHOUT_GPU();
  for (const char* precision : {"bf16", "fp16"}) {
    SmallDlrm s;
    // The layer-by-layer graph (the fused kernel: the test below).
    auto m = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 21, precision, fused_rows(0));
    io::Batch big = make_batch(s.layout, 64, 77, false);
    std::vector<float> want(64, -1.f);
    m->predict(big, want.data());
    for (int64_t rows : {1, 2, 3, 5, 8}) {
      io::Batch small;
      small.reset(big.num_dense, big.num_cat());
      small.append_rows(big, 10, 10 + rows);
      std::vector<float> got(rows, -1.f);
      m->predict(small, got.data());
      auto z = m->forward(small, false).to_vector<float>();  // eager: the same kernel
      for (int64_t i = 0; i < rows; ++i) {
        ASSERT_NEAR(got[i], want[10 + i], 4e-3) << precision << " rows " << rows << " row " << i;
        ASSERT_NEAR(got[i], 1.f / (1.f + std::exp(-z[i])), 1e-6) << precision << " row " << i;
      }
    }
  }
}
#endif

#ifdef DLREC_WITH_CUDA
}  // namespace
// The fused small-batch kernel's launch counter (src/model/infer_small_cuda.h, an internal
// header): tests check that the path they mean to test ran.
namespace fused_infer {
int64_t launches();
}  // namespace fused_infer
namespace {

// 16-bit predict() of 1..infer_fused_rows rows runs the whole forward as one kernel
// (model/infer_small_cuda.h). Against the layer-by-layer graph of the same weights (skinny
// layers up to 8 rows, cuBLASLt above) and against the rows inside a 64-row cuBLASLt batch:
// equal up to 16-bit rounding (the interaction's dot products are summed in another order).
// Also: the boundary where the path switches, a grid of 2 blocks (every stage loops over its
// work), one-layer MLPs, a model shape the
// kernel does not take (falls back, same answers), and bad ids.
TEST(DlrmCuda, FusedSmallBatchInferenceMatchesTheLayerPath) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t dim;
    std::vector<int64_t> bottom, top;
    bool fused;  // the kernel takes this shape
  };
  const std::vector<Shape> shapes = {
      {8, {16, 8}, {16, 1}, true},
      {32, {64, 32}, {1024, 512, 1}, true},  // a 1024-wide input: the whole register row
      {8, {8}, {1}, true},                    // one bottom and one top layer
      {8, {16, 8}, {1032, 1}, false},        // a 1032-wide input: over the kernel's limit
  };
  for (const Shape& sh : shapes)
    for (const char* precision : {"bf16", "fp16"}) {
      SCOPED_TRACE(std::string(precision) + " dim " + std::to_string(sh.dim) + " top0 " +
                   std::to_string(sh.top[0]));
      SmallDlrm s;
      s.mc.embedding_dim = sh.dim;
      s.mc.bottom_mlp = sh.bottom;
      s.mc.top_mlp = sh.top;
      std::unique_ptr<CudaModel> off, on, wide;
      off = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 21, precision, fused_rows(0));
      on = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 21, precision);  // <= 8 rows
      DlrmCudaOptions wide_options = fused_rows(16);
      wide_options.infer_fused_blocks = 2;  // every stage loops over its work
      wide = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 21, precision, wide_options);
      io::Batch big = make_batch(s.layout, 64, 77, false);
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
            const int64_t limit = m == wide.get() ? 16 : 8;
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
        EXPECT_THROW(on->predict(bad, got.data()), Error) << bad_id;
        EXPECT_EQ(fused_infer::launches(), before);
      }
      on->predict(three, got.data());
      EXPECT_EQ(got, want);
    }
}
#endif

#ifdef DLREC_WITH_CUDA
// Serving runs several model instances in one process: while one captures its CUDA graphs,
// others copy on the legacy stream (Tensor copies). Every call succeeds with the same
// probabilities as a lone call.
TEST(DlrmCuda, InstancesPredictConcurrentlyWithLegacyCopies) {
  SKIP_WITHOUT_GPU();
  // Layer-by-layer graphs, then the fused small-batch kernel (two instances' grid barriers
  // in flight at once).
  for (int64_t fused : {0, 8}) {
    SCOPED_TRACE("infer_fused_rows " + std::to_string(fused));
    const DlrmCudaOptions o = fused_rows(fused);
    SmallDlrm s;
    std::vector<std::unique_ptr<CudaModel>> models;
    for (int i = 0; i < 2; ++i)
      models.push_back(make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 31, "bf16", o));
    auto ref = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 31, "bf16", o);
    const std::vector<int64_t> sizes = {1, 2, 5, 9, 17, 33, 65, 129, 300, 513, 1000, 2100};
    std::vector<std::vector<float>> want;
    std::vector<io::Batch> batches;
    for (int64_t rows : sizes) {
      batches.push_back(make_batch(s.layout, rows, 900 + rows, false));
      want.emplace_back(rows);
      ref->predict(batches.back(), want.back().data());
    }
    std::atomic<bool> stop{false};
    std::atomic<int> errors{0};
    std::thread copier([&] {
      std::vector<float> v(4096, 1.f);
      while (!stop) {
        Tensor t = Tensor::from_vector(v, {4096}, Device::cuda(0));
        if (t.to_vector<float>()[7] != 1.f) ++errors;
      }
    });
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w)
      workers.emplace_back([&, w] {
        try {
          for (int rep = 0; rep < 3; ++rep)
            for (size_t i = 0; i < sizes.size(); ++i) {
              const size_t k = (i * 5 + w * 3) % sizes.size();
              std::vector<float> p(sizes[k]);
              models[w]->predict(batches[k], p.data());
              for (int64_t r = 0; r < sizes[k]; ++r)
                if (std::fabs(p[r] - want[k][r]) > 1e-3f) ++errors;
            }
        } catch (const std::exception& e) {
          ADD_FAILURE() << "worker " << w << ": " << e.what();
        }
      });
    for (auto& t : workers) t.join();
    stop = true;
    copier.join();
    EXPECT_EQ(errors.load(), 0);
  }
}
#endif

#ifdef DLREC_WITH_CUDA
// predict() in chunks (DlrmCudaOptions::infer_chunk) packed on one thread or on a team
// (infer_pack_threads) gives the probabilities of one eager forward, row for row.
TEST(DlrmCuda, ChunkedPredictMatchesForwardWhateverTheChunkAndThreads) {
  SKIP_WITHOUT_GPU();
  SmallDlrm s;
  io::Batch b = make_batch(s.layout, 5000, 123, false);  // 25000 ids: the team packs them
  auto ref = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 41);
  const std::vector<float> z = ref->forward(b, false).to_vector<float>();
  for (int64_t chunk : {256, 4096, 8192})
    for (int threads : {1, 3}) {
      DlrmCudaOptions o;
      o.infer_chunk = chunk;
      o.infer_pack_threads = threads;
      auto m = make_dlrm_cuda(s.mc, s.oc, s.layout, Device::cuda(0), 41, "fp32", o);
      std::vector<float> p(b.rows, -1.f);
      m->predict(b, p.data());
      for (int64_t i = 0; i < b.rows; ++i)
        ASSERT_NEAR(p[i], 1.f / (1.f + std::exp(-z[i])), 1e-5)
            << "chunk " << chunk << " threads " << threads << " row " << i;
    }
}
#endif

#ifndef DLREC_WITH_CUDA
TEST(DlrmCudaPredict, SkippedWithoutCuda) {
  GTEST_SKIP() << "built without CUDA: GPU predict not run";
}
#endif

}  // namespace
}  // namespace dlrec::model
