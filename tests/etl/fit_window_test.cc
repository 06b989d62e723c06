// Workflow::fit_batches with several batches in flight (window > 1: the column strands go
// through the batches at their own pace): the fitted state equals a chunk-by-chunk fit for any
// window and thread count, the source's chunks are not read after the fit gave them up, side
// tasks run once each before their batch is given up, and the error of the oldest failing
// batch is the one reported.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/workflow.h"

namespace dlrec::etl {
namespace {

struct ThreadsGuard {
  int saved = num_threads();
  ~ThreadsGuard() { set_num_threads(saved); }
};

// label, I1..I4, C1..C6 (C6 multi-hot).
io::Schema schema() {
  io::Schema s;
  s.columns.push_back({"label", io::ColumnKind::Label, false});
  for (int d = 1; d <= 4; ++d) s.columns.push_back({"I" + std::to_string(d), io::ColumnKind::Dense, false});
  for (int c = 1; c <= 6; ++c)
    s.columns.push_back({"C" + std::to_string(c), io::ColumnKind::Categorical, c == 6});
  return s;
}

// Two fit passes (Normalize twice), a Filter (the fit sees filtered copies), feature ops, and
// categorical columns of very different vocabulary sizes (uneven column tasks).
json config() {
  return json::parse(R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Normalize"},
                                  {"op": "Clip", "min": -1}, {"op": "Normalize"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]},
    {"columns": ["C1", "C2"], "ops": [{"op": "TargetEncoding", "kfold": 3, "seed": 5},
                                      {"op": "HashedCross", "num_buckets": 100}]},
    {"columns": ["I2"], "ops": [{"op": "Filter", "min": 1}]}]})");
}

// A random chunk of `rows` rows; column C<k> draws keys from a vocabulary of 10^k / 10.
io::RawChunk random_chunk(std::mt19937_64& rng, int64_t rows, int64_t first_line) {
  io::RawChunk c;
  c.reset(4, 6);
  c.rows = rows;
  c.first_line = first_line;
  for (int64_t r = 0; r < rows; ++r) {
    c.label.push_back(static_cast<float>(rng() % 3 == 0));
    for (int d = 0; d < 4; ++d)
      c.dense.push_back(rng() % 7 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                       : static_cast<float>(rng() % 1000) / 10.0f);
    for (int k = 0; k < 6; ++k) {
      const uint64_t vocab = k == 5 ? 50 : static_cast<uint64_t>(std::pow(10.0, k + 1)) / 10 + 2;
      const int n = k == 5 ? static_cast<int>(rng() % 4) : rng() % 9 != 0;
      for (int v = 0; v < n; ++v) c.cat_values[k].push_back(rng() % vocab * 7919 + k);
      c.cat_offsets[k].push_back(static_cast<int64_t>(c.cat_values[k].size()));
    }
  }
  return c;
}

// Batches of 1-9 chunks of 0-300 rows.
std::vector<std::vector<io::RawChunk>> random_batches(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<io::RawChunk>> b(count);
  int64_t line = 1;
  for (auto& batch : b) {
    const int chunks = 1 + static_cast<int>(rng() % 9);
    for (int i = 0; i < chunks; ++i) {
      const int64_t rows = rng() % 10 == 0 ? 0 : static_cast<int64_t>(rng() % 300);
      batch.push_back(random_chunk(rng, rows, line));
      line += rows;
    }
  }
  return b;
}

std::string fitted_state(const Workflow& w) { return w.to_json().dump(); }

// The reference: one chunk at a time, one thread.
std::string reference_state(const std::vector<std::vector<io::RawChunk>>& batches) {
  ThreadsGuard guard;
  set_num_threads(1);
  Workflow w = Workflow::from_config(config(), schema());
  w.fit_multipass([&]() -> ChunkSource {
    auto at = std::make_shared<std::pair<size_t, size_t>>(0, 0);
    return [&batches, at](io::RawChunk& out) {
      while (at->first < batches.size() && at->second >= batches[at->first].size()) {
        ++at->first;
        at->second = 0;
      }
      if (at->first >= batches.size()) return false;
      out = batches[at->first][at->second++];
      return true;
    };
  });
  return fitted_state(w);
}

// A source over `batches` with `window` slots, like run_etl's: call c copies batch c into slot
// c % window, overwriting what the fit was given `window` calls before, and checks that the
// side tasks of that batch are all done. Side task (b, i) checks that chunk i of batch b is
// still in its slot, and counts.
struct SlotSource {
  const std::vector<std::vector<io::RawChunk>>& batches;
  int window;
  std::vector<std::vector<io::RawChunk>> slots;
  std::vector<std::unique_ptr<std::atomic<int>>> side_done;  // per batch
  std::atomic<int> side_bad{0};
  int early_reuse = 0;  // slots reused before their side tasks were done
  int passes = 0;
  FitSideWork side;

