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
  auto plan = MakePlan(model, OneSmallGpu(), ZeroBuffers{});
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

ClusterSpec EightGpus() {
  ClusterSpec c;
  c.gpus_per_node = 8;
  c.nodes = 1;
  c.gpu_bytes = 80'000'000'000ull;
  c.cpu_bytes = 1'000'000'000'000ull;
  c.nvme_bytes = 8'000'000'000'000ull;
  return c;
}

ClusterSpec DataParallel(uint64_t n) {
  ClusterSpec c = EightGpus();
  c.gpus_per_node = n <= 8 ? n : 8;
  c.nodes = n <= 8 ? 1 : n / 8;
  return c;
}

// The ZeRO paper's model states (Rajbhandari et al. 2020, Figure 1, K = 12):
// DDP 16P, ZeRO-1 4P + 12P/N, ZeRO-2 2P + 14P/N, ZeRO-3 16P/N; with the
// optimizer offloaded the GPU keeps fp16 params (2P, or 2P/N at stage 3).
TEST(MemoryPlannerTest, ModelStatesFollowTheZeroPaper) {
  struct Case {
    uint64_t p, n;
  };
  for (Case k : {Case{1'000'000'000ull, 1}, Case{7'000'000'000ull, 8}, Case{13'000'000'000ull, 16},
                 Case{70'000'000'000ull, 64}, Case{1'600'000'000ull, 4}}) {
    ModelSpec model;
    model.params = k.p;
    auto plan = MakePlan(model, DataParallel(k.n), ZeroBuffers{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->data_parallel, k.n);
    const uint64_t p = k.p, n = k.n;
    SCOPED_TRACE(testing::Message() << "P=" << p << " N=" << n);
    EXPECT_EQ(Row(*plan, Strategy::kDdp).gpu_model_states, 16 * p);
    EXPECT_EQ(Row(*plan, Strategy::kZero1).gpu_model_states, 4 * p + 12 * p / n);
    EXPECT_EQ(Row(*plan, Strategy::kZero2).gpu_model_states, 2 * p + 14 * p / n);
    EXPECT_EQ(Row(*plan, Strategy::kZero3).gpu_model_states, 16 * p / n);
    EXPECT_EQ(Row(*plan, Strategy::kZero2Offload).gpu_model_states, 2 * p);
    EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadOptimizer).gpu_model_states, 2 * p / n);
    EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadAll).gpu_model_states, 0u);
    EXPECT_EQ(Row(*plan, Strategy::kZeroInfinity).gpu_model_states, 0u);
  }
}

