#include "core/deepspeed_config.h"

#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

// As DeepSpeed's ZeRO-Offload tutorial writes it.
constexpr char kZero2Offload[] = R"json({
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 1.0,
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16,
           "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.9, 0.999],
                                            "eps": 1e-8, "weight_decay": 0.01}},
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "allgather_partitions": true,
    "allgather_bucket_size": 2e8,
    "overlap_comm": true,
    "reduce_scatter": true,
    "reduce_bucket_size": 2e8,
    "contiguous_gradients": true
  }
})json";

// As DeepSpeed's ZeRO-Infinity docs write it.
constexpr char kInfinity[] = R"json({
  "train_batch_size": 16,
  "bf16": {"enabled": true},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                          "buffer_count": 4, "fast_init": false},
    "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                      "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9},
    "sub_group_size": 1e9,
    "stage3_prefetch_bucket_size": 5e8,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_param_persistence_threshold": 1e6
  },
  "aio": {"block_size": 1048576, "queue_depth": 16, "thread_count": 2,
          "single_submit": false, "overlap_events": true}
})json";

// As the Hugging Face Trainer integration writes it, with "auto".
constexpr char kHfAuto[] = R"json({
  "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                            "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto"}},
  "zero_optimization": {
    "stage": 3, "overlap_comm": true, "contiguous_gradients": true,
    "sub_group_size": 1e9, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
})json";

TEST(DeepSpeedConfigTest, ReadsTheZeroOffloadTutorialConfig) {
  auto c = ParseDeepSpeedConfig(kZero2Offload);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.stage, 2);
  EXPECT_EQ(c->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c->zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c->zero.reduce_bucket_size, 200'000'000u);
  EXPECT_TRUE(c->fp16.enabled);
  EXPECT_EQ(c->fp16.initial_scale_power, 16);
  ASSERT_TRUE(c->optimizer.has_value());
  EXPECT_EQ(c->optimizer->kind, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(c->optimizer->lr, 3e-5);
  EXPECT_DOUBLE_EQ(c->optimizer->weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 1.0);
  EXPECT_EQ(c->train_micro_batch_size_per_gpu, 8u);
  EXPECT_EQ(c->gradient_accumulation_steps, 4u);
  EXPECT_TRUE(c->warnings.empty()) << c->warnings[0];
}

TEST(DeepSpeedConfigTest, ReadsTheInfinityConfigWithExponentNumbersAndOldNames) {
  auto c = ParseDeepSpeedConfig(kInfinity);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.stage, 3);
  EXPECT_TRUE(c->zero.overlap_comm);  // DeepSpeed's stage-3 default
  EXPECT_EQ(c->zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c->zero.offload_param.nvme_path, "/local_nvme");
  EXPECT_EQ(c->zero.offload_param.buffer_size, 100'000'000u);
  EXPECT_EQ(c->zero.offload_param.max_in_cpu, 1'000'000'000u);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 500'000'000u);
  EXPECT_EQ(c->zero.stage3_param_persistence_threshold, 1'000'000u);
  EXPECT_EQ(c->aio.queue_depth, 16u);
  EXPECT_EQ(c->aio.intra_op_parallelism, 2u);  // from thread_count
  EXPECT_TRUE(c->bf16_enabled);
  EXPECT_FALSE(c->optimizer.has_value());
}

TEST(DeepSpeedConfigTest, AcceptsAutoWhereTheHfIntegrationWritesIt) {
  auto c = ParseDeepSpeedConfig(kHfAuto);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->zero.reduce_bucket_size_auto);
  EXPECT_EQ(c->zero.reduce_bucket_size, 500'000'000u);  // DeepSpeed's default
  EXPECT_TRUE(c->zero.stage3_prefetch_bucket_size_auto);
  ASSERT_TRUE(c->optimizer.has_value());
  EXPECT_TRUE(c->optimizer->lr_auto);
  EXPECT_FALSE(c->train_micro_batch_size_per_gpu.has_value());
  EXPECT_TRUE(c->warnings.empty());
}

