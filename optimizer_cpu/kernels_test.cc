// Every compiled Highway target against the scalar reference, bit for bit:
// all algorithms, gradient dtypes and 16-bit outputs, lengths 0..1000 with
// unaligned starts, and edge values (zeros, denormals, huge, inf, NaN).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "optimizer_cpu/half.h"
#include "optimizer_cpu/reference_optimizer.h"

namespace strata {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Equal bits, or both NaN (fp32 NaN payloads are not part of the contract).
::testing::AssertionResult SameFloat(float a, float b) {
  if (Bits(a) == Bits(b) || (std::isnan(a) && std::isnan(b))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << a << " (0x" << std::hex << Bits(a) << ") vs " << b
                                       << " (0x" << Bits(b) << ")";
}

// Values that stress the update: zeros of both signs, fp32 and fp16
// denormals, values near the fp16/bf16 rounding and overflow boundaries,
// huge values, infinities and NaN.
std::vector<float> EdgeValues() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,     -0.0f,   1e-45f,   -1e-40f, 1e-38f,   6e-8f,    -3e-8f,  1e-5f,
          0.5f,     -1.0f,   1.00049f, 65504.f, 65519.f,  -65520.f, 1e5f,    3e38f,
          -3e38f,   inf,     -inf,     std::numeric_limits<float>::quiet_NaN(), 1.0f + 0x1p-8f,
          2.0f + 0x1p-7f};
}

CpuOptimizerOptions Options(int threads, size_t tile) {
  CpuOptimizerOptions options;
  options.num_threads = threads;
  options.tile_elements = tile;
  return options;
}

struct Buffers {
  std::vector<float> params, exp_avg, exp_avg_sq, max_sq;
  std::vector<uint8_t> grad;  // raw bytes of the gradient dtype
  std::vector<uint16_t> out;
};

// Fills buffers of n + offset elements; spans start at `offset` so that the
// kernels see every alignment.
Buffers MakeBuffers(size_t n, size_t offset, DType grad_dtype, bool edges, std::mt19937& rng) {
  Buffers b;
  const size_t total = n + offset;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const std::vector<float> edge = EdgeValues();
  auto value = [&](float scale) {
    if (edges && uniform(rng) < 0.3f) return edge[rng() % edge.size()];
    return normal(rng) * scale;
  };
  b.params.resize(total);
  b.exp_avg.resize(total);
  b.exp_avg_sq.resize(total);
  b.max_sq.resize(total);
  b.out.assign(total, 0xAAAA);
  std::vector<float> g(total);
  for (size_t i = 0; i < total; ++i) {
    b.params[i] = value(1.0f);
    b.exp_avg[i] = value(0.1f);
    b.exp_avg_sq[i] = std::fabs(value(0.01f));
    b.max_sq[i] = std::fabs(value(0.01f));
    g[i] = value(1.0f);
  }
  b.grad.resize(total * DTypeSize(grad_dtype));
  for (size_t i = 0; i < total; ++i) ReferenceStore(g[i], b.grad.data(), grad_dtype, i);
  return b;
}

StepSpans SpansOf(Buffers& b, const OptimizerHyperparams& config, size_t n, size_t offset,
                  DType grad_dtype, std::optional<DType> out_dtype) {
  const StateLayout layout = StateLayoutFor(config);
  StepSpans s;
  s.size = n;
  s.params = b.params.data() + offset;
  s.exp_avg = b.exp_avg.data() + offset;
  s.exp_avg_sq = layout.exp_avg_sq ? b.exp_avg_sq.data() + offset : nullptr;
  s.max_exp_avg_sq = layout.max_exp_avg_sq ? b.max_sq.data() + offset : nullptr;
  s.grad = b.grad.data() + offset * DTypeSize(grad_dtype);
  s.grad_dtype = grad_dtype;
  if (out_dtype) {
    s.param_out = b.out.data() + offset;
    s.param_out_dtype = out_dtype;
  }
  return s;
}

