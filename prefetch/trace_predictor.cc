#include "prefetch/trace_predictor.h"

#include <algorithm>
#include <utility>

#include "prefetch/access_predictor.h"

namespace strata {

void TracePredictor::Learn(std::vector<ShardKey> trace) {
  trace_ = std::move(trace);
  positions_.clear();
  for (size_t i = 0; i < trace_.size(); ++i) positions_[trace_[i]].push_back(i);
  pos_ = 0;
  extra_in_a_row_ = 0;
  deviations_ = 0;
}

TracePredictor::Match TracePredictor::Observe(const ShardKey& key, bool anchor) {
  if (trace_.empty()) return Match::kNoTrace;
  if (pos_ < trace_.size() && trace_[pos_] == key) {
    ++pos_;
    extra_in_a_row_ = 0;
    return Match::kMatched;
  }
  ++deviations_;
  const size_t end = std::min(trace_.size(), pos_ + 1 + options_.resync_window);
  for (size_t j = pos_ + 1; j < end; ++j) {
    if (trace_[j] == key) {  // the entries in between were skipped
      pos_ = j + 1;
      extra_in_a_row_ = 0;
      return Match::kSkipped;
    }
  }
  if (++extra_in_a_row_ < options_.lost_after || !anchor) return Match::kExtra;
  // Lost: look for the key anywhere further on.
  auto it = positions_.find(key);
  if (it != positions_.end()) {
    auto next = std::lower_bound(it->second.begin(), it->second.end(), pos_);
    if (next != it->second.end()) {
      pos_ = *next + 1;
      extra_in_a_row_ = 0;
      return Match::kResynced;
    }
  }
  return Match::kExtra;
}

bool TracePredictor::EndIteration(const std::vector<ShardKey>& recorded,
                                  const std::vector<ShardKey>& previous) {
  bool relearn = false;
  if (trace_.empty()) {
    relearn = !recorded.empty();
  } else if (recorded != trace_) {
    const double fraction =
        static_cast<double>(deviations_ + (trace_.size() > pos_ ? trace_.size() - pos_ : 0)) /
        static_cast<double>(std::max<size_t>(trace_.size(), 1));
    // Many deviations: the pattern changed. A few, repeated identically: it
    // changed a little but for good. A few, once: noise; keep the trace.
    relearn = fraction > options_.relearn_fraction || recorded == previous;
  }
  if (relearn) {
    Learn(recorded);
    ++relearns_;
  }
  pos_ = 0;
  extra_in_a_row_ = 0;
  deviations_ = 0;
  return relearn;
}

double TracePredictor::NextUseFrom(const ShardKey& key, size_t distance) const {
  auto it = positions_.find(key);
  if (it == positions_.end()) return kNeverUsed;
  const std::vector<size_t>& at = it->second;
  const size_t n = trace_.size();
  // Absolute target in "trace coordinates" (iteration * n + index).
  const size_t target = pos_ + distance;
  const size_t round = target / n;
  const size_t index = target % n;
  auto next = std::lower_bound(at.begin(), at.end(), index);
  const size_t found = next != at.end() ? round * n + *next : (round + 1) * n + at.front();
  return static_cast<double>(found - pos_);
}

void TracePredictor::Walk(const std::function<bool(const ShardKey&, size_t)>& visit) const {
  const size_t n = trace_.size();
  size_t distance = 0;
  for (size_t i = pos_; i < n; ++i, ++distance) {
    if (!visit(trace_[i], distance)) return;
  }
  for (size_t i = 0; i < std::min(pos_, n); ++i, ++distance) {
    if (!visit(trace_[i], distance)) return;
  }
}

}  // namespace strata