  SlotSource(const std::vector<std::vector<io::RawChunk>>& b, int w)
      : batches(b), window(w), slots(w) {
    for (size_t i = 0; i < b.size(); ++i) side_done.push_back(std::make_unique<std::atomic<int>>(0));
    side.task = [this](int64_t batch, int i) {
      const io::RawChunk& now = slots[batch % window][i];
      const io::RawChunk& want = batches[batch][i];
      // (bytes compared: the dense values hold NaNs)
      if (now.rows != want.rows || now.first_line != want.first_line ||
          now.dense.size() != want.dense.size() ||
          (!now.dense.empty() &&  // (memcmp of empty vectors' null data() is undefined)
           std::memcmp(now.dense.data(), want.dense.data(), now.dense.size() * sizeof(float)) != 0))
        ++side_bad;
      ++*side_done[batch];
    };
  }
  ChunkBatchSource open() {
    auto call = std::make_shared<int64_t>(0);
    ++passes;
    return [this, call](std::vector<const io::RawChunk*>& out) {
      out.clear();
      const int64_t c = (*call)++;
      if (c >= window && c - window < static_cast<int64_t>(batches.size()) &&
          side_done[c - window]->load() != passes * static_cast<int>(batches[c - window].size()))
        ++early_reuse;
      if (c >= static_cast<int64_t>(batches.size())) return 0;
      auto& slot = slots[c % window];
      slot = batches[c];
      for (auto& ch : slot) out.push_back(&ch);
      side.count = static_cast<int>(slot.size());
      return static_cast<int>(out.size());
    };
  }
};

TEST(FitWindowTest, SameStateAsChunkByChunkForAnyWindowAndThreads) {
  const auto batches = random_batches(40, 11);
  const std::string ref = reference_state(batches);
  ThreadsGuard guard;
  for (int threads : {1, 2, 5, 8}) {
    for (int window : {1, 2, 3, 7, 64}) {
      set_num_threads(threads);
      SlotSource src(batches, window);
      Workflow w = Workflow::from_config(config(), schema());
      ASSERT_EQ(w.num_fit_passes(), 2);
      w.fit_batches([&] { return src.open(); }, &src.side, window);
      const std::string at = std::to_string(threads) + " threads, window " + std::to_string(window);
      EXPECT_TRUE(w.fitted()) << at;
      EXPECT_EQ(fitted_state(w), ref) << at;
      EXPECT_EQ(src.early_reuse, 0) << at;
      EXPECT_EQ(src.side_bad.load(), 0) << at;
      for (size_t b = 0; b < batches.size(); ++b)  // once per pass
        EXPECT_EQ(src.side_done[b]->load(), 2 * static_cast<int>(batches[b].size())) << at;
    }
  }
}

std::string fit_error(const std::vector<std::vector<io::RawChunk>>& batches, int window,
                      int64_t source_fails_at, int64_t side_fails_at, int64_t malformed_at,
                      bool* fitted) {
  auto bad = batches;
  if (malformed_at >= 0) bad[malformed_at][0].reset(4, 5);  // one categorical column short
  SlotSource src(bad, window);
  src.side.task = [&, inner = src.side.task](int64_t b, int i) {
    if (b == side_fails_at && i == 0) fail("side task failed at batch ", b);
    inner(b, i);
  };
  Workflow w = Workflow::from_config(config(), schema());
  std::string msg = "(no error)";
  try {
    w.fit_batches(
        [&]() -> ChunkBatchSource {
          ChunkBatchSource inner = src.open();
          auto call = std::make_shared<int64_t>(0);
          return [inner, call, source_fails_at](std::vector<const io::RawChunk*>& out) {
            if ((*call)++ == source_fails_at) fail("read failed at batch ", source_fails_at);
            return inner(out);
          };
        },
        &src.side, window);
  } catch (const Error& e) {
    msg = e.what();
  }
  *fitted = w.fitted();
  return msg;
}

// Errors of later batches may happen first with batches in flight; the oldest batch's error is
// reported, as a batch-by-batch fit (window 1) reports it, and the workflow stays unfitted.
TEST(FitWindowTest, OldestFailingBatchErrorWins) {
  const auto batches = random_batches(16, 12);
  ThreadsGuard guard;
  struct Case {
    int64_t source, side, malformed;
    const char* want;
  };
  const Case cases[] = {{9, -1, -1, "read failed at batch 9"},
                        {9, 6, -1, "side task failed at batch 6"},
                        {9, 6, 4, "chunk has 4 dense and 5 categorical"},
                        {2, 6, 4, "read failed at batch 2"},
                        {-1, 0, -1, "side task failed at batch 0"}};
  for (int threads : {1, 4, 8}) {
    set_num_threads(threads);
    for (int window : {1, 3, 8}) {
      for (const Case& k : cases) {
        bool fitted = true;
        const std::string msg = fit_error(batches, window, k.source, k.side, k.malformed, &fitted);
        EXPECT_NE(msg.find(k.want), std::string::npos)
            << msg << " (" << threads << " threads, window " << window << ", want " << k.want
            << ")";
        EXPECT_FALSE(fitted);
      }
    }
  }
}

TEST(FitWindowTest, BadWindowIsAnError) {
  Workflow w = Workflow::from_config(config(), schema());
  try {
    w.fit_batches([] { return ChunkBatchSource([](std::vector<const io::RawChunk*>&) { return 0; }); },
                  nullptr, 0);
    FAIL() << "window 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window must be >= 1, got 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dlrec::etl
