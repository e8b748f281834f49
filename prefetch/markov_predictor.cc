#include "prefetch/markov_predictor.h"

#include <algorithm>

namespace strata {

void MarkovPredictor::Observe(const ShardKey& from, const ShardKey& to) {
  Row& row = rows_[from];
  ++row.counts[to];
  if (++row.total > max_total_) {
    row.total = 0;
    for (auto it = row.counts.begin(); it != row.counts.end();) {
      it->second /= 2;
      row.total += it->second;
      if (it->second == 0) {
        row.counts.erase(it++);
      } else {
        ++it;
      }
    }
  }
}

std::vector<std::pair<ShardKey, double>> MarkovPredictor::Successors(const ShardKey& from) const {
  std::vector<std::pair<ShardKey, double>> out;
  auto it = rows_.find(from);
  if (it == rows_.end() || it->second.total == 0) return out;
  for (const auto& [to, count] : it->second.counts) {
    out.emplace_back(to, static_cast<double>(count) / it->second.total);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return out;
}

std::optional<ShardKey> MarkovPredictor::MostLikely(const ShardKey& from) const {
  auto successors = Successors(from);
  if (successors.empty()) return std::nullopt;
  return successors.front().first;
}

}  // namespace strata