struct Case {
  OptimizerHyperparams config;
  DType grad_dtype;
  std::optional<DType> out_dtype;
  float grad_scale;
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kAdagrad,
                             OptimizerKind::kLion, OptimizerKind::kLamb}) {
    for (int variant = 0; variant < 4; ++variant) {
      OptimizerHyperparams c = kind == OptimizerKind::kLion ? DefaultLionHyperparams() : OptimizerHyperparams{};
      c.kind = kind;
      c.weight_decay = (variant & 1) ? 0.01 : 0.0;
      c.maximize = variant == 3;
      c.amsgrad = (variant & 2) && (kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW);
      c.bias_correction = variant != 2;
      c.lr_decay = kind == OptimizerKind::kAdagrad && variant == 2 ? 0.01 : 0.0;
      if (kind == OptimizerKind::kLamb) {
        // eps under the root; trust ratios clamped from below and above
        // (||p|| / ||update|| is near 1 for these buffers).
        c.eps_inside_sqrt = variant == 2;
        if (variant == 1) c.min_coeff = 3.0;
        if (variant == 3) c.max_coeff = 0.5;
      }
      for (DType g : {DType::kFp32, DType::kFp16, DType::kBf16}) {
        for (std::optional<DType> out :
             {std::optional<DType>(), std::optional<DType>(DType::kFp16),
              std::optional<DType>(DType::kBf16)}) {
          cases.push_back({c, g, out, variant == 1 ? 0.25f : 1.0f});
        }
      }
    }
  }
  return cases;
}

class KernelTargetTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    hwy::SetSupportedTargetsForTest(GetParam());
    ASSERT_STREQ(CpuOptimizer::KernelTarget(), hwy::TargetName(GetParam()))
        << "dispatch did not switch to the target under test";
    auto opt = CpuOptimizer::Create(Options(1, 32768));
    ASSERT_TRUE(opt.ok()) << opt.status();
    optimizer_ = std::move(*opt);
  }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }

  // Runs `c` through the kernels and the reference on identical copies and
  // compares every output bit for bit.
  void CheckCase(const Case& c, size_t n, size_t offset, bool edges, std::mt19937& rng,
                 int64_t step) {
    SCOPED_TRACE(testing::Message()
                 << OptimizerKindName(c.config.kind) << " n=" << n << " offset=" << offset
                 << " grad=" << DTypeName(c.grad_dtype) << " out="
                 << (c.out_dtype ? DTypeName(*c.out_dtype) : "none") << " wd="
                 << c.config.weight_decay << " amsgrad=" << c.config.amsgrad
                 << " maximize=" << c.config.maximize << " edges=" << edges);
    Buffers ours = MakeBuffers(n, offset, c.grad_dtype, edges, rng);
    Buffers ref = ours;
    ASSERT_TRUE(optimizer_
                    ->Step(c.config, step,
                           SpansOf(ours, c.config, n, offset, c.grad_dtype, c.out_dtype),
                           c.grad_scale)
                    .ok());
    ASSERT_TRUE(ReferenceStep(c.config, step,
                              SpansOf(ref, c.config, n, offset, c.grad_dtype, c.out_dtype),
                              c.grad_scale)
                    .ok());
    for (size_t i = 0; i < n + offset; ++i) {
      ASSERT_TRUE(SameFloat(ours.params[i], ref.params[i])) << "param " << i;
      ASSERT_TRUE(SameFloat(ours.exp_avg[i], ref.exp_avg[i])) << "exp_avg " << i;
      ASSERT_TRUE(SameFloat(ours.exp_avg_sq[i], ref.exp_avg_sq[i])) << "exp_avg_sq " << i;
      ASSERT_TRUE(SameFloat(ours.max_sq[i], ref.max_sq[i])) << "max_exp_avg_sq " << i;
      // The fused 16-bit write is exactly the conversion of our fp32 param
      // (whose NaNs keep their sign); against the reference, equal or both
      // NaN, since the sign of a NaN born from two NaN operands depends on
      // operand order, which compilers may swap.
      if (c.out_dtype && i >= offset) {
        std::vector<uint16_t> expected(1);
        ReferenceStore(ours.params[i], expected.data(), *c.out_dtype, 0);
        ASSERT_EQ(ours.out[i], expected[0]) << "param_out " << i << " vs our fp32 param";
        const float ours_out = ReferenceLoad(ours.out.data(), *c.out_dtype, i);
        const float ref_out = ReferenceLoad(ref.out.data(), *c.out_dtype, i);
        ASSERT_TRUE(ours.out[i] == ref.out[i] || (std::isnan(ours_out) && std::isnan(ref_out)))
            << "param_out " << i << ": " << ours.out[i] << " vs " << ref.out[i];
      } else {
        ASSERT_EQ(ours.out[i], ref.out[i]) << "param_out " << i << " outside the span";
      }
    }
  }

  std::unique_ptr<CpuOptimizer> optimizer_;
};