TEST(DeepSpeedConfigTest, MissingKeysTakeDeepSpeedDefaults) {
  auto c = ParseDeepSpeedConfig("{}");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->zero.stage, 0);
  EXPECT_EQ(c->zero.sub_group_size, 1'000'000'000u);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 50'000'000u);
  EXPECT_EQ(c->zero.stage3_param_persistence_threshold, 100'000u);
  EXPECT_EQ(c->zero.reduce_bucket_size, 500'000'000u);
  EXPECT_TRUE(c->zero.contiguous_gradients);
  EXPECT_FALSE(c->zero.overlap_comm);
  EXPECT_EQ(c->zero.offload_optimizer.buffer_count, 4u);
  EXPECT_EQ(c->zero.offload_param.buffer_count, 5u);
  EXPECT_EQ(c->aio.block_size, 1'048'576u);
  EXPECT_EQ(c->aio.queue_depth, 8u);
  EXPECT_EQ(c->fp16.loss_scale_window, 1000u);
  EXPECT_EQ(c->fp16.hysteresis, 2u);
  EXPECT_EQ(c->gradient_accumulation_steps, 1u);
}

TEST(DeepSpeedConfigTest, DeepSpeedAdamRunsInAdamWModeUnlessTurnedOff) {
  auto w = ParseDeepSpeedConfig(R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-4}}})");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->optimizer->kind, OptimizerKind::kAdamW);
  auto l2 = ParseDeepSpeedConfig(
      R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "amsgrad": true}}})");
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->optimizer->kind, OptimizerKind::kAdam);
  EXPECT_TRUE(l2->optimizer->amsgrad);
  auto lion = ParseDeepSpeedConfig(R"({"optimizer": {"type": "Lion"}})");
  ASSERT_TRUE(lion.ok());
  EXPECT_DOUBLE_EQ(lion->optimizer->betas[1], 0.99);
}

TEST(DeepSpeedConfigTest, UnknownKeysWarnWithTheirPath) {
  auto c = ParseDeepSpeedConfig(
      R"({"zero_optimization": {"stage": 1, "stage3_prefetch_bukcet_size": 5}, "foo": 1})");
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->warnings.size(), 2u);
  EXPECT_NE(c->warnings[0].find("'zero_optimization.stage3_prefetch_bukcet_size'"),
            std::string::npos);
  EXPECT_NE(c->warnings[1].find("'foo'"), std::string::npos);
}

struct BadConfig {
  const char* json;
  const char* must_mention;
};

TEST(DeepSpeedConfigTest, InvalidValuesNameTheKeyPathAndWhatIsAllowed) {
  const BadConfig cases[] = {
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage: 4 is not valid; expected one of 0, 1, 2, 3"},
      {R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": -5}})", "zero_optimization.reduce_bucket_size"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}})",
       "zero_optimization.offload_optimizer.device: \"gpu\" is not valid; expected one of \"none\", \"cpu\", \"nvme\""},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
       "zero_optimization.offload_param.nvme_path: required"},
      {R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", "requires stage 3"},
      {R"({"aio": {"block_size": 1000}})", "aio.block_size"},
      {R"({"aio": {"queue_depth": 0}})", "aio.queue_depth"},
      {R"({"optimizer": {"type": "SGD"}})", "optimizer.type"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})", "optimizer.params.betas"},
      {R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})", "optimizer.params.lr"},
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "enable at most one"},
      {R"({"zero_optimization": {"stage": "two"}})", "zero_optimization.stage"},
      {R"({"zero_optimization": [1, 2]})", "zero_optimization: expected a JSON object"},
      {R"({"zero_optimization": {"stage": 2,)", "not valid JSON"},
      {R"({"gradient_accumulation_steps": 2.5})", "gradient_accumulation_steps"},
  };
  for (const BadConfig& bad : cases) {
    auto c = ParseDeepSpeedConfig(bad.json);
    ASSERT_FALSE(c.ok()) << bad.json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad.json;
    EXPECT_NE(c.status().message().find(bad.must_mention), std::string::npos)
        << bad.json << " -> " << c.status().message();
  }
}

TEST(DeepSpeedConfigTest, MissingFileIsNotFoundNamingThePath) {
  auto c = LoadDeepSpeedConfigFile("/nonexistent/ds_config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/ds_config.json"), std::string::npos);
}

}  // namespace
}  // namespace strata
