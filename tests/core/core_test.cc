#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <thread>

#include "dlrec/core/config.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/ops.h"
#include "dlrec/core/tensor.h"
#include "dlrec/core/thread_pool.h"

using namespace dlrec;

namespace {
std::string temp_path(const std::string& name) {
  std::string dir = testing::TempDir() + "dlrec_core_" + std::to_string(::getpid());
  make_dirs(dir);
  return dir + "/" + name;
}
}  // namespace

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 7}) {
    set_num_threads(threads);
    std::vector<std::atomic<int>> hits(10007);
    parallel_for(0, 10007, 100, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) hits[i]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  set_num_threads(0);
}

TEST(ThreadPool, RethrowsFirstError) {
  set_num_threads(4);
  EXPECT_THROW(parallel_for(0, 1000, 1,
                            [&](int64_t lo, int64_t) {
                              if (lo > 500) fail("boom at ", lo);
                            }),
               Error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  parallel_for(0, 100, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
  set_num_threads(0);
}

TEST(ThreadPool, NestedCallsRunSerially) {
  set_num_threads(3);
  std::atomic<int> n{0};
  parallel_for(0, 6, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      parallel_for(0, 10, 1, [&](int64_t a, int64_t b) { n += static_cast<int>(b - a); });
  });
  EXPECT_EQ(n.load(), 60);
  set_num_threads(0);
}

TEST(Config, UnknownKeyNamesKeyAndSuggestion) {
  json j = json::parse(R"({"model": {"embedding_dim": 4, "lerning_rate": 0.1}})");
  ConfigReader root(j, "");
  ConfigReader m = root.child("model");
  EXPECT_EQ(m.get<int64_t>("embedding_dim", 1), 4);
  (void)m.get<double>("learning_rate", 0.5);
  try {
    m.finish();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("model.lerning_rate"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'learning_rate'"), std::string::npos) << msg;
  }
}

TEST(Config, RangeTypeAndChoiceErrors) {
  json j = json::parse(R"({"lr": -1, "dim": "x", "kind": "dto"})");
  ConfigReader r(j, "opt");
  EXPECT_THROW(r.get_range("lr", 0.1, 0, 10), Error);
  EXPECT_THROW(r.get<int64_t>("dim", 1), Error);
  try {
    r.get_choice("kind", "dot", {"dot", "cat"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'dot'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.require<int>("missing"), Error);
}

TEST(Json, DepthAndValueLimitsAreErrorsNotCrashes) {
  // 100,000 nested arrays overflowed the stack of every JSON reader before parse_json.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    parse_json(deep, "'deep.json'");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'deep.json' is refused: nesting deeper than 64"),
              std::string::npos) << e.what();
  }
  const std::string objs = [] {
    std::string s;
    for (int i = 0; i < 10000; ++i) s += "{\"a\":";
    s += "1";
    for (int i = 0; i < 10000; ++i) s += "}";
    return s;
  }();
  EXPECT_THROW(parse_json(objs, "body"), Error);
  // 64 levels pass, 65 do not.
  EXPECT_NO_THROW(parse_json(std::string(64, '[') + std::string(64, ']'), "x"));
  EXPECT_THROW(parse_json(std::string(65, '[') + std::string(65, ']'), "x"), Error);
  JsonLimits small;
  small.max_values = 3;
  EXPECT_NO_THROW(parse_json("[1,2]", "x", small));
  EXPECT_THROW(parse_json("[1,2,3]", "x", small), Error);
  // Syntax errors and invalid UTF-8 name the document.
  try {
    parse_json("{\"a\": \"\xff\"}", "request body");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request body is not valid JSON"), std::string::npos);
  }
  // Text from outside with invalid UTF-8 serialises without throwing.
  json j = {{"error", std::string("bad path /\xff")}};
  EXPECT_NE(dump_json_safe(j).find("bad path"), std::string::npos);
}

TEST(Config, HugeFloatForAnIntegerIsAnErrorNotUndefinedBehaviour) {
  // Found by fuzz_shard in CI: a shard header's "cardinalities": [5e300] reached nlohmann's
  // float-to-integer cast (undefined behaviour) through ConfigReader::require<vector<int64_t>>.
  json j = json::parse(R"({"a": 5e300, "b": [1, 5e300], "c": [3.0, 4], "d": 2.5, "e": -1e19})");
  ConfigReader r(j, "x");
  EXPECT_THROW(r.get<int64_t>("a", 0), Error);
  EXPECT_THROW(r.get<std::vector<int64_t>>("b", {}), Error);
  EXPECT_EQ(r.get<std::vector<int64_t>>("c", {}), (std::vector<int64_t>{3, 4}));
  EXPECT_THROW(r.get<int>("d", 0), Error);
  EXPECT_THROW(r.get<uint64_t>("e", 0), Error);
  EXPECT_NEAR(r.get<double>("a", 0), 5e300, 1e285);
}

TEST(Files, AtomicWriteCommitsOrLeavesNothing) {
  std::string p = temp_path("atomic.txt");
  std::remove(p.c_str());
  {
    AtomicFile f(p);
    f.write("partial");
    // destroyed without commit: as if the process died
  }
  EXPECT_FALSE(file_exists(p));
  write_file_atomic(p, "hello");
  EXPECT_EQ(read_file(p), "hello");
  write_file_atomic(p, "world!");
  EXPECT_EQ(read_file(p), "world!");
}

TEST(Files, Crc32cKnownValues) {
  // Standard check value of CRC-32C for "123456789".
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // Incremental equals one-shot.
  std::string s(1000, 'a');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7);
  EXPECT_EQ(crc32c(s.data() + 13, s.size() - 13, crc32c(s.data(), 13)), crc32c(s.data(), s.size()));
}

TEST(Tensor, BasicsAndErrors) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dim(-1), 3);
  Tensor c = t.clone();
  c.data<float>()[0] = 9;
  EXPECT_EQ(t.data<float>()[0], 1);
  EXPECT_THROW(t.data<int32_t>(), Error);
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_EQ(t.reshape({3, 2}).dim(0), 3);
  Tensor z = Tensor::zeros({5}, DType::I64);
  for (auto v : z.to_vector<int64_t>()) EXPECT_EQ(v, 0);
  EXPECT_THROW(Device::parse("tpu"), Error);
  EXPECT_EQ(Device::parse("cuda:2").index, 2);
}