TEST_P(KernelTargetTest, EveryLengthAndAlignmentMatchesReference) {
  std::mt19937 rng(301);
  const std::vector<Case> cases = AllCases();
  for (size_t n = 0; n <= 1000; ++n) {
    // Rotate through the cases so that all of them meet many lengths, offsets
    // and tails, with a step number that is not always 1.
    const Case& c = cases[(n * 7) % cases.size()];
    CheckCase(c, n, n % 9, /*edges=*/false, rng, 1 + static_cast<int64_t>(n % 5));
    if (HasFatalFailure()) return;
  }
}

TEST_P(KernelTargetTest, EveryCaseMatchesReferenceAtVectorBoundaries) {
  std::mt19937 rng(302);
  for (const Case& c : AllCases()) {
    for (size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{67}}) {
      CheckCase(c, n, 3, /*edges=*/false, rng, 3);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(KernelTargetTest, EdgeValuesMatchReference) {
  std::mt19937 rng(303);
  for (const Case& c : AllCases()) {
    for (size_t n : {size_t{5}, size_t{64}, size_t{301}}) {
      CheckCase(c, n, n % 4, /*edges=*/true, rng, 2);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(KernelTargetTest, Fp16AndBf16ToFp32MatchReferenceForEveryBitPattern) {
  std::vector<uint16_t> all(65536 + 3);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i - 3);
  for (DType dtype : {DType::kFp16, DType::kBf16}) {
    std::vector<float> out(all.size());
    ASSERT_TRUE(optimizer_->ConvertToFp32(all.data() + 3, dtype, out.data() + 3, 65536).ok());
    for (size_t i = 3; i < all.size(); ++i) {
      ASSERT_TRUE(SameFloat(out[i], ReferenceLoad(all.data(), dtype, i)))
          << DTypeName(dtype) << " bits 0x" << std::hex << all[i];
      ASSERT_EQ(std::isnan(out[i]), std::isnan(ReferenceLoad(all.data(), dtype, i)));
    }
  }
}

TEST_P(KernelTargetTest, Fp32ToFp16AndBf16MatchReference) {
  std::mt19937 rng(304);
  std::vector<float> src;
  for (float e : EdgeValues()) {
    src.push_back(e);
    src.push_back(std::nextafter(e, 0.0f));
  }
  // fp16 rounding ties and the subnormal boundary, in both signs.
  for (uint32_t base : {0x3F800000u, 0x38800000u, 0x33800000u, 0x477FE000u}) {
    for (uint32_t low : {0x0FFFu, 0x1000u, 0x1001u, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u, 0x18000u}) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t u = (base | low) ^ sign;
        float f;
        std::memcpy(&f, &u, 4);
        src.push_back(f);
      }
    }
  }
  // NaNs with payloads, then random bit patterns (every exponent).
  for (uint32_t u : {0x7FC12345u, 0xFFA00001u, 0x7F800001u}) {
    float f;
    std::memcpy(&f, &u, 4);
    src.push_back(f);
  }
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &u, 4);
    src.push_back(f);
  }
  for (DType dtype : {DType::kFp16, DType::kBf16}) {
    std::vector<uint16_t> out(src.size() + 1);
    ASSERT_TRUE(optimizer_->ConvertFromFp32(src.data() + 1, out.data() + 1, dtype, src.size() - 1)
                    .ok());
    for (size_t i = 1; i < src.size(); ++i) {
      std::vector<uint16_t> expected(1);
      ReferenceStore(src[i], expected.data(), dtype, 0);
      ASSERT_EQ(out[i], expected[0]) << DTypeName(dtype) << " of 0x" << std::hex << Bits(src[i]);
    }
  }
}