// With one data-parallel rank nothing is partitioned: the paper's four
// figures are all 16P. ZeRO-1 and ZeRO-2 then hold the same buffers except
// the largest module's gradient, which ZeRO-2's hooks see whole before they
// bucket it (ZeRO-1 counts it among its whole gradients).
TEST(MemoryPlannerTest, OneRankPartitionsNothing) {
  ModelSpec model;
  model.params = 1'300'000'000ull;
  auto plan = MakePlan(model, DataParallel(1), ZeroBuffers{});
  ASSERT_TRUE(plan.ok());
  for (Strategy s : {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    EXPECT_EQ(Row(*plan, s).gpu_model_states, 16 * model.params) << StrategyName(s);
  }
  const StrategyEstimate& z1 = Row(*plan, Strategy::kZero1);
  const StrategyEstimate& z2 = Row(*plan, Strategy::kZero2);
  EXPECT_EQ(z2.gpu_bytes - z1.gpu_bytes, z2.gpu_buffers.module_gradient);
  EXPECT_EQ(z2.gpu_buffers.module_gradient, 2 * plan->largest_layer_params);
}

// The seed's lesson: each stage partitions one more kind of state, so for
// N > 1 ZeRO-1 > ZeRO-2 > ZeRO-3, in model states for any model and, with
// the runtime's buffers, for models from 1.3B up.
TEST(MemoryPlannerTest, EachStageNeedsLessGpuMemoryThanTheOneBefore) {
  for (uint64_t p : {1'300'000'000ull, 7'000'000'000ull, 13'000'000'000ull, 70'000'000'000ull}) {
    for (uint64_t n : {2u, 4u, 8u, 64u}) {
      ModelSpec model;
      model.params = p;
      auto plan = MakePlan(model, DataParallel(n), ZeroBuffers{});
      ASSERT_TRUE(plan.ok());
      SCOPED_TRACE(testing::Message() << "P=" << p << " N=" << n);
      const StrategyEstimate& z1 = Row(*plan, Strategy::kZero1);
      const StrategyEstimate& z2 = Row(*plan, Strategy::kZero2);
      const StrategyEstimate& z3 = Row(*plan, Strategy::kZero3);
      EXPECT_GT(Row(*plan, Strategy::kDdp).gpu_bytes, z1.gpu_bytes);
      EXPECT_GT(z1.gpu_model_states, z2.gpu_model_states);
      EXPECT_GT(z2.gpu_model_states, z3.gpu_model_states);
      EXPECT_GT(z1.gpu_bytes, z2.gpu_bytes);
      EXPECT_GT(z2.gpu_bytes, z3.gpu_bytes);
    }
  }
}

// The buffers DeepSpeed's runtime allocates, at its defaults, for 7B params
// on 8 GPUs (largest module 211.6M params by the GPT-like estimate).
TEST(MemoryPlannerTest, DefaultBuffersAreDeepSpeedRuntimeBuffers) {
  ModelSpec model;
  model.params = 7'000'000'000ull;
  model.largest_layer_params = 200'000'000ull;
  auto plan = MakePlan(model, EightGpus(), ZeroBuffers{});
  ASSERT_TRUE(plan.ok());
  const uint64_t p = model.params, n = 8, l = model.largest_layer_params;
  // DDP: one 5e8-element all-reduce flatten buffer, the whole fp32 gradient.
  EXPECT_EQ(Row(*plan, Strategy::kDdp).gpu_buffers.reduce_buckets, 2 * 500'000'000ull);
  EXPECT_EQ(Row(*plan, Strategy::kDdp).gpu_buffers.fp32_gradients, 4 * p);
  // ZeRO-1/2: one 16-bit reduce bucket of 5e8 (overlap_comm off), the fp32
  // gradient partition the step makes.
  for (Strategy s : {Strategy::kZero1, Strategy::kZero2}) {
    EXPECT_EQ(Row(*plan, s).gpu_buffers.reduce_buckets, 1'000'000'000ull) << StrategyName(s);
    EXPECT_EQ(Row(*plan, s).gpu_buffers.fp32_gradients, 4 * p / n) << StrategyName(s);
    EXPECT_EQ(Row(*plan, s).gpu_buffers.gathered_params, 0u) << StrategyName(s);
  }
  // ZeRO-3: the module in use plus the 5e7 prefetch bucket gathered, a
  // one-sub-group fp32 gradient (sub_group_size 1e9 > P/N), persistent params.
  const StrategyEstimate& z3 = Row(*plan, Strategy::kZero3);
  EXPECT_EQ(z3.gpu_buffers.gathered_params, 2 * (l + 50'000'000ull));
  EXPECT_EQ(z3.gpu_buffers.fp32_gradients, 4 * p / n);
  EXPECT_EQ(z3.gpu_buffers.module_gradient, 2 * l);
  EXPECT_EQ(z3.gpu_buffers.persistent_params, 2 * plan->persistent_params);
  EXPECT_GT(plan->persistent_params, 0u);
  EXPECT_LT(plan->persistent_params, p / 1000);
  EXPECT_EQ(z3.gpu_bytes, z3.gpu_model_states + z3.gpu_buffers.Total() + ClusterSpec{}.gpu_reserve_bytes);
  // Offloading the optimizer moves the fp32 gradient to the CPU.
  EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadOptimizer).gpu_buffers.fp32_gradients, 0u);
  EXPECT_EQ(Row(*plan, Strategy::kZero2Offload).gpu_buffers.fp32_gradients, 0u);
  EXPECT_EQ(Row(*plan, Strategy::kZero2Offload).gpu_buffers.offload_staging, 2 * l);
  // CPU per node: stage-3 optimizer offload holds fp32 master, m, v, grad and
  // the fp16 grad partition (18 bytes/param/rank), x 1.5 DeepSpeed's factor.
  EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadOptimizer).cpu_bytes, uint64_t(18.0 * p / n * 8 * 1.5));
  EXPECT_EQ(Row(*plan, Strategy::kZero3OffloadAll).cpu_bytes, uint64_t(20.0 * p / n * 8 * 1.5));
}

