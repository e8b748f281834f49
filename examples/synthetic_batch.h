// The example's training data: synthetic, deterministic, and different on
// every rank, as data-parallel training feeds each rank its own slice.
//
// Inputs are uniform in [-1, 1); the label of an input is the argmax of a
// fixed random linear "teacher" map, so the task is learnable and the loss of
// a small MLP visibly falls within a few steps. Values come from SplitMix64
// and a fixed float conversion (not <random>'s distributions, whose output
// the standard leaves to the library), so every build and every mode sees
// the same bits.
#ifndef STRATA_EXAMPLES_SYNTHETIC_BATCH_H_
#define STRATA_EXAMPLES_SYNTHETIC_BATCH_H_

#include <cstdint>
#include <vector>

namespace strata {

struct Batch {
  std::vector<float> inputs;  // rows x features, row-major
  std::vector<int> labels;    // rows
};

class SyntheticTask final {
 public:
  // The teacher depends on `seed` only: every rank learns the same task.
  SyntheticTask(uint64_t seed, int features, int classes);

  // The batch of `rank` at `step`: `rows` fresh samples, a pure function of
  // (seed, rank, step).
  Batch MakeBatch(uint32_t rank, uint64_t step, int rows) const;

 private:
  uint64_t seed_;
  int features_;
  int classes_;
  std::vector<float> teacher_;  // classes x features
};

}  // namespace strata

#endif  // STRATA_EXAMPLES_SYNTHETIC_BATCH_H_