TEST_P(KernelTargetTest, HasInfOrNanFindsEveryPosition) {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{129}}) {
      std::vector<uint8_t> buf((n + 2) * 4);
      for (size_t i = 0; i < n + 2; ++i) ReferenceStore(65000.0f * (i % 2 ? -1 : 1), buf.data(), dtype, i);
      GradView view{buf.data() + DTypeSize(dtype), dtype, n};
      ASSERT_FALSE(*optimizer_->HasInfOrNan(view)) << DTypeName(dtype) << " n=" << n;
      for (size_t bad = 0; bad < n; ++bad) {
        for (float v : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
          std::vector<uint8_t> copy = buf;
          ReferenceStore(v, copy.data(), dtype, bad + 1);
          GradView bad_view{copy.data() + DTypeSize(dtype), dtype, n};
          ASSERT_TRUE(*optimizer_->HasInfOrNan(bad_view))
              << DTypeName(dtype) << " n=" << n << " at " << bad;
          ASSERT_TRUE(ReferenceHasInfOrNan(bad_view));
        }
      }
      // Outside the span does not count.
      std::vector<uint8_t> copy = buf;
      ReferenceStore(inf, copy.data(), dtype, 0);
      ReferenceStore(inf, copy.data(), dtype, n + 1);
      ASSERT_FALSE(*optimizer_->HasInfOrNan({copy.data() + DTypeSize(dtype), dtype, n}));
    }
  }
}

TEST_P(KernelTargetTest, SquaredL2NormMatchesReference) {
  std::mt19937 rng(305);
  for (DType dtype : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{1000}, size_t{100003}}) {
      Buffers b = MakeBuffers(n, 1, dtype, false, rng);
      const GradView view{b.grad.data() + DTypeSize(dtype), dtype, n};
      const double expected = ReferenceSquaredL2Norm(view);
      const double got = *optimizer_->SquaredL2Norm(view);
      // Both sum exact squares in double, in different orders.
      EXPECT_NEAR(got, expected, 1e-13 * expected + 1e-300) << DTypeName(dtype) << " n=" << n;
    }
  }
}

