#include "examples/deepspeed_configs.h"

#include "core/deepspeed_config.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

void ExpectFp32AdamW(const DeepSpeedConfig& config) {
  EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();
  ASSERT_TRUE(config.optimizer.has_value());
  EXPECT_EQ(config.optimizer->kind, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(config.optimizer->lr, 0.01);
  EXPECT_DOUBLE_EQ(config.optimizer->weight_decay, 0.01);
  // What keeps the daemon's step equal to local mode's.
  EXPECT_FALSE(config.fp16.enabled);
  EXPECT_FALSE(config.bf16_enabled);
  EXPECT_EQ(config.gradient_clipping, 0.0);
  EXPECT_EQ(config.train_micro_batch_size_per_gpu, 64u);
}

TEST(DeepSpeedConfigsTest, OffloadIsStage2WithTheOptimizerOnTheCpu) {
  auto config = ParseDeepSpeedConfig(OffloadDeepSpeedConfig(64));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->zero.stage, 2);
  EXPECT_EQ(config->zero.offload_optimizer.device, OffloadDevice::kCpu);
  ExpectFp32AdamW(*config);
}

TEST(DeepSpeedConfigsTest, InfinityIsStage3WithParamsAndStatesOnNvme) {
  auto config = ParseDeepSpeedConfig(InfinityDeepSpeedConfig(64, "/mnt/a \"b\"\\c"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->zero.stage, 3);
  EXPECT_EQ(config->zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(config->zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(config->zero.offload_param.nvme_path, "/mnt/a \"b\"\\c");
  ExpectFp32AdamW(*config);
}

}  // namespace
}  // namespace strata
