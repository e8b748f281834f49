#include "bench/io_fio.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::Contains;
using ::testing::Not;

FioJob Job(IoEngineKind engine) {
  FioJob j;
  j.engine = engine;
  j.op = IoOp::kRead;
  j.filename = "/nvme/f";
  j.file_size_bytes = uint64_t{1} << 30;
  j.block_size_bytes = 1 << 20;
  j.queue_depth = 8;
  j.fixed_buffers_and_files = true;
  j.runtime = absl::Milliseconds(1500);
  j.output_path = "/tmp/o.json";
  return j;
}

TEST(FioArgumentsTest, UringWithRegistrationMatchesOurOptions) {
  std::vector<std::string> a = FioArguments(Job(IoEngineKind::kUring));
  EXPECT_THAT(a, Contains("--ioengine=io_uring"));
  EXPECT_THAT(a, Contains("--iodepth=8"));
  EXPECT_THAT(a, Contains("--bs=1048576"));
  EXPECT_THAT(a, Contains("--direct=1"));
  EXPECT_THAT(a, Contains("--rw=read"));
  EXPECT_THAT(a, Contains("--fixedbufs=1"));
  EXPECT_THAT(a, Contains("--registerfiles=1"));
  EXPECT_THAT(a, Contains("--runtime=1500ms"));
  EXPECT_THAT(a, Contains("--filename=/nvme/f"));
  EXPECT_THAT(a, Not(Contains("--sqthread_poll=1")));
}

TEST(FioArgumentsTest, PsyncDepthBecomesThatManyStreams) {
  FioJob j = Job(IoEngineKind::kPsync);
  j.op = IoOp::kWrite;
  std::vector<std::string> a = FioArguments(j);
  EXPECT_THAT(a, Contains("--ioengine=psync"));
  EXPECT_THAT(a, Contains("--numjobs=8"));
  EXPECT_THAT(a, Contains("--size=134217728"));
  EXPECT_THAT(a, Contains("--offset_increment=134217728"));
  EXPECT_THAT(a, Contains("--rw=write"));
  EXPECT_THAT(a, Not(Contains("--fixedbufs=1")));
}

TEST(FioArgumentsTest, LibaioHasNoUringOptions) {
  std::vector<std::string> a = FioArguments(Job(IoEngineKind::kAio));
  EXPECT_THAT(a, Contains("--ioengine=libaio"));
  EXPECT_THAT(a, Not(Contains("--registerfiles=1")));
}

TEST(ParseFioBandwidthTest, SumsJobsAndSkipsLeadingNoise) {
  const char* report = R"(fio: some warning
{"fio version": "fio-3.33", "jobs": [
  {"jobname": "a", "error": 0, "read": {"bw_bytes": 1000000}, "write": {"bw_bytes": 0}},
  {"jobname": "b", "error": 0, "read": {"bw_bytes": 2500000}, "write": {"bw_bytes": 7}}]})";
  EXPECT_DOUBLE_EQ(*ParseFioBandwidth(report, IoOp::kRead), 3500000);
  EXPECT_DOUBLE_EQ(*ParseFioBandwidth(report, IoOp::kWrite), 7);
}

TEST(ParseFioBandwidthTest, BrokenReportsAreErrors) {
  EXPECT_FALSE(ParseFioBandwidth("no json here", IoOp::kRead).ok());
  EXPECT_FALSE(ParseFioBandwidth(R"({"jobs": []})", IoOp::kRead).ok());
  EXPECT_FALSE(ParseFioBandwidth(R"({"jobs": [{"error": 5, "read": {"bw_bytes": 1}}]})", IoOp::kRead).ok());
}

}  // namespace
}  // namespace strata
