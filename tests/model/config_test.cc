// Strict run-config parsing: defaults, round trips, unknown keys and ranges.
#include <gtest/gtest.h>

#include <string>

#include "dlrec/model/model.h"

namespace dlrec::model {
namespace {

// The message of the Error that parsing `text` throws ("" when it parses).
std::string parse_error(const std::string& text) {
  try {
    RunConfig::from_json(json::parse(text));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, EmptyGivesDefaults) {
  RunConfig c = RunConfig::from_json(json::object());
  EXPECT_EQ(c.model.arch, "dlrm");
  EXPECT_EQ(c.model.embedding_dim, 16);
  EXPECT_EQ(c.model.bottom_mlp, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(c.model.top_mlp, (std::vector<int64_t>{64, 1}));
  EXPECT_EQ(c.optimizer.type, "sgd");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.1);
  EXPECT_EQ(c.train.batch_size, 128);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_FALSE(c.train.deterministic);
  EXPECT_FALSE(c.to_json().at("train").contains("deterministic"));  // older builds read it
}

TEST(RunConfig, SectionsParseAndRoundTrip) {
  RunConfig c = RunConfig::from_json(json::parse(R"({
    "model": {"embedding_dim": 8, "bottom_mlp": [32, 8], "top_mlp": [16, 4, 1],
              "interaction": "cat", "pooling": "mean"},
    "optimizer": {"type": "adagrad", "lr": 0.05, "embedding_lr": 0.1, "adagrad_init": 0.01},
    "train": {"batch_size": 256, "epochs": 3, "max_steps": 10, "seed": 7, "device": "cuda:1",
              "deterministic": true}
  })"));
  EXPECT_TRUE(c.train.deterministic);
  EXPECT_EQ(c.model.embedding_dim, 8);
  EXPECT_EQ(c.model.top_mlp, (std::vector<int64_t>{16, 4, 1}));
  EXPECT_EQ(c.model.interaction, "cat");
  EXPECT_EQ(c.model.pooling, "mean");
  EXPECT_EQ(c.optimizer.type, "adagrad");
  EXPECT_DOUBLE_EQ(c.optimizer.embedding_lr, 0.1);
  EXPECT_DOUBLE_EQ(c.optimizer.adagrad_init, 0.01);
  EXPECT_EQ(c.train.batch_size, 256);
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.train.max_steps, 10);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.train.device, "cuda:1");
  RunConfig d = RunConfig::from_json(c.to_json());
  EXPECT_EQ(d.to_json(), c.to_json());
}

TEST(RunConfig, ShippedConfigsLoad) {
  for (const char* name : {"dlrm_small.json", "dlrm_criteo.json"}) {
    const std::string path = std::string(DLREC_SOURCE_DIR) + "/configs/" + name;
    RunConfig c = RunConfig::load(path);
    EXPECT_EQ(c.model.embedding_dim, 16) << name;
    EXPECT_EQ(c.model.top_mlp.back(), 1) << name;
    EXPECT_EQ(c.model.bottom_mlp.back(), 16) << name;
  }
  RunConfig criteo = RunConfig::load(std::string(DLREC_SOURCE_DIR) + "/configs/dlrm_criteo.json");
  EXPECT_EQ(criteo.model.bottom_mlp, (std::vector<int64_t>{512, 256, 64, 16}));
  EXPECT_EQ(criteo.model.top_mlp, (std::vector<int64_t>{512, 256, 1}));
  EXPECT_EQ(criteo.train.batch_size, 4096);
}

TEST(RunConfig, UnknownKeysNameFullPathAndSuggestion) {
  std::string e = parse_error(R"({"model": {"embeding_dim": 8}})");
  EXPECT_NE(e.find("'model.embeding_dim'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'embedding_dim'"), std::string::npos) << e;

  e = parse_error(R"({"optimizer": {"learning_rate": 0.1}})");
  EXPECT_NE(e.find("'optimizer.learning_rate'"), std::string::npos) << e;

  e = parse_error(R"({"optimiser": {}})");
  EXPECT_NE(e.find("'optimiser'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optimizer'"), std::string::npos) << e;

  e = parse_error(R"({"train": {"batchsize": 64}})");
  EXPECT_NE(e.find("'train.batchsize'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'batch_size'"), std::string::npos) << e;
}

TEST(RunConfig, RangesAndChoicesAreChecked) {
  struct Case {
    const char* json;
    const char* must_mention;
  };
  const Case cases[] = {
      {R"({"model": {"embedding_dim": 0}})", "model.embedding_dim"},
      {R"({"model": {"bottom_mlp": [64, -1]}})", "model.bottom_mlp[1]"},
      {R"({"model": {"bottom_mlp": [64, 1.5]}})", "model.bottom_mlp[1]"},
      {R"({"model": {"bottom_mlp": 64}})", "model.bottom_mlp"},
      {R"({"model": {"top_mlp": [64, 2]}})", "model.top_mlp"},
      {R"({"model": {"top_mlp": []}})", "model.top_mlp"},
      {R"({"model": {"interaction": "dott"}})", "did you mean 'dot'"},
      {R"({"model": {"pooling": "max"}})", "model.pooling"},
      {R"({"model": {"arch": "dcn"}})", "model.arch"},
      {R"({"optimizer": {"lr": 0}})", "optimizer.lr"},
      {R"({"optimizer": {"lr": -0.1}})", "optimizer.lr"},
      {R"({"optimizer": {"lr": "fast"}})", "optimizer.lr"},
      {R"({"optimizer": {"type": "lamb"}})", "optimizer.type"},
      {R"({"train": {"precision": "fp8"}})", "train.precision"},
      {R"({"optimizer": {"adagrad_eps": -1}})", "optimizer.adagrad_eps"},
      {R"({"train": {"batch_size": 0}})", "train.batch_size"},
      {R"({"train": {"epochs": 0}})", "train.epochs"},
      {R"({"train": {"max_steps": 0}})", "train.max_steps"},
      {R"({"train": {"seed": -3}})", "train.seed"},
      {R"({"train": {"device": "tpu"}})", "train.device"},
      {R"({"train": {"deterministic": "yes"}})", "train.deterministic"},
      {R"({"train": {"deterministic": 1}})", "train.deterministic"},
      {R"({"model": []})", "model"},
  };
  for (const auto& c : cases) {
    const std::string e = parse_error(c.json);
    EXPECT_FALSE(e.empty()) << c.json << " was accepted";
    EXPECT_NE(e.find(c.must_mention), std::string::npos) << c.json << " -> " << e;
  }
}

TEST(RunConfig, LoadNamesTheFile) {
  try {
    RunConfig::load("/nonexistent/dlrm.json");
    FAIL() << "loaded a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dlrm.json"), std::string::npos);
  }
}

