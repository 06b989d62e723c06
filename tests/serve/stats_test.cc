// The request-duration histogram behind dlrec_inference_request_duration_us.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "dlrec/serve/stats.h"

namespace dlrec::serve {
namespace {

size_t bucket_of(uint64_t ns) {
  LatencyHistogram h;
  h.add(ns);
  for (size_t b = 0; b < LatencyHistogram::kBuckets; ++b)
    if (h.counts[b].load() == 1) return b;
  return LatencyHistogram::kBuckets;  // not counted: fails the caller's expectation
}

size_t index_of(uint32_t bound_us) {
  for (size_t b = 0; b + 1 < LatencyHistogram::kBuckets; ++b)
    if (LatencyHistogram::kBoundsUs[b] == bound_us) return b;
  ADD_FAILURE() << "no bucket bound " << bound_us;
  return 0;
}

TEST(LatencyHistogram, ADurationGoesToTheFirstBoundNotBelowIt) {
  EXPECT_EQ(bucket_of(0), index_of(10));
  EXPECT_EQ(bucket_of(10'000), index_of(10));      // exactly 10 us: le="10"
  EXPECT_EQ(bucket_of(10'001), index_of(20));      // a nanosecond more: the next bucket
  EXPECT_EQ(bucket_of(200'000), index_of(200));
  EXPECT_EQ(bucket_of(200'001), index_of(250));
  EXPECT_EQ(bucket_of(1'000'000'000), index_of(1000000));
  EXPECT_EQ(bucket_of(1'000'000'001), LatencyHistogram::kBuckets - 1);  // +Inf
  EXPECT_EQ(bucket_of(~uint64_t{0} / 2), LatencyHistogram::kBuckets - 1);
  for (size_t b = 1; b + 1 < LatencyHistogram::kBuckets; ++b)
    EXPECT_LT(LatencyHistogram::kBoundsUs[b - 1], LatencyHistogram::kBoundsUs[b]);
}

// The value on the line `<name>_<suffix>{model="m",version="1"<extra>} N`, or -1.
long long value_of(const std::string& text, const std::string& line_prefix) {
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line))
    if (line.rfind(line_prefix, 0) == 0) return std::stoll(line.substr(line_prefix.size()));
  return -1;
}

TEST(LatencyHistogram, PrometheusBucketsAreCumulativeWithCountAndSum) {
  StatsRegistry reg;
  auto s = reg.get("m", "1");
  for (uint64_t ns : {5'000u, 150'000u, 150'000u, 900'000u}) {
    s->success.add(ns);
    s->success_us.add(ns);
  }
  s->success.add(2'000'000'000ull);
  s->success_us.add(2'000'000'000ull);  // beyond the last bound
  const std::string text = reg.prometheus();
  const std::string p = "dlrec_inference_request_duration_us";
  EXPECT_NE(text.find("# TYPE " + p + " histogram"), std::string::npos);
  const std::string l = "{model=\"m\",version=\"1\",le=\"";
  EXPECT_EQ(value_of(text, p + "_bucket" + l + "10\"} "), 1);
  EXPECT_EQ(value_of(text, p + "_bucket" + l + "125\"} "), 1);
  EXPECT_EQ(value_of(text, p + "_bucket" + l + "150\"} "), 3);
  EXPECT_EQ(value_of(text, p + "_bucket" + l + "750\"} "), 3);
  EXPECT_EQ(value_of(text, p + "_bucket" + l + "1000\"} "), 4);
  EXPECT_EQ(value_of(text, p + "_bucket" + l + "1000000\"} "), 4);
  EXPECT_EQ(value_of(text, p + "_bucket" + l + "+Inf\"} "), 5);
  EXPECT_EQ(value_of(text, p + "_count{model=\"m\",version=\"1\"} "), 5);
  EXPECT_EQ(value_of(text, p + "_sum{model=\"m\",version=\"1\"} "),
            (5'000 + 150'000 + 150'000 + 900'000 + 2'000'000'000ull) / 1000);
}

}  // namespace
}  // namespace dlrec::serve
