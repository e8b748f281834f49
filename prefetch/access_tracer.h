// AccessTracer: records the sequence of shard accesses of one job, one
// iteration at a time. Iterations end where the client marks them
// (MarkIterationBoundary) or where the predictor detects that the learned
// trace has been walked to its end.
//
// Thread-compatible.
#ifndef STRATA_PREFETCH_ACCESS_TRACER_H_
#define STRATA_PREFETCH_ACCESS_TRACER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/shard_key.h"

namespace strata {

class AccessTracer {
 public:
  void Record(const ShardKey& key) { current_.push_back(key); }
  // Closes the current iteration; it becomes last_iteration(). An empty
  // iteration (two boundaries in a row) is ignored.
  void EndIteration();

  const std::vector<ShardKey>& current() const { return current_; }
  const std::vector<ShardKey>& last_iteration() const { return last_; }
  const std::vector<ShardKey>& previous_iteration() const { return previous_; }
  uint64_t iterations() const { return iterations_; }

 private:
  std::vector<ShardKey> current_;
  std::vector<ShardKey> last_;
  std::vector<ShardKey> previous_;
  uint64_t iterations_ = 0;
};

}  // namespace strata

#endif  // STRATA_PREFETCH_ACCESS_TRACER_H_
