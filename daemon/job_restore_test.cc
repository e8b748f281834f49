// Job::Restore on records whose stored partitions (trainer-supplied, kept in
// the job's NVMe record) are damaged or hostile: the record is a file on
// disk, so its partitions get the checks a trainer's get at RegisterTensors
// and a bad one is refused as DataLoss, naming the rank, shard and range,
// never a crash (the job_record fuzzer found a range naming a tensor the
// record does not have, which used to throw out of the exchange layout).
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "daemon/job.h"
#include "daemon/request_limits.h"
#include "gtest/gtest.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "swap/testing/scratch_extent_store.h"

namespace strata {
namespace {

// An Infinity job of two ranks over one 300-element tensor, each rank owning
// half of it in one shard of 160 elements; RANGE0 and RANGE1 are the ranks'
// ranges ([tensor, tensor_offset, numel, shard_offset]).
constexpr char kRecord[] = R"({
  "settings": {
    "name": "inf",
    "worldSize": 2,
    "mode": "MODE_INFINITY",
    "deepspeedConfigJson": "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}",
    "paramDtype": "fp32",
    "gradDtype": "fp32",
    "pinnedBudgetBytes": "65536"
  },
  "tensors": [{"name": "w", "numel": 300, "group": 0}],
  "owner_uid": 1000,
  "partitions": [
    [{"index": 0, "padded_numel": 160, "ranges": [RANGE0]}],
    [{"index": 0, "padded_numel": 160, "ranges": [RANGE1]}]
  ],
  "next_step": 5,
  "optimizer_steps": 5,
  "loss_scaler": {"scale": 256.0, "hysteresis_left": 2, "iteration": 5, "last_overflow_iteration": 0,
                  "any_overflow": false}
})";

std::string Record(const std::string& range0, const std::string& range1) {
  return absl::StrReplaceAll(kRecord, {{"RANGE0", range0}, {"RANGE1", range1}});
}

class JobRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = ScratchExtentStore::Create("restore", 16 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    CpuOptimizerOptions options;
    options.num_threads = 1;
    auto optimizer = CpuOptimizer::Create(options);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    optimizer_ = std::move(*optimizer);
  }

  absl::StatusOr<std::unique_ptr<Job>> Restore(const std::string& text) {
    JobServices services;
    services.optimizer = optimizer_.get();
    services.nvme = scratch_->store();
    services.io_tile_bytes = 1 << 20;
    services.limits = &limits_;
    return Job::Restore(/*id=*/3, text, services);
  }

  void ExpectRefused(const std::string& text, const std::string& says) {
    auto job = Restore(text);
    ASSERT_FALSE(job.ok()) << "restored a record it should refuse:\n" << text;
    EXPECT_EQ(job.status().code(), absl::StatusCode::kDataLoss) << job.status();
    EXPECT_NE(job.status().message().find(says), std::string::npos) << job.status();
  }

  std::unique_ptr<ScratchExtentStore> scratch_;
  std::unique_ptr<CpuOptimizer> optimizer_;
  RequestLimits limits_;
};

// A sound partition passes the checks and the restore goes on to its states'
// NVMe homes, which this scratch store does not have (the records in the
// durability tests have them and come back whole).
TEST_F(JobRestoreTest, ASoundPartitionPassesAndTheRestoreLooksForItsNvmeHomes) {
  auto job = Restore(Record("[0, 0, 150, 0]", "[0, 150, 150, 0]"));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound) << job.status();
  EXPECT_NE(job.status().message().find("job3/rank0/t0/master32/0 is missing from NVMe"), std::string::npos)
      << job.status();
}

TEST_F(JobRestoreTest, ARangeNamingATensorTheRecordLacksIsDataLoss) {
  ExpectRefused(Record("[1, 0, 150, 0]", "[0, 150, 150, 0]"), "names tensor 1; there are 1");
}

TEST_F(JobRestoreTest, ARangePastItsTensorIsDataLoss) {
  ExpectRefused(Record("[0, 0, 150, 0]", "[0, 200, 150, 0]"), "of tensor 0 ('w'), which has 300");
}

TEST_F(JobRestoreTest, ARangePastItsShardIsDataLoss) {
  ExpectRefused(Record("[0, 0, 150, 20]", "[0, 150, 150, 0]"), "overruns the shard's 160");
}

TEST_F(JobRestoreTest, ElementsOwnedByTwoRanksAreDataLoss) {
  ExpectRefused(Record("[0, 0, 150, 0]", "[0, 100, 150, 0]"), "owned by rank 0");
}

TEST_F(JobRestoreTest, PartitionsForTheWrongNumberOfRanksAreDataLoss) {
  std::string text = Record("[0, 0, 150, 0]", "[0, 150, 150, 0]");
  const std::string second = R"(,
    [{"index": 0, "padded_numel": 160, "ranges": [[0, 150, 150, 0]]}])";
  const size_t at = text.find(second);
  ASSERT_NE(at, std::string::npos);
  text.erase(at, second.size());
  ExpectRefused(text, "has partitions for 1 ranks; the job has 2");
}

}  // namespace
}  // namespace strata
