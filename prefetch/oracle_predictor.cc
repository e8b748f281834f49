#include "prefetch/oracle_predictor.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace strata {

OracleAccessPredictor::OracleAccessPredictor(std::vector<ShardKey> sequence)
    : sequence_(std::move(sequence)) {
  for (size_t i = 0; i < sequence_.size(); ++i) positions_[sequence_[i]].push_back(i);
}

double OracleAccessPredictor::NextUseFrom(const ShardKey& key, double distance) const {
  auto it = positions_.find(key);
  if (it == positions_.end() || distance == kNeverUsed) return kNeverUsed;
  const size_t now = position();
  auto next = std::lower_bound(it->second.begin(), it->second.end(),
                               now + static_cast<size_t>(std::max(distance, 0.0)));
  if (next == it->second.end()) return kNeverUsed;
  return static_cast<double>(*next - now);
}

std::vector<PredictedAccess> OracleAccessPredictor::Upcoming(size_t max_count) const {
  std::vector<PredictedAccess> out;
  absl::flat_hash_set<ShardKey> seen;
  const size_t now = position();
  for (size_t i = now; i < sequence_.size() && out.size() < max_count; ++i) {
    if (seen.insert(sequence_[i]).second) {
      out.push_back({sequence_[i], static_cast<double>(i - now)});
    }
  }
  return out;
}

std::vector<ShardKey> OracleAccessPredictor::Sequence(size_t max_len) const {
  const size_t now = std::min(position(), sequence_.size());
  const size_t end = now + std::min(max_len, sequence_.size() - now);
  return std::vector<ShardKey>(sequence_.begin() + static_cast<ptrdiff_t>(now),
                               sequence_.begin() + static_cast<ptrdiff_t>(end));
}

}  // namespace strata
