#include "optimizer_cpu/hyperparams.h"

#include <cmath>
#include <initializer_list>
#include <limits>

#include "gtest/gtest.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "optimizer_cpu/step_spans.h"

namespace strata {
namespace {

TEST(HyperparamsTest, DefaultsAreValidForEveryKind) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kAdagrad,
                             OptimizerKind::kLion, OptimizerKind::kLamb}) {
    OptimizerHyperparams h;
    h.kind = kind;
    EXPECT_TRUE(ValidateOptimizerHyperparams(h).ok()) << OptimizerKindName(kind);
  }
  EXPECT_TRUE(ValidateOptimizerHyperparams(DefaultLionHyperparams()).ok());
}

TEST(HyperparamsTest, BadValuesAreInvalidArgumentNamingTheField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Bad {
    void (*mutate)(OptimizerHyperparams&);
    const char* field;
  };
  const Bad cases[] = {
      {[](OptimizerHyperparams& h) { h.lr = -1e-3; }, "lr"},
      {[](OptimizerHyperparams& h) { h.lr = std::numeric_limits<double>::infinity(); }, "lr"},
      {[](OptimizerHyperparams& h) { h.eps = -1; }, "eps"},
      {[](OptimizerHyperparams& h) { h.weight_decay = -0.1; }, "weight_decay"},
      {[](OptimizerHyperparams& h) { h.beta1 = 1.0; }, "beta1"},
      {[](OptimizerHyperparams& h) { h.beta1 = -0.1; }, "beta1"},
      {[](OptimizerHyperparams& h) { h.beta2 = 1.5; }, "beta2"},
      {[](OptimizerHyperparams& h) { h.lr_decay = -1; }, "lr_decay"},
      {[](OptimizerHyperparams& h) { h.initial_accumulator_value = -1; },
       "initial_accumulator_value"},
  };
  for (const Bad& bad : cases) {
    OptimizerHyperparams h;
    bad.mutate(h);
    const absl::Status s = ValidateOptimizerHyperparams(h);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.field;
    EXPECT_NE(s.message().find(bad.field), absl::string_view::npos) << s;
  }
  OptimizerHyperparams h;
  h.beta2 = nan;
  EXPECT_EQ(ValidateOptimizerHyperparams(h).code(), absl::StatusCode::kInvalidArgument);
  h = DefaultLionHyperparams();
  h.amsgrad = true;
  EXPECT_EQ(ValidateOptimizerHyperparams(h).code(), absl::StatusCode::kInvalidArgument);
}

TEST(HyperparamsTest, LambCoefficientsAndLayout) {
  OptimizerHyperparams h;
  h.kind = OptimizerKind::kLamb;
  EXPECT_EQ(h.max_coeff, 10.0);  // FusedLamb's defaults
  EXPECT_EQ(h.min_coeff, 0.01);
  const StateLayout layout = StateLayoutFor(h);
  EXPECT_TRUE(layout.exp_avg && layout.exp_avg_sq && !layout.max_exp_avg_sq);
  for (auto mutate : std::initializer_list<void (*)(OptimizerHyperparams&)>{
           [](OptimizerHyperparams& c) { c.max_coeff = -1; },
           [](OptimizerHyperparams& c) { c.min_coeff = std::nan(""); },
           [](OptimizerHyperparams& c) { c.min_coeff = 20; },
           [](OptimizerHyperparams& c) { c.amsgrad = true; },
           [](OptimizerHyperparams& c) { c.beta2 = 1; }}) {
    OptimizerHyperparams bad = h;
    mutate(bad);
    EXPECT_EQ(ValidateOptimizerHyperparams(bad).code(), absl::StatusCode::kInvalidArgument);
  }
  // Trust ratio: ||p|| / ||update||, clamped, 1 when a norm is 0.
  EXPECT_EQ(LambTrustRatio(h, {4.0, 1.0}), 2.0);
  EXPECT_EQ(LambTrustRatio(h, {1e4, 1.0}), 10.0);
  EXPECT_EQ(LambTrustRatio(h, {1.0, 1e6}), 0.01);
  EXPECT_EQ(LambTrustRatio(h, {0.0, 5.0}), 1.0);
  EXPECT_EQ(LambTrustRatio(h, {5.0, 0.0}), 1.0);
  EXPECT_TRUE(std::isnan(LambTrustRatio(h, {std::nan(""), 1.0})));
  // FusedLamb's step size: lr * sqrt(1 - b2^t) / (1 - b1^t).
  EXPECT_DOUBLE_EQ(LambStepSize(h, 2), 1e-3 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.81));
  EXPECT_EQ(LambApplyScalars(h, 2, 0.5).neg_step_size,
            static_cast<float>(-(LambStepSize(h, 2) * 0.5)));
  h.bias_correction = false;
  EXPECT_EQ(LambStepSize(h, 7), 1e-3);
}

