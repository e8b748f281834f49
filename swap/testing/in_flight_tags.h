// InFlightTags: which IoRequest::tag each byte range in flight belongs to,
// so that faults injected beneath an engine's retry logic (FaultInjector, a
// result hook that sees only op, offset and length) can be scoped to one
// owner. FaultInjectionIoEngine records every request it forwards and drops
// it when the completion is reaped; the injector asks TagAt(offset).
//
// Offsets are per file: scoping by tag is exact when the engine serves one
// data file (one NVMe path), and otherwise may attribute a piece to a request
// at the same offset of another file. Thread-safe.
#ifndef STRATA_SWAP_TESTING_IN_FLIGHT_TAGS_H_
#define STRATA_SWAP_TESTING_IN_FLIGHT_TAGS_H_

#include <cstdint>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace strata {

class InFlightTags {
 public:
  void Add(uint64_t offset, uint64_t length, uint64_t tag);
  void Remove(uint64_t offset, uint64_t length, uint64_t tag);
  // The tag of a range in flight that contains `offset`, if any.
  std::optional<uint64_t> TagAt(uint64_t offset) const;

 private:
  struct Range {
    uint64_t end = 0;
    uint64_t tag = 0;
  };
  mutable absl::Mutex mu_;
  std::multimap<uint64_t, Range> ranges_ ABSL_GUARDED_BY(mu_);  // by start offset
};

}  // namespace strata

#endif  // STRATA_SWAP_TESTING_IN_FLIGHT_TAGS_H_
