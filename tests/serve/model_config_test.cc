#include <gtest/gtest.h>

#include "dlrec/serve/model_config.h"
#include "dlrec/serve/request_error.h"

using namespace dlrec;
using namespace dlrec::serve;

TEST(VersionPolicy, LatestAllSpecific) {
  VersionPolicy p;
  EXPECT_EQ(p.select({3, 1, 2}), (std::vector<int64_t>{3}));
  p.num_versions = 2;
  EXPECT_EQ(p.select({3, 1, 2}), (std::vector<int64_t>{2, 3}));
  p.num_versions = 10;
  EXPECT_EQ(p.select({3, 1}), (std::vector<int64_t>{1, 3}));
  p.kind = VersionPolicy::Kind::All;
  EXPECT_EQ(p.select({5, 1, 2}), (std::vector<int64_t>{1, 2, 5}));
  p.kind = VersionPolicy::Kind::Specific;
  p.versions = {2, 7};
  EXPECT_EQ(p.select({5, 1, 2}), (std::vector<int64_t>{2}));
  EXPECT_TRUE(p.select({}).empty());
}

TEST(ModelConfig, ParsesTritonStyleKeys) {
  BatchingConfig d;
  ModelConfig c = ModelConfig::from_json(
      json::parse(R"({"version_policy": {"specific": {"versions": [1, 3]}},
                      "max_batch_size": 512,
                      "dynamic_batching": {"preferred_batch_size": [64, 256],
                                           "max_queue_delay_microseconds": 50,
                                           "max_queue_size": 8}})"),
      d);
  EXPECT_EQ(c.version_policy.kind, VersionPolicy::Kind::Specific);
  EXPECT_EQ(c.version_policy.versions, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.batching.max_batch_size, 512);
  EXPECT_EQ(c.batching.preferred_rows(), 256);
  EXPECT_EQ(c.batching.max_queue_delay_us, 50);
  EXPECT_EQ(c.batching.max_queue_size, 8);
  c = ModelConfig::from_json(json::parse(R"({"version_policy": {"latest": {"num_versions": 2}}})"), d);
  EXPECT_EQ(c.version_policy.kind, VersionPolicy::Kind::Latest);
  EXPECT_EQ(c.version_policy.num_versions, 2);
  EXPECT_EQ(c.batching.max_batch_size, d.max_batch_size);
  c = ModelConfig::from_json(json::parse(R"({"version_policy": {"all": {}}})"), d);
  EXPECT_EQ(c.version_policy.kind, VersionPolicy::Kind::All);
}

TEST(ModelConfig, RejectsBadConfigs) {
  BatchingConfig d;
  auto bad = [&](const char* s) {
    EXPECT_THROW(ModelConfig::from_json(json::parse(s), d), Error) << s;
  };
  bad(R"({"max_batch_sise": 4})");                                   // typo
  bad(R"({"version_policy": {"latest": {}, "all": {}}})");          // two policies
  bad(R"({"version_policy": {}})");                                  // none
  bad(R"({"version_policy": {"specific": {"versions": []}}})");
  bad(R"({"version_policy": {"specific": {"versions": [0]}}})");
  bad(R"({"max_batch_size": 0})");
  bad(R"({"dynamic_batching": {"max_queue_size": 0}})");
  bad(R"([1, 2])");
  try {
    ModelConfig::from_json(json::parse(R"({"max_batch_sise": 4})"), d);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_batch_size"), std::string::npos) << e.what();
  }
}

TEST(ModelName, Validation) {
  for (const char* ok : {"m", "dlrm-1", "a.b", "A_b.c-9"}) EXPECT_EQ(model_name_problem(ok), "") << ok;
  for (const char* no : {"", ".", "..", "a/b", "../x", "a\\b", "a\nb"})
    EXPECT_NE(model_name_problem(no), "") << no;
  EXPECT_NE(model_name_problem(std::string(300, 'a')), "");
  try {
    check_model_name("..");
    FAIL();
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_EQ(http_status(e.status()), 400);
  }
}

TEST(ModelConfig, InstanceGroupAndPrecision) {
  BatchingConfig d;
  ModelConfig c = ModelConfig::from_json(
      json::parse(R"({"instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}],
                      "precision": "bf16"})"),
      d);
  EXPECT_TRUE(c.instances.gpu);
  EXPECT_EQ(c.instances.count, 2);
  EXPECT_EQ(c.instances.gpus, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(c.instances.precision, "bf16");
  ModelConfig g = ModelConfig::from_json(json::parse(R"({"instance_group": [{"kind": "KIND_GPU"}]})"), d);
  EXPECT_EQ(g.instances.gpus, (std::vector<int64_t>{0}));  // default device
  ModelConfig cpu = ModelConfig::from_json(json::parse(R"({"instance_group": [{"count": 3}]})"), d);
  EXPECT_FALSE(cpu.instances.gpu);
  EXPECT_EQ(cpu.instances.count, 3);
  ModelConfig none = ModelConfig::from_json(json::parse("{}"), d);
  EXPECT_FALSE(none.instances.gpu);
  EXPECT_EQ(none.instances.count, 1);
  EXPECT_EQ(none.instances.precision, "fp32");
  for (const char* bad : {
           R"({"instance_group": []})",
           R"({"instance_group": [{"kind": "KIND_GPU"}, {"kind": "KIND_CPU"}]})",
           R"({"instance_group": [{"kind": "KIND_TPU"}]})",
           R"({"instance_group": [{"count": 0}]})",
           R"({"instance_group": [{"gpus": [0]}]})",
           R"({"instance_group": [{"kind": "KIND_GPU", "gpus": [-1]}]})",
           R"({"instance_group": [{"kind": "KIND_GPU", "cuont": 2}]})",
           R"({"precision": "bf16"})",
           R"({"instance_group": [{"kind": "KIND_GPU"}], "precision": "fp8"})"}) {
    EXPECT_THROW(ModelConfig::from_json(json::parse(bad), d), Error) << bad;
  }
}
