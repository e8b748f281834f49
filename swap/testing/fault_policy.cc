#include "swap/testing/fault_policy.h"

#include <algorithm>
#include <utility>

namespace strata {

FaultSchedule::FaultSchedule(FaultPolicy policy)
    : policy_(std::move(policy)),
      matched_(policy_.rules.size(), 0),
      fires_(policy_.rules.size(), 0),
      rng_(policy_.seed) {}

std::optional<FaultRule> FaultSchedule::Next(IoOp op, std::optional<uint64_t> tag) {
  absl::MutexLock lock(&mu_);
  ++events_;
  std::optional<FaultRule> chosen;
  for (size_t i = 0; i < policy_.rules.size(); ++i) {
    const FaultRule& r = policy_.rules[i];
    if (r.only_op.has_value() && *r.only_op != op) continue;
    if (r.only_tag.has_value() && tag != r.only_tag) continue;
    uint64_t n = ++matched_[i];
    if (chosen.has_value()) continue;  // later rules still count the event
    if (r.max_fires != 0 && fires_[i] >= r.max_fires) continue;
    bool fire = r.nth != 0 ? n >= r.nth && n - r.nth < std::max<uint64_t>(r.run, 1)
                           : r.probability > 0 &&
                                 std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < r.probability;
    if (fire) {
      ++fires_[i];
      chosen = r;
    }
  }
  return chosen;
}

uint64_t FaultSchedule::fired(FaultKind kind) const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (size_t i = 0; i < policy_.rules.size(); ++i) {
    if (policy_.rules[i].kind == kind) total += fires_[i];
  }
  return total;
}

uint64_t FaultSchedule::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

}  // namespace strata
