#include "prefetch/learned_predictor.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace strata {

void LearnedPredictor::OnAccess(const ShardKey& key) {
  absl::MutexLock lock(&mu_);
  // Walked past the end of the learned trace and starting over: that is an
  // iteration boundary the client did not mark.
  if (options_.detect_boundaries && trace_.has_trace() && trace_.at_end() &&
      !tracer_.current().empty() && key == trace_.trace().front()) {
    ++stats_.detected_boundaries;
    EndIterationLocked();
  }
  ++stats_.accesses;
  KeyStats& ks = keys_[key];
  ks.seen_this_iteration = true;
  ks.last_offset = tracer_.current().size();
  tracer_.Record(key);
  if (last_key_.has_value()) markov_.Observe(*last_key_, key);
  last_key_ = key;
  switch (trace_.Observe(key)) {
    case TracePredictor::Match::kMatched:
      ++stats_.matched;
      lost_ = false;
      break;
    case TracePredictor::Match::kSkipped:
    case TracePredictor::Match::kResynced:
      ++stats_.deviations;
      lost_ = false;
      break;
    case TracePredictor::Match::kExtra:
      ++stats_.deviations;
      lost_ = true;
      break;
    case TracePredictor::Match::kNoTrace:
      break;
  }
}

void LearnedPredictor::MarkIterationBoundary() {
  absl::MutexLock lock(&mu_);
  EndIterationLocked();
}

void LearnedPredictor::EndIterationLocked() {
  if (tracer_.current().empty()) return;  // a boundary we already detected
  tracer_.EndIteration();
  ++stats_.iterations;
  if (trace_.EndIteration(tracer_.last_iteration(), tracer_.previous_iteration())) {
    ++stats_.relearns;
  }
  lost_ = false;
  const double w = options_.frequency_weight;
  for (auto& [key, ks] : keys_) {
    ks.frequency = (1 - w) * ks.frequency + w * (ks.seen_this_iteration ? 1.0 : 0.0);
    ks.seen_this_iteration = false;
  }
}

double LearnedPredictor::FrequencyLocked(const ShardKey& key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? 0.0 : it->second.frequency;
}

double LearnedPredictor::NextUseFrom(const ShardKey& key, double from) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(key);
  // Nothing learned yet: no prediction, so the policy falls back to LRU.
  if (it == keys_.end() || !trace_.has_trace()) return kNeverUsed;
  const double length = static_cast<double>(std::max<size_t>(trace_.trace().size(), 1));
  double distance = trace_.NextUseFrom(key, static_cast<size_t>(std::max(from, 0.0)));
  if (distance == kNeverUsed) {
    // Not in the learned trace (it skipped this shard last time): assume it
    // comes back where it was last seen in its iteration.
    const double offset = static_cast<double>(it->second.last_offset);
    const double now = static_cast<double>(trace_.position());
    distance = offset >= now ? offset - now : length - now + offset;
    while (distance < from) distance += length;
  }
  // A shard present in a fraction p of iterations is, in expectation,
  // (1/p - 1) iterations later than its slot.
  const double p = std::max(it->second.frequency, 0.02);
  return distance + (1.0 / p - 1.0) * length;
}

std::vector<PredictedAccess> LearnedPredictor::Upcoming(size_t max_count) const {
  absl::MutexLock lock(&mu_);
  std::vector<PredictedAccess> out;
  absl::flat_hash_set<ShardKey> seen;
  // Is the trace's next entry a shard that reliably appears? If not (no
  // trace, lost, or a data-dependent choice such as an expert), the Markov
  // successors of the current access that are likely enough go first.
  bool trace_next_confident = false;
  if (trace_.has_trace() && !lost_) {
    trace_.Walk([&](const ShardKey& key, size_t) {
      trace_next_confident = FrequencyLocked(key) >= options_.min_confidence;
      return false;
    });
  }
  if (!trace_next_confident && last_key_.has_value()) {
    for (const auto& [next, p] : markov_.Successors(*last_key_)) {
      if (p < options_.markov_min_probability || out.size() >= max_count) break;
      if (seen.insert(next).second) out.push_back({next, 0});
    }
  }
  if (trace_.has_trace() && !lost_) {
    trace_.Walk([&](const ShardKey& key, size_t distance) {
      if (out.size() >= max_count) return false;
      if (FrequencyLocked(key) >= options_.min_confidence && seen.insert(key).second) {
        out.push_back({key, static_cast<double>(distance)});
      }
      return true;
    });
  } else if (last_key_.has_value()) {
    // No trace to follow: walk the most likely chain.
    ShardKey at = *last_key_;
    for (size_t step = 1; step <= 2 * max_count && out.size() < max_count; ++step) {
      std::optional<ShardKey> next = markov_.MostLikely(at);
      if (!next.has_value()) break;
      if (seen.insert(*next).second) out.push_back({*next, static_cast<double>(step - 1)});
      at = *next;
    }
  }
  return out;
}

LearnedPredictorStats LearnedPredictor::stats() const {
  absl::MutexLock lock(&mu_);
  LearnedPredictorStats s = stats_;
  s.relearns = trace_.relearns();
  return s;
}

std::vector<ShardKey> LearnedPredictor::learned_trace() const {
  absl::MutexLock lock(&mu_);
  return trace_.trace();
}

}  // namespace strata
