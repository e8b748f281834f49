// OracleAccessPredictor: knows the actual future access sequence. Driving the
// store's prefetcher and FarthestNextUsePolicy with it gives Belady's MIN
// with prefetching, the limit the benchmark compares the LearnedPredictor
// against. The caller advances it once per access.
//
// Thread-safe (an atomic position; the sequence is immutable).
#ifndef STRATA_PREFETCH_ORACLE_PREDICTOR_H_
#define STRATA_PREFETCH_ORACLE_PREDICTOR_H_

#include <atomic>
#include <cstddef>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "prefetch/access_predictor.h"

namespace strata {

class OracleAccessPredictor final : public AccessPredictor {
 public:
  explicit OracleAccessPredictor(std::vector<ShardKey> sequence);

  // The access at the current position has happened.
  void Advance() { position_.fetch_add(1, std::memory_order_acq_rel); }
  size_t position() const { return position_.load(std::memory_order_acquire); }

  double NextUse(const ShardKey& key) const override { return NextUseFrom(key, 0); }
  double NextUseFrom(const ShardKey& key, double distance) const override;
  std::vector<PredictedAccess> Upcoming(size_t max_count) const override;
  std::vector<ShardKey> Sequence(size_t max_len) const override;

 private:
  const std::vector<ShardKey> sequence_;
  absl::flat_hash_map<ShardKey, std::vector<size_t>> positions_;  // sorted
  std::atomic<size_t> position_{0};
};

}  // namespace strata

#endif  // STRATA_PREFETCH_ORACLE_PREDICTOR_H_
