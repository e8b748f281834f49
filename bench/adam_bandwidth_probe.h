// The memory-bandwidth probe of `strata bench adam`: the optimizer's own
// memory pattern with trivial arithmetic. Three fp32 streams are read and
// updated in place and a fourth is only read (the shape of an AdamW step with
// fp32 gradients: params, exp_avg, exp_avg_sq, grad), 28 bytes per element.
// STREAM's copy and triad write to arrays they do not read, so they pay
// write-allocate traffic the optimizer does not and understate what it can
// reach; this probe does not.
#ifndef STRATA_BENCH_ADAM_BANDWIDTH_PROBE_H_
#define STRATA_BENCH_ADAM_BANDWIDTH_PROBE_H_

#include <cstddef>

namespace strata {

inline constexpr size_t kProbeBytesPerElement = 28;

// a, b, c <- x * 0.999 + g over [begin, end), vectorized with Highway.
void BandwidthProbeRange(float* a, float* b, float* c, const float* g, size_t begin, size_t end);

}  // namespace strata

#endif  // STRATA_BENCH_ADAM_BANDWIDTH_PROBE_H_
