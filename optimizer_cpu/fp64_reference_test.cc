// Our fp32 kernels against an fp64 implementation of the same algorithms over
// 100 steps. The assertion is a derived forward-error bound, not a guessed
// tolerance: the fp64 run carries, beside each value, the largest error fp32
// rounding can have put into it (u = 2^-24 per rounding, including rounding
// the hyperparameters to float), propagated through the update the way the
// error of a sum or product propagates. The kernel must stay inside it.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "optimizer_cpu/cpu_optimizer.h"

namespace strata {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of fp32
constexpr int kSteps = 100;
constexpr size_t kN = 1000;

struct Fp64State {
  std::vector<double> p, m, v, vmax;
  // Error bounds of the fp32 values.
  std::vector<double> ep, em, ev, evmax;
  std::vector<bool> ambiguous;  // Lion: fp32 may have taken the other sign
};

class Fp64ReferenceTest : public ::testing::TestWithParam<int> {};

OptimizerHyperparams ConfigFor(int which) {
  OptimizerHyperparams h;
  switch (which) {
    case 0:
      h.kind = OptimizerKind::kAdam;
      h.weight_decay = 0.01;
      break;
    case 1:
      h.kind = OptimizerKind::kAdamW;
      h.weight_decay = 0.1;
      h.amsgrad = true;
      break;
    case 2:
      h.kind = OptimizerKind::kAdagrad;
      h.lr = 1e-2;
      h.lr_decay = 0.01;
      h.weight_decay = 0.01;
      h.initial_accumulator_value = 0.1;
      break;
    default:
      h = DefaultLionHyperparams();
      h.weight_decay = 0.5;
      break;
  }
  return h;
}

TEST_P(Fp64ReferenceTest, Fp32StaysWithinDerivedRoundingBoundOver100Steps) {
  const OptimizerHyperparams h = ConfigFor(GetParam());
  SCOPED_TRACE(OptimizerKindName(h.kind));
  std::mt19937 rng(401);
  std::normal_distribution<float> normal;
  std::vector<float> p(kN), m(kN), v(kN), vmax(kN), g(kN);
  for (float& x : p) x = normal(rng);
  Fp64State d;
  d.p.assign(p.begin(), p.end());
  d.m.assign(kN, 0.0);
  d.v.assign(kN, 0.0);
  d.vmax.assign(kN, 0.0);
  d.ep.assign(kN, 0.0);
  d.em.assign(kN, 0.0);
  d.ev.assign(kN, 0.0);
  d.evmax.assign(kN, 0.0);
  d.ambiguous.assign(kN, false);
  auto opt = CpuOptimizer::Create(CpuOptimizerOptions{});
  ASSERT_TRUE(opt.ok());
  const StateLayout layout = StateLayoutFor(h);
  StepSpans s;
  s.size = kN;
  s.params = p.data();
  s.exp_avg = m.data();
  s.exp_avg_sq = layout.exp_avg_sq ? v.data() : nullptr;
  s.max_exp_avg_sq = layout.max_exp_avg_sq ? vmax.data() : nullptr;
  s.grad = g.data();
  ASSERT_TRUE((*opt)->InitializeState(h, s).ok());
  if (h.kind == OptimizerKind::kAdagrad) {
    d.m.assign(kN, h.initial_accumulator_value);
    d.em.assign(kN, kU * h.initial_accumulator_value);
  }
  const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, wd = h.weight_decay, eps = h.eps;
  for (int t = 1; t <= kSteps; ++t) {
    for (float& x : g) x = normal(rng);
    ASSERT_TRUE((*opt)->Step(h, t, s).ok());
    for (size_t i = 0; i < kN; ++i) {
      const double gi = g[i];  // exact: the same fp32 gradient in both
      double& P = d.p[i];
      double& M = d.m[i];
      double& EP = d.ep[i];
      double& EM = d.em[i];
      switch (h.kind) {
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW: {
          double grad = gi, egrad = 0;
          if (h.kind == OptimizerKind::kAdam) {
            grad = gi + wd * P;  // 3 roundings on a sum of |g| + |wd p|
            egrad = wd * EP + 3 * kU * (std::fabs(gi) + std::fabs(wd * P));
          } else {
            const double decay = 1 - lr * wd;
            P *= decay;
            EP = EP * decay + 2 * kU * std::fabs(P);
          }
          M = b1 * M + (1 - b1) * grad;
          EM = b1 * EM + (1 - b1) * egrad +
               4 * kU * (b1 * std::fabs(M) + (1 - b1) * std::fabs(grad) + std::fabs(M));
          double& V = d.v[i];
          V = b2 * V + (1 - b2) * grad * grad;
          d.ev[i] = b2 * d.ev[i] + (1 - b2) * 2 * std::fabs(grad) * egrad + 6 * kU * V;
          double vhat = V, evhat = d.ev[i];
          if (h.amsgrad) {
            // fp32 compares values that carry errors: when V and the old max
            // are closer than their bounds it may keep the other one.
            const double old_max = d.vmax[i], e_old = d.evmax[i];
            d.vmax[i] = std::max(V, old_max);
            if (std::fabs(V - old_max) <= d.ev[i] + e_old) {
              d.evmax[i] = std::max(d.ev[i], e_old) + std::fabs(V - old_max);
            } else {
              d.evmax[i] = V > old_max ? d.ev[i] : e_old;
            }
            vhat = d.vmax[i];
            evhat = d.evmax[i];
          }
          const double bc1 = 1 - std::pow(b1, t), bc2 = std::sqrt(1 - std::pow(b2, t));
          const double sq = std::sqrt(vhat);
          const double denom = sq / bc2 + eps;
          // sqrt halves a relative error; /bc2, +eps and the constants add ~4u.
          const double edenom = (0.5 * evhat / std::max(vhat, 1e-300) + 4 * kU) * sq / bc2 +
                                kU * eps;
          const double update = lr / bc1 * M / denom;
          const double eupdate =
              lr / bc1 * (EM / denom + std::fabs(M) * edenom / (denom * denom)) +
              4 * kU * std::fabs(update);
          P -= update;
          EP += eupdate + 2 * kU * std::fabs(P);
          break;
        }
        case OptimizerKind::kAdagrad: {
          const double grad = gi + wd * P;
          const double egrad = wd * EP + 3 * kU * (std::fabs(gi) + std::fabs(wd * P));
          M += grad * grad;
          EM += 2 * std::fabs(grad) * egrad + 3 * kU * M;
          const double clr = lr / (1 + (t - 1) * h.lr_decay);
          const double sq = std::sqrt(M);
          const double stdv = sq + eps;
          const double estd = (0.5 * EM / M + 2 * kU) * sq + kU * eps;
          const double update = clr * grad / stdv;
          const double eupdate =
              clr * (egrad / stdv + std::fabs(grad) * estd / (stdv * stdv)) +
              4 * kU * std::fabs(update);
          P -= update;
          EP += eupdate + 2 * kU * std::fabs(P);
          break;
        }
        case OptimizerKind::kLion: {
          P *= 1 - lr * wd;
          EP = EP * (1 - lr * wd) + 2 * kU * std::fabs(P);
          const double c = b1 * M + (1 - b1) * gi;
          const double ec = b1 * EM + 4 * kU * (b1 * std::fabs(M) + (1 - b1) * std::fabs(gi));
          if (std::fabs(c) <= ec) d.ambiguous[i] = true;
          P -= lr * (c > 0 ? 1 : (c < 0 ? -1 : 0));
          EP += 2 * kU * (std::fabs(P) + lr);
          M = b2 * M + (1 - b2) * gi;
          EM = b2 * EM + 4 * kU * (b2 * std::fabs(M) + (1 - b2) * std::fabs(gi) + std::fabs(M));
          break;
        }
        case OptimizerKind::kLamb:   // not among this test's cases
        case OptimizerKind::kOther:
          break;
      }
    }
  }
  size_t ambiguous = 0;
  double worst_p = 0, worst_m = 0;
  for (size_t i = 0; i < kN; ++i) {
    if (d.ambiguous[i]) {
      ++ambiguous;
      continue;
    }
    ASSERT_LE(std::fabs(p[i] - d.p[i]), d.ep[i]) << "param " << i;
    ASSERT_LE(std::fabs(m[i] - d.m[i]), d.em[i]) << "exp_avg " << i;
    worst_p = std::max(worst_p, std::fabs(p[i] - d.p[i]) / d.ep[i]);
    worst_m = std::max(worst_m, std::fabs(m[i] - d.m[i]) / d.em[i]);
    if (layout.exp_avg_sq) {
      ASSERT_LE(std::fabs(v[i] - d.v[i]), d.ev[i]) << "exp_avg_sq " << i;
    }
    if (layout.max_exp_avg_sq) {
      ASSERT_LE(std::fabs(vmax[i] - d.vmax[i]), d.evmax[i]) << "max_exp_avg_sq " << i;
    }
    // And the bound is tight enough to mean something: 1e-4 of the params'
    // unit scale after 100 steps (the observed errors are ~10% of it).
    ASSERT_LE(d.ep[i], 1e-4 * std::max(1.0, std::fabs(d.p[i]))) << "bound too loose at " << i;
  }
  // Lion only: elements whose update direction fp32 could legitimately flip.
  EXPECT_LE(ambiguous, kN / 100);
  std::printf("  %s: max error / bound: params %.3f, exp_avg %.3f; %zu sign-ambiguous\n",
              std::string(OptimizerKindName(h.kind)).c_str(), worst_p, worst_m, ambiguous);
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, Fp64ReferenceTest, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace strata