// fp16 loss scaling (optimizer.loss_scale_init, optimizer.loss_scale_growth_interval): read,
// range-checked, written back; not accepted inside the embedding override.
TEST(RunConfig, LossScaleKeys) {
  const RunConfig d = RunConfig::from_json(json::object());
  EXPECT_EQ(d.optimizer.loss_scale_init, 65536.0);
  EXPECT_EQ(d.optimizer.loss_scale_growth_interval, 2000);
  const RunConfig c = RunConfig::from_json(
      json{{"optimizer", {{"loss_scale_init", 1024}, {"loss_scale_growth_interval", 50}}}});
  EXPECT_EQ(c.optimizer.loss_scale_init, 1024.0);
  EXPECT_EQ(c.optimizer.loss_scale_growth_interval, 50);
  const RunConfig back = RunConfig::from_json(c.to_json());
  EXPECT_EQ(back.optimizer.loss_scale_init, 1024.0);
  EXPECT_EQ(back.optimizer.loss_scale_growth_interval, 50);
  for (const json& bad : {json{{"loss_scale_init", 0.5}}, json{{"loss_scale_init", 1e39}},
                          json{{"loss_scale_init", "big"}},
                          json{{"loss_scale_growth_interval", 0}},
                          json{{"loss_scale_growth_interval", 1.5}},
                          json{{"loss_scale_growth_interval", int64_t{1} << 31}},
                          json{{"embedding", {{"loss_scale_init", 8}}}}}) {
    try {
      RunConfig::from_json(json{{"optimizer", bad}});
      ADD_FAILURE() << bad.dump() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("loss_scale"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dlrec::model

TEST(LrSchedule, WarmupAndPolynomialDecay) {
  dlrec::model::RunConfig c = dlrec::model::RunConfig::from_json(dlrec::json::parse(
      R"({"optimizer": {"lr": 1.0, "schedule": {"warmup_steps": 4, "decay_start_step": 10,
                                                 "decay_steps": 10, "decay_power": 2,
                                                 "end_factor": 0.1}}})"));
  const auto& s = c.optimizer.schedule;
  EXPECT_DOUBLE_EQ(s.factor(0, 100), 0.25);
  EXPECT_DOUBLE_EQ(s.factor(3, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(9, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(10, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(15, 100), 0.1 + 0.9 * 0.25);
  EXPECT_DOUBLE_EQ(s.factor(20, 100), 0.1);
  EXPECT_DOUBLE_EQ(s.factor(50, 100), 0.1);
  // decay_steps = -1: decays until the last step of the run.
  dlrec::model::LrSchedule to_end;
  to_end.decay_steps = -1;
  to_end.decay_power = 1;
  EXPECT_DOUBLE_EQ(to_end.factor(0, 10), 1.0);
  EXPECT_DOUBLE_EQ(to_end.factor(5, 10), 0.5);
  // Round trip and strictness.
  auto back = dlrec::model::RunConfig::from_json(c.to_json());
  EXPECT_DOUBLE_EQ(back.optimizer.schedule.factor(15, 100), s.factor(15, 100));
  EXPECT_THROW(dlrec::model::RunConfig::from_json(dlrec::json::parse(
                   R"({"optimizer": {"schedule": {"warmup_step": 3}}})")),
               dlrec::Error);
}
