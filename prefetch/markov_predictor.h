// MarkovPredictor: a first-order Markov model over shard transitions, the
// fallback for access patterns that do not repeat exactly (mixture-of-experts
// routing picks different experts every iteration, but after layer i's router
// the likely experts are still a small, learnable set).
//
// Counts are halved once a key's outgoing total passes `max_total`, so the
// model follows slowly drifting routing instead of averaging over all time.
//
// Thread-compatible.
#ifndef STRATA_PREFETCH_MARKOV_PREDICTOR_H_
#define STRATA_PREFETCH_MARKOV_PREDICTOR_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/shard_key.h"

namespace strata {

class MarkovPredictor {
 public:
  explicit MarkovPredictor(uint32_t max_total = 256) : max_total_(max_total) {}

  void Observe(const ShardKey& from, const ShardKey& to);
  // Successors of `from` with their probability, most likely first (ties by
  // key, so results are deterministic).
  std::vector<std::pair<ShardKey, double>> Successors(const ShardKey& from) const;
  std::optional<ShardKey> MostLikely(const ShardKey& from) const;

 private:
  struct Row {
    absl::flat_hash_map<ShardKey, uint32_t> counts;
    uint32_t total = 0;
  };
  const uint32_t max_total_;
  absl::flat_hash_map<ShardKey, Row> rows_;
};

}  // namespace strata

#endif  // STRATA_PREFETCH_MARKOV_PREDICTOR_H_
