#include "prefetch/learned_predictor.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace strata {
namespace {

ShardKey TensorOf(ShardKey key) {
  key.kind = TensorKind::kParam16;
  return key;
}

}  // namespace

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
  const bool known = keys_.contains(key);
  KeyStats& ks = keys_[key];
  ks.seen_this_iteration = true;
  tensors_this_iteration_.insert(TensorOf(key));
  ks.last_offset = tracer_.current().size();
  ks.offsets_current.push_back(static_cast<uint32_t>(tracer_.current().size()));
  tracer_.Record(key);
  if (last_key_.has_value()) markov_.Observe(*last_key_, key);
  last_key_ = key;
  const bool anchor = known && ConfidenceLocked(key) >= options_.min_confidence;
  switch (trace_.Observe(key, anchor)) {
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
  tensors_this_iteration_.clear();
  const double w = options_.frequency_weight;
  for (auto& [key, ks] : keys_) {
    ks.frequency = (1 - w) * ks.frequency + w * (ks.seen_this_iteration ? 1.0 : 0.0);
    if (ks.iterations_known > 0 && ks.seen_this_iteration != ks.present_last) ++ks.flips;
    ++ks.iterations_known;
    ks.present_last = ks.seen_this_iteration;
    if (ks.seen_this_iteration) {
      ks.offsets_last = std::move(ks.offsets_current);
      ks.offsets_current.clear();
    }
    ks.seen_this_iteration = false;
  }
}

double LearnedPredictor::ConfidenceLocked(const ShardKey& key) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) return 0.0;
  const KeyStats& ks = it->second;
  if (ks.present_last && ks.flips * 4 <= ks.iterations_known) return 1.0;
  return ks.frequency;
}

bool LearnedPredictor::SkippedThisIterationLocked(const ShardKey& key) const {
  auto it = keys_.find(key);
  if (it != keys_.end() && it->second.seen_this_iteration) return false;
  const int64_t first = trace_.FirstPosition(key);
  return first >= 0 && static_cast<size_t>(first) < tracer_.current().size();
}

bool LearnedPredictor::TensorUsedThisIterationLocked(const ShardKey& key) const {
  return tensors_this_iteration_.contains(TensorOf(key));
}

double LearnedPredictor::NextUseFrom(const ShardKey& key, double from) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(key);
  if (it == keys_.end()) return kNeverUsed;
  const KeyStats& ks = it->second;
  if (!trace_.has_trace()) {
    // The learning iteration: nothing is known about the rest of it, but a
    // training iteration repeats, so a shard's next use after this
    // iteration is at its first slot in it. Guess that the iteration is
    // half done (its end `now` accesses away): that ranks the shards by
    // where the next iteration needs them, and the prediction trust judges
    // the guess against recency. Nothing is prefetched from it (Upcoming
    // has only the Markov successors, Sequence nothing, until an iteration
    // is learned).
    if (!options_.guess_learning_iteration || ks.offsets_current.empty()) return kNeverUsed;
    const double now = static_cast<double>(tracer_.current().size());
    return std::max(now + static_cast<double>(ks.offsets_current.front()), from);
  }
  const double length = static_cast<double>(std::max<size_t>(trace_.trace().size(), 1));
  const double now = static_cast<double>(tracer_.current().size());  // offset of the next access
  const double rest_of_iteration = std::max(length - now, 0.0);
  // A shard present in a fraction p of iterations is, in expectation,
  // (1/p - 1) iterations later than its slot in a future iteration.
  const double penalty = (1.0 / std::max(ConfidenceLocked(key), 0.02) - 1.0) * length;
  const double start = std::max(from, 0.0);
  double distance = trace_.NextUseFrom(key, static_cast<size_t>(start));
  if (!ks.seen_this_iteration && TensorUsedThisIterationLocked(key)) {
    // Its tensor was used this iteration: its own slot later in this
    // iteration is certain (no presence penalty), where one is known.
    if (distance != kNeverUsed && distance < rest_of_iteration) return distance;
    for (uint32_t o : ks.offsets_last) {
      if (o >= now + start && o - now < rest_of_iteration) return o - now;
    }
  }
  if (ks.seen_this_iteration) {
    // Used this iteration: the rest of this iteration follows its pattern
    // with certainty; only later iterations are uncertain.
    if (distance != kNeverUsed && distance < rest_of_iteration) return distance;
    for (uint32_t o : ks.offsets_last) {
      if (o >= now + start && o - now < rest_of_iteration) return o - now;
    }
    if (distance != kNeverUsed) return distance + penalty;
  } else if (distance != kNeverUsed) {
    if (SkippedThisIterationLocked(key) && distance < rest_of_iteration) {
      distance = trace_.NextUseFrom(key, static_cast<size_t>(std::max(start, rest_of_iteration)));
    }
    return distance + penalty;
  }
  // Not in the learned trace (it skipped this shard last time): assume it
  // comes back where it was last seen in its iteration.
  const double offset = static_cast<double>(ks.last_offset);
  distance = offset >= now ? offset - now : rest_of_iteration + offset;
  while (distance < start) distance += length;
  return distance + penalty;
}

