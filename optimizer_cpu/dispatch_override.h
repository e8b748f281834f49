// Pinning the optimizer kernels to one Highway target, for benchmarks and
// tests only: `strata bench adam --target AVX2` measures the AVX2 kernels on
// an AVX-512 machine, the kernel tests run every target. Product code never
// calls this; the daemon always runs the best target of its CPU.
//
// Highway's dispatch state is per process, so the override applies to every
// dynamically dispatched function in it (the bench's bandwidth probe
// included), until ClearKernelTargetOverride(). Not thread-safe: call it
// before any kernel runs.
#ifndef STRATA_OPTIMIZER_CPU_DISPATCH_OVERRIDE_H_
#define STRATA_OPTIMIZER_CPU_DISPATCH_OVERRIDE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

// Names of the targets both compiled into the kernels and supported by this
// CPU, best first ("AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR" here).
std::vector<std::string> AvailableKernelTargets();

// Restricts dispatch to the target named `name` (case-insensitive).
// InvalidArgument naming the available targets when it is unknown, not
// compiled in, or not supported by this CPU.
absl::Status OverrideKernelTargetForBenchmark(absl::string_view name);

// Back to the best target of the CPU.
void ClearKernelTargetOverride();

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_DISPATCH_OVERRIDE_H_
