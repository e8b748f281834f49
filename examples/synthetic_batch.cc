#include "examples/synthetic_batch.h"

#include <cstddef>

#include "examples/split_mix64.h"

namespace strata {

SyntheticTask::SyntheticTask(uint64_t seed, int features, int classes)
    : seed_(seed), features_(features), classes_(classes) {
  SplitMix64 rng(seed ^ 0x7465616368657221ULL);  // "teacher!": apart from the model's init
  teacher_.resize(static_cast<size_t>(classes) * features);
  for (float& w : teacher_) w = rng.NextUniform(-1.0f, 1.0f);
}

Batch SyntheticTask::MakeBatch(uint32_t rank, uint64_t step, int rows) const {
  // One stream per (rank, step): mixing through SplitMix64 once keeps nearby
  // (rank, step) pairs from sharing a prefix.
  SplitMix64 mix(seed_ ^ (static_cast<uint64_t>(rank) << 40) ^ step);
  SplitMix64 rng(mix.Next());
  Batch batch;
  batch.inputs.resize(static_cast<size_t>(rows) * features_);
  batch.labels.resize(rows);
  for (int n = 0; n < rows; ++n) {
    float* x = &batch.inputs[static_cast<size_t>(n) * features_];
    for (int i = 0; i < features_; ++i) x[i] = rng.NextUniform(-1.0f, 1.0f);
    int best = 0;
    float best_score = 0.0f;
    for (int c = 0; c < classes_; ++c) {
      const float* w = &teacher_[static_cast<size_t>(c) * features_];
      float score = 0.0f;
      for (int i = 0; i < features_; ++i) score += w[i] * x[i];
      if (c == 0 || score > best_score) {
        best = c;
        best_score = score;
      }
    }
    batch.labels[n] = best;
  }
  return batch;
}

}  // namespace strata
