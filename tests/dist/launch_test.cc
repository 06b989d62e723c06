// dist::run_job (include/dlrec/dist/launch.h), the launch-or-run block of `dlrec etl
// --processes` and `dlrec train --ranks`, in a single process (tests/dist/data_parallel_test.cc
// and etl_ranks_test.cc run it under MPI through the CLI): the body gets the communicator, a
// job size that differs from the one asked for is an error naming the option, and an error of
// the body propagates.
#include "dlrec/dist/launch.h"

#include <gtest/gtest.h>

#include "test_errors.h"

using namespace dlrec;
using dlrec::testing::expect_error;

namespace {
dist::JobRequest single_request(int size) {
  dist::JobRequest r;
  r.size = size;
  r.launch = false;
  r.command = "etl";
  r.unit = "process";
  r.option = "--processes";
  r.comm_kind = "single";
  return r;
}
}  // namespace

TEST(RunJob, RunsTheBodyWithTheCommunicatorAndReturnsItsStatus) {
  int size_seen = 0;
  const int rc = dist::run_job(single_request(1), {"dlrec", "etl"}, [&](dist::Communicator& c) {
    size_seen = c.size();
    return 7;
  });
  EXPECT_EQ(rc, 7);
  EXPECT_EQ(size_seen, 1);
  // Size 0: the job as launched, unchecked.
  EXPECT_EQ(dist::run_job(single_request(0), {"dlrec"}, [](dist::Communicator&) { return 0; }), 0);
}

TEST(RunJob, ASizeOtherThanTheJobsIsAnErrorNamingTheOption) {
  bool ran = false;
  expect_error(
      [&] {
        dist::run_job(single_request(3), {"dlrec"}, [&](dist::Communicator&) {
          ran = true;
          return 0;
        });
      },
      {"this job has 1 process but the command asks for 3 (--processes 3)", "mpirun -np 3"});
  EXPECT_FALSE(ran);
  dist::JobRequest r = single_request(2);
  r.unit = "rank";
  r.option = "--gpus";
  expect_error([&] { dist::run_job(r, {"dlrec"}, [](dist::Communicator&) { return 0; }); },
               {"this job has 1 rank but the command asks for 2 (--gpus 2)"});
}

TEST(RunJob, AnErrorOfTheBodyPropagatesInASingleProcess) {
  expect_error(
      [&] {
        dist::run_job(single_request(1), {"dlrec"},
                      [](dist::Communicator&) -> int { fail("the body failed at row 3"); });
      },
      {"the body failed at row 3"});
}
