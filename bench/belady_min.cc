#include "bench/belady_min.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace strata {

MinResult ComputeBeladyMin(const GeneratedTrace& trace, size_t capacity) {
  const std::vector<TraceAccess>& a = trace.accesses;
  const size_t n = a.size();
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  // next[i]: the next access to the same shard after i.
  std::vector<size_t> next(n, kNever);
  absl::flat_hash_map<ShardKey, size_t> seen_at;
  for (size_t i = n; i-- > 0;) {
    auto it = seen_at.find(a[i].key);
    if (it != seen_at.end()) next[i] = it->second;
    seen_at[a[i].key] = i;
  }
  MinResult result;
  result.accesses = n;
  result.fetches_per_iteration.assign(trace.iteration_starts.size(), 0);
  // Cached shards ordered by next use; ties broken by key for repeatability.
  std::set<std::pair<size_t, ShardKey>> by_next;
  struct Entry {
    size_t next_use;
    bool dirty;
  };
  absl::flat_hash_map<ShardKey, Entry> cached;
  size_t iteration = 0;
  for (size_t i = 0; i < n; ++i) {
    while (iteration + 1 < trace.iteration_starts.size() &&
           trace.iteration_starts[iteration + 1] <= i) {
      ++iteration;
    }
    const ShardKey& key = a[i].key;
    auto it = cached.find(key);
    if (it != cached.end()) {
      by_next.erase({it->second.next_use, key});
    } else {
      ++result.fetches;
      ++result.fetches_per_iteration[iteration];
      if (cached.size() >= capacity) {
        auto victim = std::prev(by_next.end());
        if (cached[victim->second].dirty) ++result.write_backs;
        cached.erase(victim->second);
        by_next.erase(victim);
      }
      it = cached.emplace(key, Entry{0, false}).first;
    }
    it->second.next_use = next[i];
    it->second.dirty = it->second.dirty || a[i].write;
    by_next.insert({next[i], key});
  }
  return result;
}

}  // namespace strata
