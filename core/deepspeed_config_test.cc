#include "core/deepspeed_config.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

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
  // DeepSpeed 0.19.8 reads only intra_op_parallelism; thread_count is ignored.
  EXPECT_EQ(c->aio.intra_op_parallelism, 1u);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("'aio.thread_count'"), std::string::npos) << c->warnings[0];
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
  EXPECT_FALSE(c->gradient_clipping_given);
  EXPECT_TRUE(c->warnings.empty()) << c->warnings[0];
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
  // DeepSpeed 0.19.8's defaults that older versions did not have.
  EXPECT_TRUE(c->zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(c->zero.offload_param.pin_memory);
  // Absent clipping is DeepSpeed 0.19.8's default: clip at 1.0.
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 1.0);
  EXPECT_FALSE(c->gradient_clipping_given);
  EXPECT_EQ(c->tensor_parallel_autotp_size, 0u);
  // {} names no batch size: DeepSpeed refuses it at initialize, strata warns.
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("train_batch_size"), std::string::npos);
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
  EXPECT_EQ(lion->optimizer->kind, OptimizerKind::kLion);
  EXPECT_DOUBLE_EQ(lion->optimizer->betas[1], 0.999);  // FusedLion's default
}

TEST(DeepSpeedConfigTest, UnknownTopLevelKeysWarnUnknownSectionKeysAreErrors) {
  // DeepSpeed ignores a top-level key it does not read ...
  auto c = ParseDeepSpeedConfig(R"({"train_batch_size": 8, "foo": 1})");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("'foo'"), std::string::npos);
  // ... but its pydantic sections forbid extra keys.
  auto typo = ParseDeepSpeedConfig(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage3_prefetch_bukcet_size": 5}})");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("'zero_optimization.stage3_prefetch_bukcet_size'"),
            std::string::npos)
      << typo.status();
  // "auto" is dropped before the check, as DeepSpeedConfigModel drops it.
  EXPECT_TRUE(ParseDeepSpeedConfig(R"({"train_batch_size": 8, "fp16": {"whatever": "auto"}})").ok());
}

TEST(DeepSpeedConfigTest, KeysDeepSpeedKnowsAreNotWarnedAbout) {
  auto c = ParseDeepSpeedConfig(R"({
    "train_batch_size": 8, "steps_per_print": 10, "wall_clock_breakdown": false,
    "tensor_parallel": {"autotp_size": 4}, "compile": {"deepcompile": false},
    "bfloat16": {"enabled": true}, "data_efficiency": {"enabled": false},
    "zero_optimization": {"stage": 3, "max_live_parameters": 7, "max_reuse_distance": 8,
                          "gather_16bit_weights_on_model_save": true,
                          "param_persistence_threshold": 9, "prefetch_bucket_size": 10}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tensor_parallel_autotp_size, 4u);
  EXPECT_TRUE(c->bf16_enabled);
  EXPECT_EQ(c->zero.stage3_max_live_parameters, 7u);
  EXPECT_EQ(c->zero.stage3_max_reuse_distance, 8u);
  EXPECT_TRUE(c->zero.gather_16bit_weights_on_model_save);
  EXPECT_EQ(c->zero.stage3_param_persistence_threshold, 9u);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 10u);
  // bfloat16 is bf16's old name, which DeepSpeed reads without a word.
  EXPECT_TRUE(c->warnings.empty()) << c->warnings[0];
  // Both spellings of one field at once: pydantic refuses.
  EXPECT_FALSE(ParseDeepSpeedConfig(
                   R"({"zero_optimization": {"max_live_parameters": 7, "stage3_max_live_parameters": 8}})")
                   .ok());
}

TEST(DeepSpeedConfigTest, RemovedKeysAreRefusedAsDeepSpeedRefusesThem) {
  for (const char* key : {"progressive_layer_drop", "curriculum_learning", "sparse_attention", "amp",
                          "elasticity"}) {
    auto c = ParseDeepSpeedConfig(absl::StrCat(R"({"train_batch_size": 8, ")", key, R"(": {}})"));
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_NE(c.status().message().find(key), std::string::npos) << c.status();
  }
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"zero_optimization": {"mics_shard_size": 2}})").ok());
}