TEST(Device, CudaRequestWithoutGpuIsAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    Tensor::empty({4}, DType::F32, Device::cuda(0));
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_TRUE(msg.find("CUDA") != std::string::npos || msg.find("cuda") != std::string::npos)
        << msg;
  }
}

// CPU/GPU parity of the scaffold kernels (runs the GPU part only when a GPU is present).
TEST(Parity, AxpyAndSumMatchCpu) {
  std::vector<float> x(100003), y(100003);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.37f * i);
    y[i] = std::cos(0.11f * i);
  }
  Tensor xc = Tensor::from_vector(x, {int64_t(x.size())});
  Tensor yc = Tensor::from_vector(y, {int64_t(y.size())});
  ops::axpy(0.5f, xc, yc);
  for (size_t i = 0; i < y.size(); i += 997) EXPECT_FLOAT_EQ(yc.data<float>()[i], y[i] + 0.5f * x[i]);
  double s = ops::sum(yc);
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: CUDA parity not run";
  Tensor xg = Tensor::from_vector(x, {int64_t(x.size())}, Device::cuda(0));
  Tensor yg = Tensor::from_vector(y, {int64_t(y.size())}, Device::cuda(0));
  ops::axpy(0.5f, xg, yg);
  auto back = yg.to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) ASSERT_FLOAT_EQ(back[i], yc.data<float>()[i]) << i;
  EXPECT_NEAR(ops::sum(yg), s, 1e-6 * std::abs(s) + 1e-6);
}

namespace dlrec {
namespace {
// The thread count is the program's choice (set_num_threads, the CLI's --threads), not the
// environment's: DLREC_THREADS, once read here, no longer changes it.
TEST(ThreadPool, DefaultIsTheHardwareAndTheEnvironmentDoesNotChangeIt) {
  setenv("DLREC_THREADS", "3", 1);
  set_num_threads(0);
  const int n = num_threads();
  unsetenv("DLREC_THREADS");
  EXPECT_EQ(n, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  set_num_threads(5);
  EXPECT_EQ(num_threads(), 5);
  set_num_threads(0);
}
}  // namespace
}  // namespace dlrec
