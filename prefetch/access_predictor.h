// AccessPredictor: what the prefetch scheduler and the eviction policy ask
// about the future accesses of one job. Implementations: LearnedPredictor
// (learns from the job's own accesses) and OracleAccessPredictor (knows the
// actual future; the offline limit the benchmark measures against).
//
// Distances are counted in accesses from now: 0 is the access about to
// happen, 1 the one after it. Thread-compatible; callers serialize (the
// store calls the eviction policy under its lock, so the scheduler and
// the policy must not race on one predictor: see prefetch_scheduler.h).
#ifndef STRATA_PREFETCH_ACCESS_PREDICTOR_H_
#define STRATA_PREFETCH_ACCESS_PREDICTOR_H_

#include <cstddef>
#include <limits>
#include <vector>

#include "core/shard_key.h"

namespace strata {

inline constexpr double kNeverUsed = std::numeric_limits<double>::infinity();

struct PredictedAccess {
  ShardKey key;
  double distance = 0;  // accesses from now
};

class AccessPredictor {
 public:
  virtual ~AccessPredictor() = default;
  // Expected distance to the next use of `key`; kNeverUsed when none is
  // predicted. For shards used only in some iterations (mixture-of-experts)
  // this is an expectation, so larger means "less likely soon".
  virtual double NextUse(const ShardKey& key) const = 0;
  // Expected distance to the first use of `key` at least `distance` away
  // (NextUseFrom(key, 0) == NextUse(key)). The eviction policy asks what will
  // be needed after an incoming shard's use, as MIN would at that time.
  virtual double NextUseFrom(const ShardKey& key, double distance) const = 0;
  // The next distinct shards worth fetching, nearest first, at most
  // `max_count`. Shards predicted with low confidence are left out.
  virtual std::vector<PredictedAccess> Upcoming(size_t max_count) const = 0;
  // The predicted access sequence from now, repeats included, at most
  // `max_len` long; shorter (or empty) where the predictor cannot say. The
  // scheduler replays MIN on it to tell whether an urgent eviction costs a
  // fetch MIN would not make.
  virtual std::vector<ShardKey> Sequence(size_t max_len) const {
    (void)max_len;
    return {};
  }
};

}  // namespace strata

#endif  // STRATA_PREFETCH_ACCESS_PREDICTOR_H_