TEST(DeepSpeedConfigTest, OptimizersDeepSpeedAcceptsAreRead) {
  for (const char* type : {"Lamb", "LAMB", "OneBitAdam", "OneBitLamb", "ZeroOneAdam", "MuAdam",
                           "MuAdamW", "MuSGD", "SGD", "RMSprop", "Adafactor", "sgd"}) {
    auto c = ParseDeepSpeedConfig(absl::StrCat(R"({"train_batch_size": 8, "optimizer": {"type": ")",
                                               type, R"(", "params": {"lr": 0.1}}})"));
    ASSERT_TRUE(c.ok()) << type << ": " << c.status();
    ASSERT_TRUE(c->optimizer.has_value());
    EXPECT_EQ(c->optimizer->type, type);
    EXPECT_DOUBLE_EQ(c->optimizer->lr, 0.1);
    const bool lamb = absl::AsciiStrToLower(type) == "lamb";
    EXPECT_EQ(c->optimizer->kind, lamb ? OptimizerKind::kLamb : OptimizerKind::kOther) << type;
  }
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kLamb), "lamb");
  // A name neither DeepSpeed nor torch.optim has: accepted (DeepSpeed's
  // parser accepts any string), with a warning.
  auto unknown = ParseDeepSpeedConfig(R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}})");
  ASSERT_TRUE(unknown.ok());
  ASSERT_EQ(unknown->warnings.size(), 1u);
  EXPECT_NE(unknown->warnings[0].find("OneBitAdam"), std::string::npos);
  // Params DeepSpeed hands to the optimizer unchecked: recorded as unusable.
  auto bad = ParseDeepSpeedConfig(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": "x", "betas": [0.9]}}})");
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->optimizer->unusable.size(), 2u);
  // What DeepSpeed's parser itself refuses.
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"optimizer": {"type": 5}})").ok());
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"optimizer": null})").ok());
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"optimizer": {"type": "Adam", "params": [1]}})").ok());
  EXPECT_FALSE(
      ParseDeepSpeedConfig(R"({"optimizer": {"type": "Adam", "params": {"max_grad_norm": "1"}}})").ok());
}

TEST(DeepSpeedConfigTest, ZerosAndCoercionsAsPydanticReadsThem) {
  auto c = ParseDeepSpeedConfig(R"({"train_batch_size": 8, "zero_optimization": {
      "stage": "3", "sub_group_size": 0, "allgather_bucket_size": 0, "overlap_comm": "no",
      "reduce_bucket_size": "1_000", "stage3_prefetch_bucket_size": 2e3,
      "offload_param": {"device": "cpu", "buffer_count": 0, "buffer_size": 0, "max_in_cpu": 0,
                        "pin_memory": "false"},
      "offload_optimizer": {"device": "cpu", "buffer_count": 0, "ratio": "0.5"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.stage, 3);
  EXPECT_EQ(c->zero.sub_group_size, 0u);
  EXPECT_EQ(c->zero.allgather_bucket_size, 0u);
  EXPECT_FALSE(c->zero.overlap_comm);
  EXPECT_EQ(c->zero.reduce_bucket_size, 1000u);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 2000u);
  EXPECT_EQ(c->zero.offload_param.buffer_count, 0u);
  EXPECT_EQ(c->zero.offload_param.buffer_size, 0u);
  EXPECT_FALSE(c->zero.offload_param.pin_memory);
  EXPECT_DOUBLE_EQ(c->zero.offload_optimizer.ratio, 0.5);
  // What pydantic refuses: reduce_bucket_size 0 (gt=0), "5e8" as an int,
  // a fraction, "CPU" (enum values are exact), a null for a plain field.
  for (const char* zero : {R"({"reduce_bucket_size": 0})", R"({"reduce_bucket_size": "5e8"})",
                           R"({"sub_group_size": 2.5})", R"({"offload_optimizer": {"device": "CPU"}})",
                           R"({"stage": null})", R"({"overlap_comm": 2})", R"({"sub_group_size": -1})"}) {
    EXPECT_FALSE(ParseDeepSpeedConfig(absl::StrCat(R"({"zero_optimization": )", zero, "}")).ok()) << zero;
  }
}

TEST(DeepSpeedConfigTest, LegacyFormsMapAsDeepSpeedMapsThem) {
  auto on = ParseDeepSpeedConfig(R"({"train_batch_size": 8, "zero_optimization": true})");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->zero.stage, 1);
  auto off = ParseDeepSpeedConfig(R"({"train_batch_size": 8, "zero_optimization": false})");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->zero.stage, 0);
  auto param = ParseDeepSpeedConfig(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "cpu_offload_param": true, "cpu_offload": true}})");
  ASSERT_TRUE(param.ok()) << param.status();
  EXPECT_EQ(param->zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_EQ(param->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(param->zero.offload_param.pin_memory);
  // Old key and its replacement together: DeepSpeed refuses.
  EXPECT_FALSE(ParseDeepSpeedConfig(
                   R"({"zero_optimization": {"stage": 3, "cpu_offload_param": false, "offload_param": {}}})")
                   .ok());
  // cpu_offload_params (plural) was never a DeepSpeed 0.19.8 key: refused.
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"zero_optimization": {"cpu_offload_params": true}})").ok());
}