// LAMB's first pass alone: the norms and moments, bit for bit, over lengths
// that cross the 16-lane groups and the 32Ki-element blocks, and a tensor
// stepped as two ranges (as the daemon does with sub-groups).
TEST_P(KernelTargetTest, LambNormsAndRangesMatchReference) {
  std::mt19937 rng(307);
  OptimizerHyperparams c;
  c.kind = OptimizerKind::kLamb;
  c.weight_decay = 0.01;
  for (DType g : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}, size_t{32768}, size_t{70001}}) {
      SCOPED_TRACE(testing::Message() << "grad=" << DTypeName(g) << " n=" << n);
      Buffers ours = MakeBuffers(n, 1, g, false, rng);
      Buffers ref = ours;
      auto norms = optimizer_->LambMoments(c, 2, SpansOf(ours, c, n, 1, g, DType::kFp16), 0.5f);
      ASSERT_TRUE(norms.ok()) << norms.status();
      auto expected = ReferenceLambMoments(c, 2, SpansOf(ref, c, n, 1, g, DType::kFp16), 0.5f);
      ASSERT_TRUE(expected.ok());
      EXPECT_EQ(norms->param_sq, expected->param_sq);
      EXPECT_EQ(norms->update_sq, expected->update_sq);
      ASSERT_EQ(ours.exp_avg, ref.exp_avg);
      ASSERT_EQ(ours.exp_avg_sq, ref.exp_avg_sq);
      // Two ranges of one tensor: norms added, one ratio, applied per range.
      const size_t half = n / 3;
      StepSpans all = SpansOf(ours, c, n, 1, g, DType::kFp16);
      StepSpans lo = all, hi = all;
      lo.size = half;
      hi.size = n - half;
      hi.params += half;
      hi.exp_avg += half;
      hi.exp_avg_sq += half;
      hi.grad = static_cast<const uint8_t*>(hi.grad) + half * DTypeSize(g);
      hi.param_out = static_cast<uint16_t*>(hi.param_out) + half;
      StepSpans all_ref = SpansOf(ref, c, n, 1, g, DType::kFp16);
      LambNorms sum = *optimizer_->LambMoments(c, 3, lo);
      sum += *optimizer_->LambMoments(c, 3, hi);
      const double ratio = LambTrustRatio(c, sum);
      ASSERT_TRUE(optimizer_->LambApply(c, 3, lo, ratio).ok());
      ASSERT_TRUE(optimizer_->LambApply(c, 3, hi, ratio).ok());
      StepSpans ref_lo = all_ref, ref_hi = all_ref;
      ref_lo.size = half;
      ref_hi = hi;  // same offsets, into the reference's buffers
      ref_hi.params = ref.params.data() + 1 + half;
      ref_hi.exp_avg = ref.exp_avg.data() + 1 + half;
      ref_hi.exp_avg_sq = ref.exp_avg_sq.data() + 1 + half;
      ref_hi.grad = ref.grad.data() + (1 + half) * DTypeSize(g);
      ref_hi.param_out = ref.out.data() + 1 + half;
      LambNorms ref_sum = *ReferenceLambMoments(c, 3, ref_lo);
      ref_sum += *ReferenceLambMoments(c, 3, ref_hi);
      ASSERT_EQ(sum.param_sq, ref_sum.param_sq);
      ASSERT_EQ(sum.update_sq, ref_sum.update_sq);
      ASSERT_TRUE(ReferenceLambApply(c, 3, ref_lo, ratio).ok());
      ASSERT_TRUE(ReferenceLambApply(c, 3, ref_hi, ratio).ok());
      for (size_t i = 0; i < n + 1; ++i) {
        ASSERT_TRUE(SameFloat(ours.params[i], ref.params[i])) << "param " << i;
        ASSERT_EQ(ours.out[i], ref.out[i]) << "param_out " << i;
      }
    }
  }
}

std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) {
  return hwy::TargetName(info.param);
}

