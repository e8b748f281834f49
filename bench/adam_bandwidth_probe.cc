#include "bench/adam_bandwidth_probe.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/adam_bandwidth_probe.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void ProbeRangeT(float* HWY_RESTRICT a, float* HWY_RESTRICT b, float* HWY_RESTRICT c,
                 const float* HWY_RESTRICT g, size_t begin, size_t end) {
  const hn::ScalableTag<float> d;
  const size_t n = hn::Lanes(d);
  const auto k = hn::Set(d, 0.999f);
  size_t i = begin;
  for (; i + n <= end; i += n) {
    const auto gv = hn::LoadU(d, g + i);
    hn::StoreU(hn::Add(hn::Mul(hn::LoadU(d, a + i), k), gv), d, a + i);
    hn::StoreU(hn::Add(hn::Mul(hn::LoadU(d, b + i), k), gv), d, b + i);
    hn::StoreU(hn::Add(hn::Mul(hn::LoadU(d, c + i), k), gv), d, c + i);
  }
  for (; i < end; ++i) {
    a[i] = a[i] * 0.999f + g[i];
    b[i] = b[i] * 0.999f + g[i];
    c[i] = c[i] * 0.999f + g[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {
HWY_EXPORT(ProbeRangeT);

void BandwidthProbeRange(float* a, float* b, float* c, const float* g, size_t begin, size_t end) {
  HWY_DYNAMIC_DISPATCH(ProbeRangeT)(a, b, c, g, begin, end);
}
}  // namespace strata
#endif  // HWY_ONCE
