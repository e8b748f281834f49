// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
// generators", 2014): a tiny, fully specified generator. The example uses it
// instead of <random>'s distributions, whose output the standard leaves to
// the library, so the model init and the data are the same bits everywhere.
#ifndef STRATA_EXAMPLES_SPLIT_MIX64_H_
#define STRATA_EXAMPLES_SPLIT_MIX64_H_

#include <cstdint>

namespace strata {

class SplitMix64 final {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // 24 random bits scaled into [lo, hi). The unit value is exact in float.
  float NextUniform(float lo, float hi) {
    const float unit = static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * unit;
  }

 private:
  uint64_t state_;
};

}  // namespace strata

#endif  // STRATA_EXAMPLES_SPLIT_MIX64_H_
