// PredictionTrust: measures, online and per job, whether the job's predicted
// future is worth acting on, so that the eviction policy and the prefetcher
// back off to recency where it is not (data-dependent accesses such as
// mixture-of-experts routing) and run at full speed where it is (a repeating
// training iteration).
//
// How. Two shadow caches (keys only, no data) of the tier's size replay the
// job's actual accesses with demand paging: one evicts the copy with the
// farthest *predicted* next use (what FarthestNextUsePolicy does), the other
// the least recently used, sparing copies predicted within a tier's worth of
// accesses while another is left (the policy's fallback). Their misses, decayed with a half-life, are the
// measured accuracy of each rule on this job's own recent accesses (set
// dueling, as in adaptive CPU caches). The prediction is trusted while its
// shadow misses no more than recency's; a margin of hysteresis keeps the
// decision from flapping on a tie. The comparison is made on whole replays,
// not on single decisions, because a prediction that is wrong about *which*
// uncertain shard comes next can still be right about the many certain ones.
//
// Thread-safe (one internal mutex). OnAccess calls the predictor with that
// mutex held (lock order: trust, then predictor); Trusted() is what the
// eviction policy asks under the store's lock (store, then trust).
#ifndef STRATA_PREFETCH_PREDICTION_TRUST_H_
#define STRATA_PREFETCH_PREDICTION_TRUST_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/shard_key.h"
#include "prefetch/access_predictor.h"

namespace strata {

struct PredictionTrustOptions {
  // Copies the tier holds (shards of the job's size): the shadow caches'
  // size. Must be at least 1.
  size_t capacity_shards = 0;
  // Accesses after which a miss counts half: how far back the accuracy is
  // measured. A few hundred accesses covers one iteration of a small model
  // and reacts to a change in the trace within about one iteration.
  double half_life_accesses = 512;
  // The prediction is dropped when recency's decayed misses are more than
  // this many fewer than the prediction's, and taken up again when the
  // prediction's are more than this many fewer than recency's; in between
  // the decision stands (it starts trusted).
  double hysteresis_misses = 1.0;
};

struct PredictionTrustStats {
  uint64_t accesses = 0;
  uint64_t predicted_misses = 0;  // misses of the prediction's shadow cache
  uint64_t recency_misses = 0;    // misses of the LRU shadow cache
  uint64_t switches = 0;          // times the decision changed
  uint64_t untrusted_accesses = 0;  // accesses made while not trusted
};

class PredictionTrust {
 public:
  static absl::StatusOr<std::unique_ptr<PredictionTrust>> Create(
      const PredictionTrustOptions& options);
  PredictionTrust(const PredictionTrust&) = delete;
  PredictionTrust& operator=(const PredictionTrust&) = delete;

  // The job is about to access `key`: call before the predictor learns it
  // (the predictor's distance 0 is then this access, as the store's policy
  // sees it on a demand miss).
  void OnAccess(const ShardKey& key, const AccessPredictor& predictor);
  // Whether eviction and prefetch should follow the prediction now.
  bool Trusted() const;
  // The measured decayed misses (for stats and tests).
  double predicted_score() const;
  double recency_score() const;
  PredictionTrustStats stats() const;

 private:
  explicit PredictionTrust(const PredictionTrustOptions& options);
  // One shadow cache: resident keys and when each was last used.
  using Shadow = absl::flat_hash_map<ShardKey, uint64_t>;

  const PredictionTrustOptions options_;
  const double decay_;  // per access
  mutable absl::Mutex mu_;
  Shadow predicted_ ABSL_GUARDED_BY(mu_);
  Shadow recency_ ABSL_GUARDED_BY(mu_);
  double predicted_score_ ABSL_GUARDED_BY(mu_) = 0;
  double recency_score_ ABSL_GUARDED_BY(mu_) = 0;
  bool trusted_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  PredictionTrustStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_PREFETCH_PREDICTION_TRUST_H_