TEST(CpuOptimizerTest, LambPassesRejectBadCalls) {
  auto opt = CpuOptimizer::Create(CpuOptimizerOptions{});
  ASSERT_TRUE(opt.ok());
  float p[3] = {1, 2, 3}, m[3] = {}, v[3] = {}, g[3] = {1, 1, 1};
  StepSpans s;
  s.size = 3;
  s.params = p;
  s.exp_avg = m;
  s.exp_avg_sq = v;
  s.grad = g;
  OptimizerHyperparams h;  // AdamW: the LAMB passes refuse it
  EXPECT_EQ((*opt)->LambMoments(h, 1, s).status().code(), absl::StatusCode::kInvalidArgument);
  h.kind = OptimizerKind::kLamb;
  EXPECT_EQ((*opt)->LambApply(h, 1, s, -1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->LambApply(h, 1, s, std::numeric_limits<double>::infinity()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->LambApply(h, 0, s, 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p[0], 1.0f);
  // Pass 2 reads no gradient.
  StepSpans no_grad = s;
  no_grad.grad = nullptr;
  EXPECT_EQ((*opt)->LambMoments(h, 1, no_grad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*opt)->LambApply(h, 1, no_grad, 1.0).ok());
  // A whole step moves the params.
  ASSERT_TRUE((*opt)->Step(h, 1, s).ok());
  EXPECT_NE(p[0], 1.0f);
}

TEST(HyperparamsTest, AdagradIgnoresBetas) {
  OptimizerHyperparams h;
  h.kind = OptimizerKind::kAdagrad;
  h.beta1 = 5;  // not used by Adagrad, so not an error
  EXPECT_TRUE(ValidateOptimizerHyperparams(h).ok());
}

TEST(HyperparamsTest, ParsesKindNames) {
  EXPECT_EQ(*ParseOptimizerKind("AdamW"), OptimizerKind::kAdamW);
  EXPECT_EQ(*ParseOptimizerKind("lion"), OptimizerKind::kLion);
  EXPECT_EQ(*ParseOptimizerKind("Lamb"), OptimizerKind::kLamb);
  EXPECT_NE(ParseOptimizerKind("sgd").status().message().find("lamb"), absl::string_view::npos);
  EXPECT_EQ(ParseOptimizerKind("sgd").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HyperparamsTest, StepScalarsFollowTorchFormulas) {
  OptimizerHyperparams h;
  h.kind = OptimizerKind::kAdamW;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  const StepScalars s = ComputeStepScalars(h, 3, 0.5f);
  EXPECT_EQ(s.neg_step_size, static_cast<float>(-1e-3 / (1 - std::pow(0.9, 3))));
  EXPECT_EQ(s.inv_bias_correction2_sqrt,
            static_cast<float>(1 / std::sqrt(1 - std::pow(0.999, 3))));
  EXPECT_EQ(s.decay_factor, static_cast<float>(1 - 1e-3 * 0.1));
  EXPECT_EQ(s.weight_decay, 0.0f);  // decoupled, not L2
  EXPECT_EQ(s.grad_scale, 0.5f);
  h.kind = OptimizerKind::kAdam;
  EXPECT_EQ(ComputeStepScalars(h, 3, 1).weight_decay, 0.1f);
  EXPECT_EQ(ComputeStepScalars(h, 3, 1).decay_factor, 1.0f);
  h.bias_correction = false;
  EXPECT_EQ(ComputeStepScalars(h, 3, 1).neg_step_size, -1e-3f);
  EXPECT_EQ(ComputeStepScalars(h, 3, 1).inv_bias_correction2_sqrt, 1.0f);
  h.kind = OptimizerKind::kAdagrad;
  h.lr_decay = 0.5;
  EXPECT_EQ(ComputeStepScalars(h, 3, 1).neg_step_size, static_cast<float>(-1e-3 / 2.0));
}

TEST(HyperparamsTest, FromDeepSpeedCopiesTheSection) {
  OptimizerConfig ds;
  ds.kind = OptimizerKind::kLion;
  ds.lr = 3e-4;
  ds.betas = {0.95, 0.98};
  ds.weight_decay = 0.2;
  const OptimizerHyperparams h = HyperparamsFromDeepSpeed(ds);
  EXPECT_EQ(h.kind, OptimizerKind::kLion);
  EXPECT_EQ(h.lr, 3e-4);
  EXPECT_EQ(h.beta1, 0.95);
  EXPECT_EQ(h.beta2, 0.98);
  EXPECT_EQ(h.weight_decay, 0.2);
}

TEST(StepSpansTest, MissingOrExtraSpansAreInvalidArgument) {
  float p[4] = {}, m[4] = {}, v[4] = {}, g[4] = {};
  uint16_t out[4] = {};
  OptimizerHyperparams adam;
  StepSpans s;
  s.size = 4;
  s.params = p;
  s.exp_avg = m;
  s.exp_avg_sq = v;
  s.grad = g;
  EXPECT_TRUE(ValidateStepSpans(adam, s).ok());
  StepSpans no_v = s;
  no_v.exp_avg_sq = nullptr;
  EXPECT_EQ(ValidateStepSpans(adam, no_v).code(), absl::StatusCode::kInvalidArgument);
  OptimizerHyperparams lion = DefaultLionHyperparams();
  EXPECT_EQ(ValidateStepSpans(lion, s).code(), absl::StatusCode::kInvalidArgument)
      << "Lion with an exp_avg_sq span is a caller bug";
  adam.amsgrad = true;
  EXPECT_EQ(ValidateStepSpans(adam, s).code(), absl::StatusCode::kInvalidArgument)
      << "amsgrad needs max_exp_avg_sq";
  adam.amsgrad = false;
  StepSpans half_out = s;
  half_out.param_out = out;
  EXPECT_EQ(ValidateStepSpans(adam, half_out).code(), absl::StatusCode::kInvalidArgument);
  half_out.param_out_dtype = DType::kFp32;
  EXPECT_EQ(ValidateStepSpans(adam, half_out).code(), absl::StatusCode::kInvalidArgument);
  half_out.param_out_dtype = DType::kBf16;
  EXPECT_TRUE(ValidateStepSpans(adam, half_out).ok());
  StepSpans empty;
  empty.exp_avg_sq = nullptr;
  EXPECT_TRUE(ValidateStepSpans(adam, empty).ok()) << "size 0 with null spans is fine";
}

TEST(CpuOptimizerTest, RejectsBadCallsWithoutWriting) {
  auto opt = CpuOptimizer::Create(CpuOptimizerOptions{});
  ASSERT_TRUE(opt.ok());
  float p[3] = {1, 2, 3}, m[3] = {}, v[3] = {}, g[3] = {1, 1, 1};
  StepSpans s;
  s.size = 3;
  s.params = p;
  s.exp_avg = m;
  s.exp_avg_sq = v;
  s.grad = g;
  OptimizerHyperparams h;
  EXPECT_EQ((*opt)->Step(h, 0, s).code(), absl::StatusCode::kInvalidArgument);
  h.lr = -1;
  EXPECT_EQ((*opt)->Step(h, 1, s).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ((*opt)->HasInfOrNan({nullptr, DType::kFp16, 5}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->ConvertToFp32(nullptr, DType::kBf16, p, 3).code(),
            absl::StatusCode::kInvalidArgument);
  CpuOptimizerOptions bad;
  bad.num_threads = 0;
  EXPECT_EQ(CpuOptimizer::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.num_threads = 1;
  bad.tile_elements = 0;
  EXPECT_EQ(CpuOptimizer::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuOptimizerTest, InitializeStateMatchesTorch) {
  auto opt = CpuOptimizer::Create(CpuOptimizerOptions{});
  ASSERT_TRUE(opt.ok());
  float p[5] = {}, sum[5] = {9, 9, 9, 9, 9};
  OptimizerHyperparams h;
  h.kind = OptimizerKind::kAdagrad;
  h.initial_accumulator_value = 0.25;
  StepSpans s;
  s.size = 5;
  s.params = p;
  s.exp_avg = sum;
  ASSERT_TRUE((*opt)->InitializeState(h, s).ok());
  for (float x : sum) EXPECT_EQ(x, 0.25f);
}

}  // namespace
}  // namespace strata