// The daemon's ZeRO-Infinity job steps a shard while other gradients are
// still coming in and writes its new 16-bit params over the gradient
// (daemon/infinity_pipeline.h): param_out == grad, elements of one size.
// Every element's gradient is read before its param is written, on every
// target, at every tail, with threads cutting the span into tiles.
TEST_P(KernelTargetTest, ParamOutOverTheGradientMatchesSeparateBuffers) {
  std::mt19937 rng(307);
  std::vector<std::unique_ptr<CpuOptimizer>> optimizers;
  for (int threads : {1, 3}) {
    auto opt = CpuOptimizer::Create(Options(threads, threads == 1 ? 32768 : 64));
    ASSERT_TRUE(opt.ok()) << opt.status();
    optimizers.push_back(std::move(*opt));
  }
  int checked = 0;
  for (const Case& c : AllCases()) {
    if (!c.out_dtype || DTypeSize(c.grad_dtype) != DTypeSize(*c.out_dtype)) continue;
    for (const auto& opt : optimizers) {
      for (size_t n : {size_t{1}, size_t{17}, size_t{67}, size_t{1001}}) {
        SCOPED_TRACE(testing::Message() << OptimizerKindName(c.config.kind) << " n=" << n << " grad="
                                        << DTypeName(c.grad_dtype) << " out=" << DTypeName(*c.out_dtype));
        Buffers ours = MakeBuffers(n, 3, c.grad_dtype, /*edges=*/false, rng);
        Buffers ref = ours;
        StepSpans in_place = SpansOf(ours, c.config, n, 3, c.grad_dtype, c.out_dtype);
        in_place.param_out = const_cast<void*>(in_place.grad);
        ASSERT_TRUE(opt->Step(c.config, 2, in_place, c.grad_scale).ok());
        ASSERT_TRUE(opt->Step(c.config, 2, SpansOf(ref, c.config, n, 3, c.grad_dtype, c.out_dtype), c.grad_scale)
                        .ok());
        ASSERT_EQ(std::memcmp(ours.params.data(), ref.params.data(), 4 * (n + 3)), 0);
        ASSERT_EQ(std::memcmp(ours.exp_avg.data(), ref.exp_avg.data(), 4 * (n + 3)), 0);
        ASSERT_EQ(std::memcmp(ours.exp_avg_sq.data(), ref.exp_avg_sq.data(), 4 * (n + 3)), 0);
        ASSERT_EQ(std::memcmp(ours.max_sq.data(), ref.max_sq.data(), 4 * (n + 3)), 0);
        // The gradient's bytes are now the params, as the separate output got them.
        ASSERT_EQ(std::memcmp(ours.grad.data() + 3 * 2, ref.out.data() + 3, 2 * n), 0);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(AllTargets, KernelTargetTest,
                         ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         TargetParamName);

// The tiles of a multi-threaded optimizer cover the span exactly once.
TEST(CpuOptimizerTilingTest, ThreadsAndTilesDoNotChangeResults) {
  std::mt19937 rng(306);
  for (int threads : {1, 2, 3}) {
    for (size_t tile : {size_t{1}, size_t{64}, size_t{1000}, size_t{32768}}) {
      auto opt = CpuOptimizer::Create(Options(threads, tile));
      ASSERT_TRUE(opt.ok());
      for (const Case& c : AllCases()) {
        if (c.grad_dtype != DType::kBf16) continue;
        const size_t n = 4099;
        Buffers ours = MakeBuffers(n, 1, c.grad_dtype, false, rng);
        Buffers ref = ours;
        ASSERT_TRUE((*opt)->Step(c.config, 4, SpansOf(ours, c.config, n, 1, c.grad_dtype,
                                                      c.out_dtype), c.grad_scale).ok());
        ASSERT_TRUE(ReferenceStep(c.config, 4, SpansOf(ref, c.config, n, 1, c.grad_dtype,
                                                       c.out_dtype), c.grad_scale).ok());
        ASSERT_EQ(std::memcmp(ours.params.data(), ref.params.data(), 4 * (n + 1)), 0);
        ASSERT_EQ(std::memcmp(ours.exp_avg.data(), ref.exp_avg.data(), 4 * (n + 1)), 0);
        ASSERT_EQ(std::memcmp(ours.exp_avg_sq.data(), ref.exp_avg_sq.data(), 4 * (n + 1)), 0);
        ASSERT_EQ(ours.out, ref.out);
      }
      std::vector<float> g(100001);
      for (float& x : g) x = std::normal_distribution<float>()(rng);
      const GradView view{g.data(), DType::kFp32, g.size()};
      const double expected = ReferenceSquaredL2Norm(view);
      EXPECT_NEAR(*(*opt)->SquaredL2Norm(view), expected, 1e-13 * expected);
    }
  }
}

}  // namespace
}  // namespace strata
