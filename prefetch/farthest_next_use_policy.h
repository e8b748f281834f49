// FarthestNextUsePolicy: Belady's rule on the predicted future. The victim is
// the candidate whose predicted next use is farthest away; candidates with no
// prediction at all go first, least recently used among them (LRU where
// nothing is predicted), and among equals clean copies before dirty ones.
//
// For a prefetch (not a demand miss) it also enforces "do no harm": it
// refuses to evict a copy predicted to be needed no later than the incoming
// shard, since that would trade a sooner miss for a later hit.
//
// With a PredictionTrust (optional), the prediction is followed only while
// the job's measured accuracy says it beats recency; otherwise demand misses
// evict least recently used first (LruPolicy's order), sparing copies
// predicted within a tier's worth of accesses while another is left, and
// prefetches may not evict at all: a job whose accesses the prediction gets
// wrong is paged by recency.
#ifndef STRATA_PREFETCH_FARTHEST_NEXT_USE_POLICY_H_
#define STRATA_PREFETCH_FARTHEST_NEXT_USE_POLICY_H_

#include "prefetch/access_predictor.h"
#include "prefetch/prediction_trust.h"
#include "tiers/eviction_policy.h"

namespace strata {

class FarthestNextUsePolicy final : public EvictionPolicy {
 public:
  // `predictor` is borrowed, must outlive the policy and must be safe to call
  // under the store's lock (LearnedPredictor and OracleAccessPredictor are).
  // `trust`, when given, is borrowed likewise.
  explicit FarthestNextUsePolicy(const AccessPredictor* predictor,
                                 const PredictionTrust* trust = nullptr)
      : predictor_(predictor), trust_(trust) {}

  std::optional<size_t> ChooseVictim(const EvictionRequest& request,
                                     absl::Span<const EvictionCandidate> candidates) override;

 private:
  const AccessPredictor* const predictor_;
  const PredictionTrust* const trust_;
  LruPolicy recency_;
};

}  // namespace strata

#endif  // STRATA_PREFETCH_FARTHEST_NEXT_USE_POLICY_H_