std::vector<PredictedAccess> LearnedPredictor::Upcoming(size_t max_count) const {
  absl::MutexLock lock(&mu_);
  std::vector<PredictedAccess> out;
  absl::flat_hash_set<ShardKey> seen;
  // Is the trace's next entry a shard that reliably appears? If not (no
  // trace, lost, or a data-dependent choice such as an expert), the Markov
  // successors of the current access that are likely enough go first.
  // The trace from the current position, one iteration's worth (collected
  // first: the analysis cannot see that the lambda runs under mu_).
  std::vector<std::pair<ShardKey, size_t>> ahead;
  if (trace_.has_trace() && !lost_) {
    trace_.Walk([&ahead](const ShardKey& key, size_t distance) {
      ahead.emplace_back(key, distance);
      return true;
    });
  }
  const bool trace_next_confident =
      !ahead.empty() && ConfidenceLocked(ahead.front().first) >= options_.min_confidence;
  if (!trace_next_confident && last_key_.has_value()) {
    for (const auto& [next, p] : markov_.Successors(*last_key_)) {
      if (p < options_.markov_min_probability || out.size() >= max_count) break;
      if (seen.insert(next).second) out.push_back({next, 0});
    }
  }
  if (trace_.has_trace() && !lost_) {
    const double rest = static_cast<double>(trace_.trace().size()) -
                        static_cast<double>(tracer_.current().size());
    for (const auto& [key, distance] : ahead) {
      if (out.size() >= max_count) break;
      if (static_cast<double>(distance) < rest && SkippedThisIterationLocked(key)) continue;
      const bool certain_now =
          static_cast<double>(distance) < rest && TensorUsedThisIterationLocked(key);
      if ((certain_now || ConfidenceLocked(key) >= options_.min_confidence) &&
          seen.insert(key).second) {
        out.push_back({key, static_cast<double>(distance)});
      }
    }
  } else if (last_key_.has_value()) {
    // No trace to follow: walk the most likely chain while the path stays
    // likely enough (a guess that is wrong costs a fetch and a victim).
    ShardKey at = *last_key_;
    double path = 1.0;
    for (size_t step = 1; step <= 2 * max_count && out.size() < max_count; ++step) {
      std::vector<std::pair<ShardKey, double>> next = markov_.Successors(at);
      if (next.empty()) break;
      path *= next.front().second;
      if (path < options_.markov_min_probability) break;
      if (seen.insert(next.front().first).second) {
        out.push_back({next.front().first, static_cast<double>(step - 1)});
      }
      at = next.front().first;
    }
  }
  return out;
}

std::vector<ShardKey> LearnedPredictor::Sequence(size_t max_len) const {
  absl::MutexLock lock(&mu_);
  std::vector<ShardKey> out;
  if (!trace_.has_trace() || lost_ || max_len == 0) return out;
  trace_.Walk([&out, max_len](const ShardKey& key, size_t) {
    out.push_back(key);
    return out.size() < max_len;
  });
  // Walk visits one iteration from the position (wrapping); the iterations
  // after it repeat that.
  const size_t period = out.size();
  for (size_t i = period; i < max_len && period > 0; ++i) out.push_back(out[i - period]);
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