TEST(DeepSpeedConfigTest, SettingsDeepSpeedIgnoresAtThisStageWarn) {
  auto param = ParseDeepSpeedConfig(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
  ASSERT_TRUE(param.ok()) << param.status();
  EXPECT_EQ(param->zero.offload_param.device, OffloadDevice::kNone);
  EXPECT_TRUE(param->zero.offload_param.ignored);
  ASSERT_EQ(param->warnings.size(), 1u);
  auto nvme = ParseDeepSpeedConfig(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})");
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  EXPECT_EQ(nvme->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(nvme->zero.offload_optimizer.nvme_ran_as_cpu);
  ASSERT_EQ(nvme->warnings.size(), 1u);
  EXPECT_NE(nvme->warnings[0].find("runs as CPU offload"), std::string::npos);
  auto stage0 = ParseDeepSpeedConfig(
      R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})");
  ASSERT_TRUE(stage0.ok());
  EXPECT_EQ(stage0->zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_TRUE(stage0->zero.offload_optimizer.ignored);
}

TEST(DeepSpeedConfigTest, BatchSizesHoldForSomeWorldSize) {
  EXPECT_TRUE(ParseDeepSpeedConfig(
                  R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})")
                  .ok());
  EXPECT_FALSE(ParseDeepSpeedConfig(
                   R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})")
                   .ok());
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"train_batch_size": 0})").ok());
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"train_batch_size": "4"})").ok());
}

TEST(DeepSpeedConfigTest, HostileInputIsAnErrorNeverACrash) {
  // 200k levels: refused by the flat scan before any JSON is built.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  auto c = ParseDeepSpeedConfig(deep);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("deeper than"), std::string::npos);
  const std::string deep_obj = absl::StrCat(R"({"zero_optimization": )", std::string(200000, '{'),
                                            std::string(200000, '}'), "}");
  EXPECT_EQ(ParseDeepSpeedConfig(deep_obj).status().code(), absl::StatusCode::kInvalidArgument);
  // Brackets inside strings do not count.
  EXPECT_TRUE(ParseDeepSpeedConfig(absl::StrCat(R"({"train_batch_size": 1, "x": ")",
                                                std::string(1000, '['), "\"}"))
                  .ok());
  // 1e400 is refused naming the key (nlohmann alone would say only
  // "number overflow"); under a key DeepSpeed ignores it is ignored.
  auto big = ParseDeepSpeedConfig(R"({"zero_optimization": {"reduce_bucket_size": 1e400}})");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("zero_optimization.reduce_bucket_size: 1e400"),
            std::string::npos)
      << big.status();
  auto clip = ParseDeepSpeedConfig(R"({"gradient_clipping": -1e400})");
  ASSERT_FALSE(clip.ok());
  EXPECT_NE(clip.status().message().find("gradient_clipping"), std::string::npos);
  // Anywhere else too: DeepSpeed's file loader (hjson) refuses it.
  auto elsewhere = ParseDeepSpeedConfig(R"({"train_batch_size": 1, "foo": {"bar": [0, -1E+999]}})");
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_NE(elsewhere.status().message().find("foo.bar[1]"), std::string::npos) << elsewhere.status();
  // Duplicate keys, invalid UTF-8, a bare scalar.
  EXPECT_FALSE(ParseDeepSpeedConfig(R"({"fp16": {}, "fp16": {}})").ok());
  EXPECT_FALSE(ParseDeepSpeedConfig("{\"a\": \"\xff\"}").ok());
  EXPECT_FALSE(ParseDeepSpeedConfig("5").ok());
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
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
       "needs stage 3"},
      {R"({"aio": [1]})", "aio"},
      {R"({"optimizer": {"type": ["Adam"]}})", "optimizer.type"},
      {R"({"fp16": {"enabled": true, "loss_scale_window": 0}})", "fp16.loss_scale_window"},
      {R"({"fp16": {"min_loss_scale": 0.5}})", "fp16.min_loss_scale"},
      {R"({"fp16": null})", "fp16"},
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "at most one"},
      {R"({"tensor_parallel": {"autotp_size": "two"}})", "tensor_parallel.autotp_size"},
      {R"({"gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}})", "gradient_allreduce_op"},
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
