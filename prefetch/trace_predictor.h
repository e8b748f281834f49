// TracePredictor: follows a job through its learned per-iteration trace.
//
// Training repeats its access order, so the last iteration predicts the next.
// The predictor keeps a position in the learned trace and advances it on each
// access. Unlike DeepSpeed's trace cache, which drops the whole trace on the
// first mismatch ("Invalidate trace cache"), it tolerates deviations:
//  * a skipped access: the key is found a few entries ahead (within
//    `resync_window`); the position jumps there;
//  * an extra access: the key is not found nearby; the position stays;
//  * lost: after `lost_after` extra accesses in a row the key is searched for
//    in the rest of the trace and the position moved there.
// At the end of an iteration the recorded iteration replaces the trace when
// the pattern really changed: more than `relearn_fraction` of the accesses
// deviated, or the same deviation happened two iterations in a row.
//
// Thread-compatible.
#ifndef STRATA_PREFETCH_TRACE_PREDICTOR_H_
#define STRATA_PREFETCH_TRACE_PREDICTOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/shard_key.h"

namespace strata {

struct TracePredictorOptions {
  size_t resync_window = 8;
  size_t lost_after = 3;
  double relearn_fraction = 0.05;
};

class TracePredictor {
 public:
  enum class Match { kNoTrace, kMatched, kSkipped, kExtra, kResynced };

  explicit TracePredictor(const TracePredictorOptions& options = {}) : options_(options) {}

  // Adopts `trace` as the learned iteration, positioned at its start.
  void Learn(std::vector<ShardKey> trace);
  bool has_trace() const { return !trace_.empty(); }
  const std::vector<ShardKey>& trace() const { return trace_; }
  size_t position() const { return pos_; }
  // True once every entry of the trace has been passed.
  bool at_end() const { return pos_ >= trace_.size(); }

  // Advances over one access and says how it related to the trace. Only an
  // `anchor` access (a shard that appears reliably, not a data-dependent
  // one such as an expert) may move a lost position to a far-away match.
  Match Observe(const ShardKey& key, bool anchor = true);

  // Ends an iteration whose accesses were `recorded` (`previous` is the
  // iteration before it). Relearns if the pattern changed; returns whether it
  // did. The position goes back to the start.
  bool EndIteration(const std::vector<ShardKey>& recorded, const std::vector<ShardKey>& previous);

  // Distance from the position to the next entry for `key`, wrapping into
  // the next iteration; kNeverUsed (infinity) when the trace lacks `key`.
  double NextUse(const ShardKey& key) const { return NextUseFrom(key, 0); }
  // The first entry for `key` at least `distance` entries from the position
  // (the trace repeating); kNeverUsed when the trace lacks `key`.
  double NextUseFrom(const ShardKey& key, size_t distance) const;
  // The first entry for `key` in the trace, or -1 when it has none.
  int64_t FirstPosition(const ShardKey& key) const {
    auto it = positions_.find(key);
    return it == positions_.end() ? -1 : static_cast<int64_t>(it->second.front());
  }
  // Calls `visit(key, distance)` for the entries from the position on,
  // wrapping once, until it returns false.
  void Walk(const std::function<bool(const ShardKey&, size_t)>& visit) const;

  uint64_t deviations() const { return deviations_; }  // this iteration
  uint64_t relearns() const { return relearns_; }

 private:
  const TracePredictorOptions options_;
  std::vector<ShardKey> trace_;
  absl::flat_hash_map<ShardKey, std::vector<size_t>> positions_;  // sorted
  size_t pos_ = 0;
  size_t extra_in_a_row_ = 0;
  uint64_t deviations_ = 0;
  uint64_t relearns_ = 0;
};

}  // namespace strata

#endif  // STRATA_PREFETCH_TRACE_PREDICTOR_H_
