#include "prefetch/prefetch_scheduler.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <utility>

namespace strata {

PrefetchScheduler::PrefetchScheduler(TieredStore* store, const AccessPredictor* predictor,
                                     const PrefetchSchedulerOptions& options)
    : store_(store), predictor_(predictor), options_(options) {}

bool PrefetchScheduler::MinDropsBeforeNextUse(const ShardKey& victim, double victim_next,
                                              absl::Span<const TieredStore::CachedCopy> cached) const {
  if (victim_next == kNeverUsed) return true;
  // Replay far enough to reach the victim's predicted next use.
  constexpr size_t kMaxReplay = 1 << 14;
  const size_t len = static_cast<size_t>(std::min(victim_next + 1, static_cast<double>(kMaxReplay)));
  const std::vector<ShardKey> seq = predictor_->Sequence(len);
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  // next[i]: where seq[i]'s key comes next; first: its first position.
  std::vector<size_t> next(seq.size(), kNever);
  absl::flat_hash_map<ShardKey, size_t> first;
  for (size_t i = seq.size(); i-- > 0;) {
    auto [it, inserted] = first.try_emplace(seq[i], i);
    if (!inserted) {
      next[i] = it->second;
      it->second = i;
    }
  }
  auto victim_it = first.find(victim);
  // Not in the replay: only a use predicted beyond kMaxReplay counts as
  // "dropped anyway"; a victim the sequence does not know stays protected.
  if (victim_it == first.end()) return victim_next >= static_cast<double>(kMaxReplay);
  const size_t target = victim_it->second;
  // MIN over seq[0, target) from the tier as it is, `capacity` copies: on a
  // miss it drops the copy whose next use is farthest.
  const size_t capacity = cached.size();
  std::set<std::pair<size_t, ShardKey>> by_next;  // farthest last
  absl::flat_hash_map<ShardKey, size_t> held;     // key -> its next use
  for (const TieredStore::CachedCopy& c : cached) {
    auto f = first.find(c.key);
    const size_t nu = f == first.end() ? kNever : f->second;
    held[c.key] = nu;
    by_next.insert({nu, c.key});
  }
  for (size_t i = 0; i < target; ++i) {
    auto h = held.find(seq[i]);
    if (h != held.end()) {
      by_next.erase({h->second, seq[i]});
      h->second = next[i];
      by_next.insert({next[i], seq[i]});
      continue;
    }
    if (held.size() >= capacity && !by_next.empty()) {
      auto farthest = std::prev(by_next.end());
      if (farthest->second == victim) return true;
      held.erase(farthest->second);
      by_next.erase(farthest);
    }
    held[seq[i]] = next[i];
    by_next.insert({next[i], seq[i]});
  }
  return false;
}

bool PrefetchScheduler::UrgencyIsHarmless(absl::Span<const TieredStore::CachedCopy> cached) {
  // The copy the policy's urgent path would evict: the unpinned one used
  // farthest away.
  const TieredStore::CachedCopy* victim = nullptr;
  double victim_next = -1;
  for (const TieredStore::CachedCopy& c : cached) {
    if (c.pinned) continue;
    const double next = predictor_->NextUse(c.key);
    if (next > victim_next) {
      victim_next = next;
      victim = &c;
    }
  }
  if (victim == nullptr) return false;  // nothing evictable
  const bool harmless = MinDropsBeforeNextUse(victim->key, victim_next, cached);
  if (!harmless) ++stats_.urgency_withheld;
  return harmless;
}

std::vector<IssuedPrefetch> PrefetchScheduler::Pump() {
  ++stats_.pumps;
  std::vector<IssuedPrefetch> issued;
  if (options_.trust != nullptr && !options_.trust->Trusted()) {
    ++stats_.untrusted_pumps;
    return issued;
  }
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                  [](const TransferHandle& t) { return t->done(); }),
                   in_flight_.end());
  uint64_t window_bytes = 0;
  size_t still_to_fetch = 0;  // window shards neither resident nor arriving
  double first_waiting = -1;  // the distance of the nearest of them
  bool refused = false;
  // Whether urgency may be used now: decided when an urgent candidate comes
  // up, again after each urgent promotion (which took its victim).
  bool urgency_known = false;
  bool urgency_allowed = false;
  std::vector<TieredStore::CachedCopy> cached;
  bool cached_read = false;
  auto read_cached = [&]() -> const std::vector<TieredStore::CachedCopy>& {
    if (!cached_read) {
      cached = store_->CachedCopies(options_.tier);
      cached_read = true;
    }
    return cached;
  };
  for (const PredictedAccess& next : predictor_->Upcoming(options_.lookahead_count)) {
    auto size_it = sizes_.find(next.key);
    if (size_it == sizes_.end()) {
      absl::StatusOr<ShardInfo> info = store_->Describe(next.key);
      if (!info.ok()) continue;  // not (or no longer) in the store
      size_it = sizes_.emplace(next.key, info->size_bytes).first;
    }
    if (window_bytes + size_it->second > options_.lookahead_bytes) break;
    window_bytes += size_it->second;
    if (store_->IsResident(next.key, options_.tier) || store_->IsInFlight(next.key, options_.tier)) {
      continue;
    }
    ++still_to_fetch;
    // After a refusal everything farther would be refused too; keep
    // counting what the window still needs, for the write-backs below.
    if (refused || in_flight_.size() >= options_.max_in_flight) {
      if (first_waiting < 0) first_waiting = next.distance;
      continue;
    }
    bool urgent = next.distance < static_cast<double>(options_.urgent_distance);
    if (urgent && options_.adaptive_urgency) {
      if (!urgency_known) {
        urgency_allowed = UrgencyIsHarmless(read_cached());
        urgency_known = true;
      }
      urgent = urgency_allowed;
    }
    absl::StatusOr<TransferHandle> transfer =
        store_->Promote(next.key, options_.tier, {.prefetch = true, .urgent = urgent});
    if (!transfer.ok()) {
      ++stats_.refused;
      refused = true;
      if (first_waiting < 0) first_waiting = next.distance;
      continue;
    }
    --still_to_fetch;
    ++stats_.issued;
    if (urgent) {
      ++stats_.urgent;
      urgency_known = false;  // the next urgent one would evict another copy
    }
    cached_read = false;  // the promotion may have evicted
    if (!(*transfer)->done()) in_flight_.push_back(*transfer);
    issued.push_back({next.key, *transfer});
  }
  if (options_.write_backs_per_pump == 0 || still_to_fetch == 0) return issued;
  // Belady's next victims: when the nearest shard still waiting (at
  // distance d) gets its room, MIN drops the copies whose use *after d* is
  // farthest, one per shard still to fetch. Those are copies used before d,
  // too (the one in use now, typically), so rank by NextUseFrom(d), not by
  // the next use. Clean the dirty ones among them now, so that their
  // eviction is a drop instead of a write-back on the critical path.
  std::vector<std::pair<double, TieredStore::CachedCopy>> ranked;
  for (const TieredStore::CachedCopy& c : read_cached()) {
    ranked.emplace_back(predictor_->NextUseFrom(c.key, std::max(first_waiting, 0.0)), c);
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second.key < b.second.key;
  });
  size_t written = 0;
  for (size_t i = 0; i < ranked.size() && i < still_to_fetch; ++i) {
    const TieredStore::CachedCopy& c = ranked[i].second;
    if (!c.dirty || c.pinned || written >= options_.write_backs_per_pump) continue;
    absl::StatusOr<TransferHandle> transfer = store_->WriteBack(c.key);
    if (!transfer.ok()) continue;
    ++written;
    ++stats_.write_backs;
    issued.push_back({c.key, *transfer, true});
  }
  return issued;
}

}  // namespace strata