// The sizes in a DeepSpeed config move the figures by exactly the buffers
// they size.
TEST(MemoryPlannerTest, ConfigBucketSizesChangeTheFigures) {
  ModelSpec model;
  model.params = 7'000'000'000ull;
  model.largest_layer_params = 200'000'000ull;
  const uint64_t l = model.largest_layer_params;
  auto base = MakePlan(model, EightGpus(), ZeroBuffers{});
  ASSERT_TRUE(base.ok());

  DeepSpeedConfig config;
  config.zero.stage = 2;
  config.zero.reduce_bucket_size = 200'000'000;
  config.zero.overlap_comm = true;  // a second bucket buffer at stage 1/2
  ZeroBuffers b = BuffersFromConfig(config);
  EXPECT_TRUE(b.overlap_comm_stage12);
  auto small = MakePlan(model, EightGpus(), b);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(Row(*small, Strategy::kZero2).gpu_buffers.reduce_buckets, 2 * 2 * 200'000'000ull);
  EXPECT_EQ(Row(*base, Strategy::kZero2).gpu_bytes - Row(*small, Strategy::kZero2).gpu_bytes,
            1'000'000'000ull - 800'000'000ull);
  // Stage 3 has one bucket buffer whatever overlap_comm says.
  EXPECT_EQ(Row(*small, Strategy::kZero3).gpu_buffers.reduce_buckets, 2 * 200'000'000ull);

  // A stage-3 config: overlap_comm's stage-3 default does not give the
  // stage-1/2 rows a second buffer.
  config.zero.stage = 3;
  config.zero.reduce_bucket_size = 500'000'000;
  config.zero.stage3_prefetch_bucket_size = 100'000'000;
  config.zero.sub_group_size = 100'000'000;
  b = BuffersFromConfig(config);
  EXPECT_FALSE(b.overlap_comm_stage12);
  auto z3 = MakePlan(model, EightGpus(), b);
  ASSERT_TRUE(z3.ok());
  EXPECT_EQ(Row(*z3, Strategy::kZero2).gpu_bytes, Row(*base, Strategy::kZero2).gpu_bytes);
  EXPECT_EQ(Row(*z3, Strategy::kZero3).gpu_buffers.gathered_params, 2 * (l + 100'000'000ull));
  EXPECT_EQ(Row(*z3, Strategy::kZero3).gpu_buffers.fp32_gradients, 4 * 100'000'000ull);

  // max_live_parameters caps the prefetch, never the module in use.
  config.zero.stage3_max_live_parameters = 250'000'000;
  auto capped = MakePlan(model, EightGpus(), BuffersFromConfig(config));
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(Row(*capped, Strategy::kZero3).gpu_buffers.gathered_params, 2 * 250'000'000ull);
  config.zero.stage3_max_live_parameters = 1'000;
  capped = MakePlan(model, EightGpus(), BuffersFromConfig(config));
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(Row(*capped, Strategy::kZero3).gpu_buffers.gathered_params, 2 * l);

  // Persistence threshold 0: nothing is kept whole.
  config.zero.stage3_param_persistence_threshold = 0;
  auto none = MakePlan(model, EightGpus(), BuffersFromConfig(config));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->persistent_params, 0u);
  EXPECT_EQ(Row(*none, Strategy::kZero3).gpu_buffers.persistent_params, 0u);

  // Without contiguous_gradients there is no bucket buffer, except with CPU
  // offload, which forces it on.
  config.zero.contiguous_gradients = false;
  auto loose = MakePlan(model, EightGpus(), BuffersFromConfig(config));
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(Row(*loose, Strategy::kZero2).gpu_buffers.reduce_buckets, 0u);
  EXPECT_EQ(Row(*loose, Strategy::kZero3).gpu_buffers.reduce_buckets, 0u);
  EXPECT_EQ(Row(*loose, Strategy::kZero2Offload).gpu_buffers.reduce_buckets, 1'000'000'000ull);
}

// tensor_parallel.autotp_size divides each GPU's params and the GPUs left
// for data parallelism.
TEST(MemoryPlannerTest, AutoTpSizeDividesPerGpuParams) {
  ModelSpec model;
  model.params = 8'000'000'000ull;
  model.largest_layer_params = 100'000'000ull;
  DeepSpeedConfig config;
  config.tensor_parallel_autotp_size = 2;
  ClusterSpec c = EightGpus();
  ASSERT_TRUE(ApplyConfigTensorParallel(config, /*tp_flag_given=*/false, &c).ok());
  EXPECT_EQ(c.tensor_parallel, 2u);
  auto plan = MakePlan(model, c, ZeroBuffers{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->data_parallel, 4u);
  const uint64_t pm = model.params / 2;
  EXPECT_EQ(Row(*plan, Strategy::kDdp).gpu_model_states, 16 * pm);
  EXPECT_EQ(Row(*plan, Strategy::kZero2).gpu_model_states, 2 * pm + 14 * pm / 4);
  EXPECT_EQ(Row(*plan, Strategy::kZero3).gpu_model_states, 16 * pm / 4);
  EXPECT_EQ(Row(*plan, Strategy::kZero3).gpu_buffers.module_gradient, 2 * 50'000'000ull);

  // --tp equal to the config is fine; different is an error naming both.
  ClusterSpec flagged = EightGpus();
  flagged.tensor_parallel = 2;
  EXPECT_TRUE(ApplyConfigTensorParallel(config, true, &flagged).ok());
  flagged.tensor_parallel = 4;
  absl::Status s = ApplyConfigTensorParallel(config, true, &flagged);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--tp 4"), std::string::npos);
  EXPECT_NE(s.message().find("autotp_size 2"), std::string::npos);
  // Unset (0) leaves the cluster alone.
  config.tensor_parallel_autotp_size = 0;
  ClusterSpec untouched = EightGpus();
  ASSERT_TRUE(ApplyConfigTensorParallel(config, false, &untouched).ok());
  EXPECT_EQ(untouched.tensor_parallel, 1u);
}

TEST(MemoryPlannerTest, PersistentParamsCountSmallTensors) {
  TransformerShape shape{2, 1024, 16, 50257, 2048, 1};
  // Per layer: biases 3h + h + 4h + h and two norms (4 tensors of h); the
  // final norm 2h. Weights (h*h and up) and embeddings are above 1e5.
  EXPECT_EQ(TransformerPersistentParams(shape, 100'000), 2 * 13 * 1024 + 2 * 1024);
  // Threshold between h and 3h: only the h-long tensors.
  EXPECT_EQ(TransformerPersistentParams(shape, 2000), 2 * 6 * 1024 + 2 * 1024);
  EXPECT_EQ(TransformerPersistentParams(shape, 0), 0u);
}

TEST(MemoryPlannerTest, HugeInputsAreRejectedNotOverflowed) {
  ModelSpec model;
  model.params = 2'000'000'000'000'000ull;
  auto plan = MakePlan(model, EightGpus(), ZeroBuffers{});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("--params"), std::string::npos);
  model.params = 1'000'000'000ull;
  ZeroBuffers b;
  b.reduce_bucket_size = 5'000'000'000'000'000'000ull;
  plan = MakePlan(model, EightGpus(), b);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("reduce_bucket_size"), std::string::npos);
}

TEST(MemoryPlannerTest, TensorAndPipelineParallelismDivideModelStates) {
  ModelSpec model;
  model.params = 8'000'000'000ull;
  model.largest_layer_params = 100'000'000ull;
  ClusterSpec c = OneSmallGpu();
  c.gpus_per_node = 8;
  c.gpu_bytes = 80'000'000'000ull;
  c.cpu_bytes = 2'000'000'000'000ull;
  auto plain = MakePlan(model, c, ZeroBuffers{});
  c.tensor_parallel = 2;
  c.pipeline_parallel = 2;
  auto mp = MakePlan(model, c, ZeroBuffers{});
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
  auto plan = MakePlan(model, c, ZeroBuffers{});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("--tp 3"), std::string::npos);
  model.params = 0;
  EXPECT_NE(MakePlan(model, OneSmallGpu(), ZeroBuffers{}).status().message().find("--params"),
            std::string::npos);
}

TEST(MemoryPlannerTest, NothingFitsSaysWhatToChange) {
  ModelSpec model;
  model.params = 1'000'000'000'000ull;
  auto plan = MakePlan(model, OneSmallGpu(), ZeroBuffers{});
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
  // DeepSpeed runs NVMe optimizer offload at stage 1/2 as CPU offload.
  c.zero.stage = 1;
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  EXPECT_EQ(StrategyForConfig(c), Strategy::kZero2Offload);
}

}  // namespace
}  // namespace strata
