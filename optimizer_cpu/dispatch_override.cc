#include "optimizer_cpu/dispatch_override.h"

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "optimizer_cpu/cpu_optimizer.h"

namespace strata {
namespace {

// Each target compiled into this library (HWY_TARGETS, the same set the
// kernels' translation units see) and supported by the CPU, best first.
std::vector<int64_t> AvailableTargetBits() {
  std::vector<int64_t> bits;
  // REQUIRES: no override active (SupportedTargets() honours it).
  for (int64_t t = hwy::SupportedTargets() & HWY_TARGETS; t != 0; t &= t - 1) {
    bits.push_back(t & -t);  // lowest bit = best target
  }
  return bits;
}

}  // namespace

std::vector<std::string> AvailableKernelTargets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<std::string> names;
  for (int64_t bit : AvailableTargetBits()) names.push_back(hwy::TargetName(bit));
  return names;
}

absl::Status OverrideKernelTargetForBenchmark(absl::string_view name) {
  hwy::SetSupportedTargetsForTest(0);
  for (int64_t bit : AvailableTargetBits()) {
    if (absl::EqualsIgnoreCase(name, hwy::TargetName(bit))) {
      hwy::SetSupportedTargetsForTest(bit);
      if (!absl::EqualsIgnoreCase(CpuOptimizer::KernelTarget(), name)) {
        const std::string got = CpuOptimizer::KernelTarget();
        hwy::SetSupportedTargetsForTest(0);
        return absl::InternalError(
            absl::StrCat("kernel target override to ", name, " dispatched to ", got));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("kernel target '", name, "' is not available here; this CPU and build have ",
                   absl::StrJoin(AvailableKernelTargets(), ", ")));
}

void ClearKernelTargetOverride() { hwy::SetSupportedTargetsForTest(0); }

}  // namespace strata
