// LearnedPredictor: the AccessPredictor strata runs for each job. It combines
//  * an AccessTracer recording each iteration,
//  * a TracePredictor following the learned iteration (resync, relearn),
//  * a MarkovPredictor over shard transitions, used where the trace has
//    nothing confident to say (no trace yet, lost, data-dependent accesses),
//  * per-shard presence frequencies (how often a shard appears in an
//    iteration), so that a shard used only in some iterations gets an
//    expected next use of `distance + (1/p - 1) * iteration_length`.
// Iteration boundaries come from the client (MarkIterationBoundary) or are
// detected when the learned trace has been walked to its end and the next
// access is the trace's first.
//
// Thread-safe: one internal mutex. The store calls NextUse (through the
// eviction policy) with the store's lock held, so this class never calls the
// store (lock order: store, then predictor).
#ifndef STRATA_PREFETCH_LEARNED_PREDICTOR_H_
#define STRATA_PREFETCH_LEARNED_PREDICTOR_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "prefetch/access_predictor.h"
#include "prefetch/access_tracer.h"
#include "prefetch/markov_predictor.h"
#include "prefetch/trace_predictor.h"

namespace strata {

struct LearnedPredictorOptions {
  TracePredictorOptions trace;
  // Weight of the latest iteration in the presence frequency (an EMA).
  double frequency_weight = 0.5;
  // Trace entries whose shard appears in fewer iterations than this are not
  // prefetched from the trace (they are guesses; the Markov model decides).
  double min_confidence = 0.9;
  // Markov successors at least this likely are prefetched next.
  double markov_min_probability = 0.6;
  // Detect boundaries when the client does not mark them.
  bool detect_boundaries = true;
  // In the learning iteration, predict each shard's next use at its first
  // slot in the next iteration (see NextUseFrom) instead of nothing (LRU).
  bool guess_learning_iteration = true;
};

struct LearnedPredictorStats {
  uint64_t accesses = 0;
  uint64_t iterations = 0;
  uint64_t detected_boundaries = 0;
  uint64_t matched = 0;
  uint64_t deviations = 0;  // skipped, extra or resynced accesses
  uint64_t relearns = 0;
};

class LearnedPredictor final : public AccessPredictor {
 public:
  explicit LearnedPredictor(const LearnedPredictorOptions& options = {}) : options_(options),
                                                                          trace_(options.trace) {}

  void OnAccess(const ShardKey& key);
  void MarkIterationBoundary();

  double NextUse(const ShardKey& key) const override { return NextUseFrom(key, 0); }
  double NextUseFrom(const ShardKey& key, double distance) const override;
  std::vector<PredictedAccess> Upcoming(size_t max_count) const override;
  // The rest of the learned iteration, then the learned iteration again;
  // empty before one is learned and while lost.
  std::vector<ShardKey> Sequence(size_t max_len) const override;

  LearnedPredictorStats stats() const;
  // The learned trace (a copy), for tests and the CLI.
  std::vector<ShardKey> learned_trace() const;

 private:
  struct KeyStats {
    double frequency = 1.0;
    // Presence history: iterations since first seen, how often presence
    // flipped (present <-> absent), and whether it was present last time.
    // A shard whose presence rarely flips is structural (a dense layer): it
    // is trusted as soon as it is present, even right after a shape change.
    // One that flips often is data-dependent (an expert): its frequency
    // speaks for it.
    uint32_t iterations_known = 0;
    uint32_t flips = 0;
    bool present_last = false;
    // Where in its iteration it was accessed: in the last iteration it
    // appeared in, and so far in this one. A shard accessed this iteration is
    // expected to follow the rest of that pattern (an expert routed to in
    // forward is needed again in backward and in the step).
    std::vector<uint32_t> offsets_last;
    std::vector<uint32_t> offsets_current;
    size_t last_offset = 0;  // position in its iteration when last seen
    bool seen_this_iteration = false;
  };
  void EndIterationLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How likely `key` is to appear in an iteration: 1 for a structural shard
  // present last iteration, else its presence frequency.
  double ConfidenceLocked(const ShardKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when `key`'s first slot in this iteration has passed without it:
  // its later slots this iteration (backward, step) will not come either.
  bool SkippedThisIterationLocked(const ShardKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when another shard of `key`'s tensor (same job, rank, tensor and
  // index, another kind) was used this iteration: a tensor whose params were
  // used in forward has its gradient and optimizer state used later in the
  // same iteration (an expert that was routed to), so `key` is certain for
  // the rest of this iteration even where its presence is a guess.
  bool TensorUsedThisIterationLocked(const ShardKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LearnedPredictorOptions options_;
  mutable absl::Mutex mu_;
  AccessTracer tracer_ ABSL_GUARDED_BY(mu_);
  TracePredictor trace_ ABSL_GUARDED_BY(mu_);
  MarkovPredictor markov_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ShardKey, KeyStats> keys_ ABSL_GUARDED_BY(mu_);
  // The tensors (keys with kind kParam16) used this iteration.
  absl::flat_hash_set<ShardKey> tensors_this_iteration_ ABSL_GUARDED_BY(mu_);
  std::optional<ShardKey> last_key_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  LearnedPredictorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_PREFETCH_LEARNED_PREDICTOR_H_
