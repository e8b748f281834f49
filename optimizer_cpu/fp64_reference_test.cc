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
        case OptimizerKind::kLamb:
          FAIL() << "LAMB has its own test below";
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
        case OptimizerKind::kOther:  // not among this test's cases
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

// LAMB has no torch counterpart, so this is its reference over many steps.
// Per element as above; the trust ratio couples the elements: the fp32 run's
// norms are within the norm of the error vector of the fp64 ones (triangle
// inequality), so the ratio's relative error is at most eW/W + eS/S (plus
// roundings), and it enters every param's step.
TEST(Fp64ReferenceLambTest, Fp32StaysWithinDerivedRoundingBoundOver100Steps) {
  for (int variant = 0; variant < 3; ++variant) {
    OptimizerHyperparams h;
    h.kind = OptimizerKind::kLamb;
    h.weight_decay = variant == 1 ? 0.0 : 0.01;
    h.eps_inside_sqrt = variant == 2;
    h.max_coeff = variant == 1 ? 0.2 : 10.0;  // variant 1: ||p|| / ||update|| is 0.3-1.5 here
    SCOPED_TRACE(testing::Message() << "variant " << variant);
    std::mt19937 rng(402 + variant);
    std::normal_distribution<float> normal;
    std::vector<float> p(kN), m(kN, 0.0f), v(kN, 0.0f), g(kN);
    for (float& x : p) x = normal(rng);
    std::vector<double> P(p.begin(), p.end()), M(kN, 0.0), V(kN, 0.0);
    std::vector<double> EP(kN, 0.0), EM(kN, 0.0), EV(kN, 0.0), U(kN), EU(kN);
    auto opt = CpuOptimizer::Create(CpuOptimizerOptions{});
    ASSERT_TRUE(opt.ok());
    StepSpans s;
    s.size = kN;
    s.params = p.data();
    s.exp_avg = m.data();
    s.exp_avg_sq = v.data();
    s.grad = g.data();
    const double b1 = h.beta1, b2 = h.beta2, wd = h.weight_decay, eps = h.eps;
    int clamped = 0;
    for (int t = 1; t <= kSteps; ++t) {
      for (float& x : g) x = normal(rng);
      ASSERT_TRUE((*opt)->Step(h, t, s).ok());
      double w2 = 0, s2 = 0, ew2 = 0, es2 = 0;
      for (size_t i = 0; i < kN; ++i) {
        const double gi = g[i];
        M[i] = b1 * M[i] + (1 - b1) * gi;
        EM[i] = b1 * EM[i] + 4 * kU * (b1 * std::fabs(M[i]) + (1 - b1) * std::fabs(gi) + std::fabs(M[i]));
        V[i] = b2 * V[i] + (1 - b2) * gi * gi;
        EV[i] = b2 * EV[i] + 6 * kU * V[i];
        double denom, edenom;
        if (h.eps_inside_sqrt) {
          denom = std::sqrt(V[i] + eps);
          edenom = (0.5 * (EV[i] + 2 * kU * (V[i] + eps)) / (V[i] + eps) + kU) * denom;
        } else {
          const double sq = std::sqrt(V[i]);
          denom = sq + eps;
          edenom = (0.5 * EV[i] / std::max(V[i], 1e-300) + kU) * sq + 2 * kU * denom;
        }
        const double r = M[i] / denom;
        const double er = EM[i] / denom + std::fabs(M[i]) * edenom / (denom * denom) + kU * std::fabs(r);
        U[i] = r + wd * P[i];
        EU[i] = er + wd * EP[i] + 3 * kU * (std::fabs(r) + std::fabs(wd * P[i]));
        w2 += P[i] * P[i];
        s2 += U[i] * U[i];
        ew2 += EP[i] * EP[i];
        es2 += EU[i] * EU[i];
      }
      const double w = std::sqrt(w2), un = std::sqrt(s2);
      // Relative error of the ratio: both norms', the double sums' (tiny),
      // and the rounding of step_size * ratio to float.
      const double rel = std::sqrt(ew2) / w + std::sqrt(es2) / un + 1e-12 + 2 * kU;
      double ratio = w / un;
      if (ratio > h.max_coeff || ratio < h.min_coeff) ++clamped;
      ratio = std::min(std::max(ratio, h.min_coeff), h.max_coeff);  // 1-Lipschitz
      const double c = LambStepSize(h, t) * ratio;
      for (size_t i = 0; i < kN; ++i) {
        P[i] -= c * U[i];
        EP[i] += c * EU[i] + c * rel * std::fabs(U[i]) + kU * std::fabs(c * U[i]) +
                 kU * std::fabs(P[i]);
      }
    }
    double worst_p = 0, worst_m = 0;
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_LE(std::fabs(p[i] - P[i]), EP[i]) << "param " << i;
      ASSERT_LE(std::fabs(m[i] - M[i]), EM[i]) << "exp_avg " << i;
      ASSERT_LE(std::fabs(v[i] - V[i]), EV[i]) << "exp_avg_sq " << i;
      ASSERT_LE(EP[i], 1e-4 * std::max(1.0, std::fabs(P[i]))) << "bound too loose at " << i;
      worst_p = std::max(worst_p, std::fabs(p[i] - P[i]) / EP[i]);
      worst_m = std::max(worst_m, std::fabs(m[i] - M[i]) / EM[i]);
    }
    if (variant == 1) {
      EXPECT_GT(clamped, kSteps / 2) << "the clamp was not exercised";
    }
    std::printf("  lamb variant %d: max error / bound: params %.3f, exp_avg %.3f; %d of %d steps clamped\n",
                variant, worst_p, worst_m, clamped, kSteps);
  }
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, Fp64ReferenceTest, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace strata
