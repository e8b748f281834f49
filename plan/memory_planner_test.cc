#include "plan/memory_planner.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

ClusterSpec OneSmallGpu() {
  ClusterSpec c;
  c.gpus_per_node = 1;
  c.nodes = 1;
  c.gpu_bytes = 16'000'000'000ull;
  c.cpu_bytes = 64'000'000'000ull;
  c.nvme_bytes = 1'000'000'000'000ull;
  return c;
}

const StrategyEstimate& Row(const Plan& plan, Strategy s) {
  return plan.strategies[static_cast<int>(s)];
}

// The example: one 16 GB GPU, 64 GB CPU, 1 TB NVMe, 1e9 params.
TEST(MemoryPlannerTest, OneBillionParamsOnOneSixteenGigabyteGpuRecommendsZero2Offload) {
  ModelSpec model;
  model.params = 1'000'000'000ull;
  auto plan = MakePlan(model, OneSmallGpu(), OffloadBuffers{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (Strategy s : {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    EXPECT_FALSE(Row(*plan, s).fits) << StrategyName(s);
    EXPECT_EQ(Row(*plan, s).overflow, Tier::kGpu) << StrategyName(s);
  }
  EXPECT_TRUE(Row(*plan, Strategy::kZero2Offload).fits);
  EXPECT_TRUE(Row(*plan, Strategy::kZeroInfinity).fits);
  ASSERT_TRUE(plan->recommended.has_value());
  EXPECT_EQ(*plan->recommended, Strategy::kZero2Offload);
  EXPECT_NE(plan->reason.find("zero2_offload is the fastest strategy that fits"), std::string::npos);
  // 16 bytes per parameter of model states alone fill the GPU.
  EXPECT_EQ(Row(*plan, Strategy::kDdp).gpu_model_states, 16'000'000'000ull);
}

// DeepSpeed's estimators, single node, no model parallelism (the formulas in
// deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, zero_init=True,
// additional_buffer_factor=1.5).
TEST(MemoryPlannerTest, ModelStatesAgreeWithDeepSpeedEstimators) {
  ModelSpec model;
  model.params = 13'000'000'000ull;
  model.largest_layer_params = 325'000'000ull;
  ClusterSpec c;
  c.gpus_per_node = 8;
  c.nodes = 1;
  c.gpu_bytes = 80'000'000'000ull;
  c.cpu_bytes = 1'000'000'000'000ull;
  c.nvme_bytes = 8'000'000'000'000ull;
  auto plan = MakePlan(model, c, OffloadBuffers{});
  ASSERT_TRUE(plan.ok());
  const double p = 13e9, n = 8, l = 325e6;
  EXPECT_EQ(Row(*plan, Strategy::kZero2).gpu_model_states, uint64_t(4 * p + 16 * p / n));
  EXPECT_EQ(Row(*plan, Strategy::kZero2).cpu_bytes, uint64_t(p * 4 * 8 * 1.5));
  EXPECT_EQ(Row(*plan, Strategy::kZero2Offload).gpu_model_states, uint64_t(2 * p));
  EXPECT_EQ(Row(*plan, Strategy::kZero2Offload).cpu_bytes, uint64_t(p * std::max(4 * n, 16.0) * 1.5));
  EXPECT_EQ(Row(*plan, Strategy::kZero3).gpu_model_states, uint64_t(4 * l + 18 * p / n));
  EXPECT_EQ(Row(*plan, Strategy::kZero3).cpu_bytes, uint64_t(l * 4 * 8 * 1.5));
  EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadOptimizer).gpu_model_states, uint64_t(4 * l + 2 * p / n));
  EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadOptimizer).cpu_bytes, uint64_t(p * 16 * 1.5));
  EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadAll).gpu_model_states, uint64_t(4 * l));
  EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadAll).cpu_bytes, uint64_t(p * 18 * 1.5));
  // zero1: 4P + 16P/8 = 78 GB plus the 1 GiB reserve fits 80 GB; ddp (208 GB) does not.
  EXPECT_EQ(*plan->recommended, Strategy::kZero1);
}

TEST(MemoryPlannerTest, TensorAndPipelineParallelismDivideModelStates) {
  ModelSpec model;
  model.params = 8'000'000'000ull;
  model.largest_layer_params = 100'000'000ull;
  ClusterSpec c = OneSmallGpu();
  c.gpus_per_node = 8;
  c.gpu_bytes = 80'000'000'000ull;
  c.cpu_bytes = 2'000'000'000'000ull;
  auto plain = MakePlan(model, c, OffloadBuffers{});
  c.tensor_parallel = 2;
  c.pipeline_parallel = 2;
  auto mp = MakePlan(model, c, OffloadBuffers{});
  ASSERT_TRUE(plain.ok() && mp.ok());
  EXPECT_EQ(mp->data_parallel, 2u);
  EXPECT_EQ(Row(*mp, Strategy::kDdp).gpu_model_states, Row(*plain, Strategy::kDdp).gpu_model_states / 4);
}

TEST(MemoryPlannerTest, TransformerShapeGivesParamsAndActivations) {
  TransformerShape shape{24, 2048, 16, 50257, 2048, 8};
  ASSERT_TRUE(ValidateTransformerShape(shape).ok());
  // 24 * (12*2048^2 + 13*2048) + 50257*2048 + 2048*2048 + 2*2048
  EXPECT_EQ(TransformerParams(shape), 24ull * (12ull * 2048 * 2048 + 13 * 2048) + 50257ull * 2048 +
                                          2048ull * 2048 + 2 * 2048);
  uint64_t full = ActivationBytes(shape, 1, false);
  uint64_t ckpt = ActivationBytes(shape, 1, true);
  EXPECT_LT(ckpt, full / 10);
  // s*b*h*(34 + 5as/h) per layer at t=1.
  const double sbh = 2048.0 * 8 * 2048;
  EXPECT_EQ(full, uint64_t(sbh * (34.0 + 5.0 * 16 * 2048 / 2048) * 24));
  shape.heads = 3;
  EXPECT_FALSE(ValidateTransformerShape(shape).ok());
}

TEST(MemoryPlannerTest, RejectsImpossibleClustersNamingTheFlag) {
  ModelSpec model;
  model.params = 1'000'000'000ull;
  ClusterSpec c = OneSmallGpu();
  c.gpus_per_node = 8;
  c.tensor_parallel = 3;
  auto plan = MakePlan(model, c, OffloadBuffers{});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("--tp 3"), std::string::npos);
  model.params = 0;
  EXPECT_NE(MakePlan(model, OneSmallGpu(), OffloadBuffers{}).status().message().find("--params"),
            std::string::npos);
}

TEST(MemoryPlannerTest, NothingFitsSaysWhatToChange) {
  ModelSpec model;
  model.params = 1'000'000'000'000ull;
  auto plan = MakePlan(model, OneSmallGpu(), OffloadBuffers{});
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->recommended.has_value());
  EXPECT_NE(plan->reason.find("nothing fits"), std::string::npos);
}

TEST(MemoryPlannerTest, DeepSpeedConfigSelectsItsStrategy) {
  DeepSpeedConfig c;
  c.zero.stage = 3;
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  EXPECT_EQ(StrategyForConfig(c), Strategy::kZeroInfinity);
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  EXPECT_EQ(StrategyForConfig(c), Strategy::kZero3OffloadOptimizer);
  c.zero.stage = 2;
  EXPECT_EQ(StrategyForConfig(c), Strategy::kZero2Offload);
  c.zero.stage = 0;
  EXPECT_EQ(StrategyForConfig(c), Strategy::kDdp);
}

}  // namespace
}  // namespace strata
