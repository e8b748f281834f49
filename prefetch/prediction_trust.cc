#include "prefetch/prediction_trust.h"

#include <cmath>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// Inserts `key` into a full-or-not shadow cache, evicting by `farther`
// (true when the first copy should go before the second); true on a miss.
template <typename Farther>
bool Touch(absl::flat_hash_map<ShardKey, uint64_t>& shadow, const ShardKey& key, uint64_t tick,
           size_t capacity, Farther farther) {
  auto it = shadow.find(key);
  if (it != shadow.end()) {
    it->second = tick;
    return false;
  }
  if (shadow.size() >= capacity) {
    std::optional<absl::flat_hash_map<ShardKey, uint64_t>::iterator> victim;
    for (auto c = shadow.begin(); c != shadow.end(); ++c) {
      if (!victim.has_value() || farther(*c, **victim)) victim = c;
    }
    shadow.erase(*victim);
  }
  shadow.emplace(key, tick);
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PredictionTrust>> PredictionTrust::Create(
    const PredictionTrustOptions& options) {
  if (options.capacity_shards == 0) {
    return absl::InvalidArgumentError("prediction trust: capacity_shards must be at least 1");
  }
  if (!(options.half_life_accesses >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prediction trust: half_life_accesses must be at least 1, got ", options.half_life_accesses));
  }
  if (!(options.hysteresis_misses >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prediction trust: hysteresis_misses must be >= 0, got ", options.hysteresis_misses));
  }
  return std::unique_ptr<PredictionTrust>(new PredictionTrust(options));
}

PredictionTrust::PredictionTrust(const PredictionTrustOptions& options)
    : options_(options), decay_(std::exp2(-1.0 / options.half_life_accesses)) {}

void PredictionTrust::OnAccess(const ShardKey& key, const AccessPredictor& predictor) {
  absl::MutexLock lock(&mu_);
  ++tick_;
  ++stats_.accesses;
  if (!trusted_) ++stats_.untrusted_accesses;
  predicted_score_ *= decay_;
  recency_score_ *= decay_;
  using Entry = std::pair<const ShardKey, uint64_t>;
  // Recency (the fallback rule, as FarthestNextUsePolicy applies it): the
  // least recently used goes, sparing copies predicted within a tier's worth
  // of accesses while any other is left.
  const bool recency_miss = !recency_.contains(key);
  if (recency_miss && recency_.size() >= options_.capacity_shards) {
    const double horizon = static_cast<double>(options_.capacity_shards);
    absl::flat_hash_map<ShardKey, bool> spared;
    for (const auto& [k, t] : recency_) spared[k] = predictor.NextUse(k) < horizon;
    Touch(recency_, key, tick_, options_.capacity_shards, [&spared](const Entry& a, const Entry& b) {
      const bool sa = spared[a.first];
      const bool sb = spared[b.first];
      return sa != sb ? sb : a.second < b.second;
    });
  } else {
    Touch(recency_, key, tick_, options_.capacity_shards,
          [](const Entry& a, const Entry& b) { return a.second < b.second; });
  }
  if (recency_miss) {
    recency_score_ += 1;
    ++stats_.recency_misses;
  }
  // The prediction: the farthest predicted next use goes, least recently
  // used among equals (what FarthestNextUsePolicy does on a demand miss).
  // The next uses are read once per miss, not once per comparison.
  if (!predicted_.contains(key)) {
    absl::flat_hash_map<ShardKey, double> next;
    if (predicted_.size() >= options_.capacity_shards) {
      for (const auto& [k, t] : predicted_) next[k] = predictor.NextUse(k);
    }
    Touch(predicted_, key, tick_, options_.capacity_shards, [&next](const Entry& a, const Entry& b) {
      const double na = next[a.first];
      const double nb = next[b.first];
      return na != nb ? na > nb : a.second < b.second;
    });
    predicted_score_ += 1;
    ++stats_.predicted_misses;
  } else {
    predicted_[key] = tick_;
  }
  const double h = options_.hysteresis_misses;
  const bool trusted = trusted_ ? !(recency_score_ + h < predicted_score_)
                                : predicted_score_ + h < recency_score_;
  if (trusted != trusted_) {
    trusted_ = trusted;
    ++stats_.switches;
  }
}

bool PredictionTrust::Trusted() const {
  absl::MutexLock lock(&mu_);
  return trusted_;
}

double PredictionTrust::predicted_score() const {
  absl::MutexLock lock(&mu_);
  return predicted_score_;
}

double PredictionTrust::recency_score() const {
  absl::MutexLock lock(&mu_);
  return recency_score_;
}

PredictionTrustStats PredictionTrust::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace strata
