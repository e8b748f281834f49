#include "tiers/tiered_store.h"

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/status_macros.h"

namespace strata {
namespace {

// Host staging memory for copies between two tiers that are not
// host-addressable (device <-> NVMe); aligned for O_DIRECT.
struct AlignedDelete {
  size_t alignment;
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(alignment)); }
};
using StagingBuffer = std::unique_ptr<std::byte[], AlignedDelete>;

StagingBuffer NewStaging(uint64_t size, size_t alignment) {
  return StagingBuffer(new (std::align_val_t(alignment)) std::byte[size], AlignedDelete{alignment});
}

// Writes `src` into `slot` of `t`, through an aligned copy when the tier
// needs aligned host buffers (O_DIRECT) and `src` is not.
absl::Status WriteFromHost(Tier* t, const TierSlot& slot, absl::Span<const std::byte> src) {
  if (t->host_buffer_alignment() > 1 && reinterpret_cast<uintptr_t>(src.data()) % t->host_buffer_alignment() != 0) {
    const size_t align = std::max<size_t>(4096, t->host_buffer_alignment());
    StagingBuffer staging = NewStaging(std::max<uint64_t>(src.size(), 1), align);
    std::copy(src.begin(), src.end(), staging.get());
    return t->Write(slot, absl::MakeConstSpan(staging.get(), src.size()));
  }
  return t->Write(slot, src);
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

std::string ShardTier(const ShardKey& key, TierKind tier) {
  return absl::StrCat(ShardKeyToString(key), " in ", TierKindName(tier));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TieredStore>> TieredStore::Create(
    std::vector<Tier*> tiers, const TieredStoreOptions& options) {
  if (options.clock == nullptr || options.executor == nullptr) {
    return absl::InvalidArgumentError("tiered store: a clock and an executor are required");
  }
  if (tiers.empty()) return absl::InvalidArgumentError("tiered store: no tiers");
  std::array<bool, kNumTiers> seen{};
  for (Tier* t : tiers) {
    if (t == nullptr) return absl::InvalidArgumentError("tiered store: null tier");
    if (seen[TierIndex(t->kind())]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tiered store: two tiers of kind ", TierKindName(t->kind())));
    }
    seen[TierIndex(t->kind())] = true;
  }
  return std::unique_ptr<TieredStore>(new TieredStore(std::move(tiers), options));
}

namespace {
std::array<Tier*, kNumTiers> ByKind(const std::vector<Tier*>& tiers) {
  std::array<Tier*, kNumTiers> by_kind{};
  for (Tier* t : tiers) by_kind[TierIndex(t->kind())] = t;
  return by_kind;
}
}  // namespace

TieredStore::TieredStore(std::vector<Tier*> tiers, const TieredStoreOptions& options)
    : tiers_(ByKind(tiers)),
      options_(options),
      policy_(options.policy != nullptr ? options.policy : &default_policy_) {}

TieredStore::~TieredStore() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &TieredStore::NoOpsInFlight));
  for (auto& [key, shard] : shards_) {
    for (int i = 0; i < kNumTiers; ++i) {
      Copy& c = shard->copies[i];
      if (c.state != CopyState::kAbsent && c.slot.valid()) tiers_[i]->Free(c.slot);
    }
  }
}

absl::Status TieredStore::SetJobBudget(JobId job, TierKind t, uint64_t bytes) {
  if (!has_tier(t)) {
    return absl::InvalidArgumentError(absl::StrCat("no ", TierKindName(t), " tier configured"));
  }
  absl::MutexLock lock(&mu_);
  if (bytes == 0) {
    job_budget_.erase({job, TierIndex(t)});
  } else {
    job_budget_[{job, TierIndex(t)}] = bytes;
  }
  return absl::OkStatus();
}

TieredStore::Shard* TieredStore::FindLocked(const ShardKey& key) const {
  auto it = shards_.find(key);
  return it == shards_.end() ? nullptr : it->second.get();
}

bool TieredStore::IsCurrentLocked(const Shard& shard, TierKind t) const {
  const Copy& c = shard.copies[TierIndex(t)];
  return c.state == CopyState::kResident && c.version == shard.version;
}

std::optional<TierKind> TieredStore::SourceLocked(const Shard& shard, TierKind exclude) const {
  for (int i = 0; i < kNumTiers; ++i) {
    const TierKind t = static_cast<TierKind>(i);
    if (t == exclude || tiers_[i] == nullptr) continue;
    if (IsCurrentLocked(shard, t)) return t;
  }
  return std::nullopt;
}

bool TieredStore::NeedsWriteBackLocked(const Shard& shard, TierKind t) const {
  if (t == shard.home) return false;
  const Copy& c = shard.copies[TierIndex(t)];
  if (c.version != shard.version) return false;  // stale: newer data lives elsewhere
  if (shard.copies[TierIndex(shard.home)].version == shard.version) return false;
  for (int i = 0; i < kNumTiers; ++i) {
    const TierKind u = static_cast<TierKind>(i);
    if (u == t || u == shard.home) continue;
    // Another current cached copy survives this one and carries the data.
    if (IsCurrentLocked(shard, u)) return false;
  }
  return true;
}

void TieredStore::UnchargeLocked(Shard& shard, TierKind t) {
  Copy& c = shard.copies[TierIndex(t)];
  if (!c.charged) return;
  const uint64_t fp = tier(t)->FootprintBytes(shard.size_bytes);
  charged_[TierIndex(t)] -= fp;
  job_charged_[{shard.key.job, TierIndex(t)}] -= fp;
  c.charged = false;
}

void TieredStore::DropCopyLocked(Shard& shard, TierKind t) {
  Copy& c = shard.copies[TierIndex(t)];
  UnchargeLocked(shard, t);
  cached_[TierIndex(t)].erase(&shard);
  if (c.prefetched_unused) CountWastedLocked(shard.key.job, t);
  if (c.slot.valid()) tier(t)->Free(c.slot);
  c = Copy{};
}

void TieredStore::DropStaleLocked(Shard& shard) {
  for (int i = 0; i < kNumTiers; ++i) {
    const TierKind t = static_cast<TierKind>(i);
    Copy& c = shard.copies[i];
    if (t == shard.home || c.state != CopyState::kResident) continue;
    if (c.version < shard.version && c.pins == 0 && c.io_refs == 0) DropCopyLocked(shard, t);
  }
}

void TieredStore::EvictLocked(Shard& shard, TierKind t, std::vector<PendingWriteBack>* write_backs) {
  Copy& c = shard.copies[TierIndex(t)];
  ++stats_.tiers[TierIndex(t)].evictions;
  ++job_stats_[shard.key.job].tiers[TierIndex(t)].evictions;
  if (NeedsWriteBackLocked(shard, t)) {
    UnchargeLocked(shard, t);
    cached_[TierIndex(t)].erase(&shard);
    if (c.prefetched_unused) CountWastedLocked(shard.key.job, t);
    c.prefetched_unused = false;
    c.state = CopyState::kEvicting;
    write_backs->push_back({&shard, t});
  } else {
    DropCopyLocked(shard, t);
  }
}

absl::Status TieredStore::ChargeLocked(Shard& shard, TierKind t, uint64_t footprint, bool demand,
                                       bool urgent, std::vector<PendingWriteBack>* write_backs) {
  const int ti = TierIndex(t);
  const std::pair<JobId, int> job_key{shard.key.job, ti};
  const uint64_t capacity = tier(t)->capacity_bytes();
  auto budget_it = job_budget_.find(job_key);
  const uint64_t budget = budget_it == job_budget_.end() ? 0 : budget_it->second;
  if (footprint > capacity || (budget != 0 && footprint > budget)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        ShardKeyToString(shard.key), " (", FormatBytes(footprint), ") can never fit in ",
        tier(t)->name(), " (capacity ", FormatBytes(capacity),
        budget != 0 ? absl::StrCat(", job budget ", FormatBytes(budget)) : "", ")"));
  }
  bool expired_once = false;
  while (true) {
    const uint64_t job_charged = job_charged_[job_key];
    const uint64_t tier_charged = charged_[ti];
    uint64_t freed = 0;
    uint64_t freed_job = 0;
    auto tier_fits = [&] { return tier_charged - freed + footprint <= capacity; };
    auto job_fits = [&] { return budget == 0 || job_charged - freed_job + footprint <= budget; };
    std::vector<Shard*> chosen;
    bool refused = false;
    if (!tier_fits() || !job_fits()) {
      std::vector<Shard*> owners;
      for (Shard* s : cached_[ti]) {
        const Copy& c = s->copies[ti];
        if (s == &shard || c.state != CopyState::kResident || c.io_refs > 0) continue;
        owners.push_back(s);  // pinned ones too: the policy may want to wait for them
      }
      // Deterministic candidate order (the set's is not), so the simulated
      // benchmark and tests repeat exactly.
      std::sort(owners.begin(), owners.end(),
                [](const Shard* a, const Shard* b) { return a->key < b->key; });
      EvictionRequest request{t, shard.key, demand, urgent};
      while (!tier_fits() || !job_fits()) {
        // When the job's budget binds, only its own copies help.
        const bool job_bound = !job_fits();
        std::vector<EvictionCandidate> candidates;
        std::vector<size_t> index;
        bool any_unpinned = false;
        for (size_t i = 0; i < owners.size(); ++i) {
          Shard* s = owners[i];
          if (s == nullptr || (job_bound && s->key.job != shard.key.job)) continue;
          const Copy& c = s->copies[ti];
          candidates.push_back({s->key, tier(t)->FootprintBytes(s->size_bytes), c.last_use_tick,
                                NeedsWriteBackLocked(*s, t), c.prefetched_unused, c.pins > 0});
          index.push_back(i);
          any_unpinned = any_unpinned || c.pins == 0;
        }
        if (!any_unpinned) break;
        std::optional<size_t> pick = policy_->ChooseVictim(request, candidates);
        if (!pick.has_value() || *pick >= candidates.size() || candidates[*pick].pinned) {
          refused = true;
          break;
        }
        Shard* victim = owners[index[*pick]];
        owners[index[*pick]] = nullptr;
        chosen.push_back(victim);
        const uint64_t fp = tier(t)->FootprintBytes(victim->size_bytes);
        freed += fp;
        if (victim->key.job == shard.key.job) freed_job += fp;
      }
    }
    if (tier_fits() && job_fits()) {
      for (Shard* victim : chosen) EvictLocked(*victim, t, write_backs);
      charged_[ti] += footprint;
      job_charged_[job_key] += footprint;
      return absl::OkStatus();
    }
    if (!refused && !expired_once && ExpireLeasesLocked(options_.clock->Now()) > 0) {
      expired_once = true;
      continue;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "no room for ", ShardKeyToString(shard.key), " (", FormatBytes(footprint), ") in ",
        tier(t)->name(), ": ", FormatBytes(charged_[ti]), " of ", FormatBytes(capacity),
        " charged",
        budget != 0 ? absl::StrCat(", job ", FormatBytes(job_charged), " of ", FormatBytes(budget))
                    : "",
        refused ? "; the eviction policy keeps every copy (all needed sooner)"
                : "; every other copy is pinned or moving"));
  }
}

absl::StatusOr<TierSlot> TieredStore::AllocateChargedLocked(Shard& shard, TierKind t, bool demand,
                                                           bool urgent) {
  const int ti = TierIndex(t);
  Tier* const slots = tier(t);
  const uint64_t need = slots->FootprintBytes(shard.size_bytes);
  while (true) {
    absl::StatusOr<TierSlot> slot = slots->Allocate(shard.key, shard.size_bytes);
    if (slot.ok() || !absl::IsResourceExhausted(slot.status())) return slot;
    // Victims of other transfers still hold their slots: wait for those
    // (they are running, so they end without us).
    if (slots_releasing_[ti] > 0) {
      changed_.Wait(&mu_);
      continue;
    }
    const std::optional<Tier::FreeSpace> space = slots->FreeSpaceFor(shard.key);
    if (!space.has_value() || space->free_bytes < need) return slot;  // full, not fragmented
    // Fragmented. Candidates: the job's own copies that may be dropped now.
    std::vector<Shard*> owners;
    for (Shard* s : cached_[ti]) {
      const Copy& c = s->copies[ti];
      if (s == &shard || s->key.job != shard.key.job || c.state != CopyState::kResident || c.pins > 0 ||
          c.io_refs > 0) {
        continue;
      }
      owners.push_back(s);
    }
    if (owners.empty()) {
      // Copies of the job being filled now hold slots and become evictable
      // when done (unless their acquirer pins them): wait for those, never
      // for transfers that have not started.
      bool filling = false;
      for (const auto& [key, other] : shards_) {
        const Copy& c = other->copies[ti];
        if (key.job == shard.key.job && other.get() != &shard && t != other->home &&
            c.state == CopyState::kLoading && c.slot.valid()) {
          filling = true;
          break;
        }
      }
      if (filling) {
        changed_.Wait(&mu_);
        continue;
      }
      return FragmentedErrorLocked(shard, t, *space, "every other copy of the job there is pinned or moving");
    }
    std::sort(owners.begin(), owners.end(), [](const Shard* a, const Shard* b) { return a->key < b->key; });
    // Prefer copies whose freeing alone leaves a range that fits (2), then
    // copies next to free space, which grow a free range (1), then any (0).
    std::vector<int> level(owners.size());
    int best = 0;
    for (size_t i = 0; i < owners.size(); ++i) {
      const TierSlot& victim_slot = owners[i]->copies[ti].slot;
      const uint64_t after = slots->FreeRangeAfterFreeing(victim_slot);
      level[i] = after >= need ? 2 : after > victim_slot.footprint_bytes ? 1 : 0;
      best = std::max(best, level[i]);
    }
    std::vector<EvictionCandidate> candidates;
    std::vector<Shard*> from;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (level[i] != best) continue;
      const Shard* s = owners[i];
      const Copy& c = s->copies[ti];
      candidates.push_back({s->key, slots->FootprintBytes(s->size_bytes), c.last_use_tick,
                            NeedsWriteBackLocked(*s, t), c.prefetched_unused, false});
      from.push_back(owners[i]);
    }
    EvictionRequest request{t, shard.key, demand, urgent};
    std::optional<size_t> pick = policy_->ChooseVictim(request, candidates);
    if (!pick.has_value() || *pick >= candidates.size()) {
      // A prefetch the policy does not make room for; a client waiting now
      // gets room regardless (as ChargeLocked's demand rule).
      if (!demand) {
        return FragmentedErrorLocked(shard, t, *space, "the eviction policy keeps every copy (all needed sooner)");
      }
      pick = 0;
    }
    std::vector<PendingWriteBack> write_backs;
    EvictLocked(*from[*pick], t, &write_backs);
    changed_.SignalAll();
    if (!write_backs.empty()) {
      ++slots_releasing_[ti];
      mu_.Unlock();
      absl::Status written = RunWriteBacks(write_backs);
      mu_.Lock();
      --slots_releasing_[ti];
      changed_.SignalAll();
      if (!written.ok()) return written;
    }
  }
}

absl::Status TieredStore::FragmentedErrorLocked(const Shard& shard, TierKind t, const Tier::FreeSpace& space,
                                                absl::string_view why) const {
  const int ti = TierIndex(t);
  auto budget_it = job_budget_.find({shard.key.job, ti});
  auto charged_it = job_charged_.find({shard.key.job, ti});
  const uint64_t charged = charged_it == job_charged_.end() ? 0 : charged_it->second;
  const std::string bound =
      budget_it != job_budget_.end()
          ? absl::StrCat("the job's budget of ", FormatBytes(budget_it->second))
          : absl::StrCat("the tier's capacity of ", FormatBytes(tier(t)->capacity_bytes()));
  return absl::ResourceExhaustedError(absl::StrCat(
      "no room for ", ShardKeyToString(shard.key), " (", FormatBytes(tier(t)->FootprintBytes(shard.size_bytes)),
      " requested) in ", tier(t)->name(), ": fragmented: ", bound, " allows it (", FormatBytes(charged),
      " charged with it) and ", FormatBytes(space.free_bytes), " are free, but the largest free range is ",
      FormatBytes(space.largest_free_range), "; ", why));
}

size_t TieredStore::ExpireLeasesLocked(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, record] : leases_) {
    if (record.deadline <= now) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    LeaseRecord record = leases_[id];
    leases_.erase(id);
    Copy& c = record.shard->copies[TierIndex(record.tier)];
    --c.pins;
    if (record.mode == AccessMode::kWrite) --c.writers;
    ++stats_.leases_expired;
    DropStaleLocked(*record.shard);
  }
  if (!expired.empty()) changed_.SignalAll();
  return expired.size();
}

size_t TieredStore::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  return ExpireLeasesLocked(options_.clock->Now());
}

absl::Status TieredStore::RunWriteBacks(const std::vector<PendingWriteBack>& write_backs,
                                        uint64_t* bytes_written) {
  absl::Status status;
  for (const PendingWriteBack& wb : write_backs) {
    absl::Status s = WriteBackData(*wb.shard, wb.tier);
    absl::MutexLock lock(&mu_);
    Copy& vc = wb.shard->copies[TierIndex(wb.tier)];
    Copy& home = wb.shard->copies[TierIndex(wb.shard->home)];
    if (s.ok()) {
      home.version = std::max(home.version, vc.version);
      ++stats_.tiers[TierIndex(wb.tier)].write_backs;
      CountMoveLocked(wb.shard->key.job, wb.tier, wb.shard->home, wb.shard->size_bytes);
      if (bytes_written != nullptr) *bytes_written += wb.shard->size_bytes;
      tier(wb.tier)->Free(vc.slot);
      vc = Copy{};
    } else {
      // The data must not be lost: the victim stays, dirty and charged
      // again (which may briefly exceed a budget another transfer took
      // meanwhile), and the caller's operation fails.
      vc.state = CopyState::kResident;
      vc.charged = true;
      const uint64_t fp = tier(wb.tier)->FootprintBytes(wb.shard->size_bytes);
      charged_[TierIndex(wb.tier)] += fp;
      job_charged_[{wb.shard->key.job, TierIndex(wb.tier)}] += fp;
      cached_[TierIndex(wb.tier)].insert(wb.shard);
      if (status.ok()) status = s;
    }
    changed_.SignalAll();
  }
  return status;
}

absl::Status TieredStore::AddShard(const ShardKey& key, TierKind home,
                                   absl::Span<const std::byte> data) {
  return PlaceHome(key, home, data.size(), &data);
}

absl::Status TieredStore::AdoptShard(const ShardKey& key, TierKind home, uint64_t size_bytes) {
  return PlaceHome(key, home, size_bytes, nullptr);
}

absl::Status TieredStore::PlaceHome(const ShardKey& key, TierKind home, uint64_t size_bytes,
                                    const absl::Span<const std::byte>* data) {
  const char* verb = data != nullptr ? "adding " : "adopting ";
  if (!has_tier(home)) {
    return absl::InvalidArgumentError(
        absl::StrCat(verb, ShardKeyToString(key), ": no ", TierKindName(home), " tier"));
  }
  Tier* home_tier = tier(home);
  std::vector<PendingWriteBack> write_backs;
  Shard* shard;
  {
    absl::MutexLock lock(&mu_);
    if (shards_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat(ShardKeyToString(key), " already exists"));
    }
    auto owned = std::make_unique<Shard>();
    shard = owned.get();
    shard->key = key;
    shard->size_bytes = size_bytes;
    shard->home = home;
    STRATA_RETURN_IF_ERROR(Annotate(
        ChargeLocked(*shard, home, home_tier->FootprintBytes(size_bytes), true, false, &write_backs),
        absl::StrCat(verb, ShardKeyToString(key))));
    Copy& c = shard->copies[TierIndex(home)];
    c.charged = true;
    c.state = CopyState::kLoading;
    c.version = shard->version;
    shards_[key] = std::move(owned);
    ++ops_in_flight_;
  }
  absl::Status status = RunWriteBacks(write_backs);
  absl::StatusOr<TierSlot> slot = home_tier->Allocate(key, size_bytes);
  if (status.ok()) status = slot.status();
  // Adopting: the home already holds the data (a restart); adding: write it.
  if (status.ok() && data != nullptr) status = WriteFromHost(home_tier, *slot, *data);
  absl::MutexLock lock(&mu_);
  --ops_in_flight_;
  if (!status.ok()) {
    if (slot.ok()) home_tier->Free(*slot);
    UnchargeLocked(*shard, home);
    shards_.erase(key);
    changed_.SignalAll();
    return Annotate(status, absl::StrCat(verb, ShardKeyToString(key)));
  }
  Copy& c = shard->copies[TierIndex(home)];
  c.slot = *slot;
  c.state = CopyState::kResident;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<Lease> TieredStore::AcquireForOverwrite(const ShardKey& key, TierKind t,
                                                       std::optional<absl::Duration> lease) {
  const absl::Duration duration = lease.value_or(options_.default_lease);
  std::vector<PendingWriteBack> write_backs;
  Shard* shard = nullptr;
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      shard = FindLocked(key);
      if (shard == nullptr) {
        return absl::NotFoundError(absl::StrCat("overwriting ", ShardKeyToString(key), ": not found"));
      }
      if (!has_tier(t) || TierIndex(t) >= TierIndex(shard->home)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "overwriting ", ShardKeyToString(key), " in ", TierKindName(t),
            ": not a configured tier faster than its home (", TierKindName(shard->home), ")"));
      }
      Copy& c = shard->copies[TierIndex(t)];
      // A transfer in or out of the slot must end before it is rewritten.
      if (c.state == CopyState::kLoading || c.state == CopyState::kEvicting ||
          (c.state == CopyState::kResident && c.io_refs > 0)) {
        changed_.Wait(&mu_);
        continue;
      }
      if (c.state == CopyState::kResident) {
        ++c.pins;
        ++c.writers;
        c.last_use_tick = ++tick_;
        c.prefetched_unused = false;
        const absl::Time now = options_.clock->Now();
        const LeaseId id{next_lease_++};
        leases_[id.value] = LeaseRecord{shard, t, AccessMode::kWrite, now + duration};
        return Lease{id, key, t, AccessMode::kWrite, c.slot, now + duration};
      }
      STRATA_RETURN_IF_ERROR(Annotate(
          ChargeLocked(*shard, t, tier(t)->FootprintBytes(shard->size_bytes), /*demand=*/true,
                       /*urgent=*/false, &write_backs),
          absl::StrCat("overwriting ", ShardTier(key, t))));
      c.charged = true;
      c.state = CopyState::kLoading;
      ++ops_in_flight_;
      break;
    }
  }
  absl::Status status = RunWriteBacks(write_backs);
  absl::StatusOr<TierSlot> slot = absl::UnknownError("not allocated");
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    slot = AllocateChargedLocked(*shard, t, /*demand=*/true, /*urgent=*/false);
    status = slot.status();
  }
  absl::MutexLock lock(&mu_);
  --ops_in_flight_;
  Copy& c = shard->copies[TierIndex(t)];
  if (!status.ok()) {
    UnchargeLocked(*shard, t);
    c = Copy{};
    changed_.SignalAll();
    return Annotate(status, absl::StrCat("overwriting ", ShardTier(key, t)));
  }
  // Resident but stale (version 0) until the holder releases it dirty.
  c.slot = *slot;
  c.state = CopyState::kResident;
  c.version = 0;
  c.pins = 1;
  c.writers = 1;
  c.last_use_tick = ++tick_;
  cached_[TierIndex(t)].insert(shard);
  ++stats_.tiers[TierIndex(t)].promotions;
  ++job_stats_[key.job].tiers[TierIndex(t)].promotions;
  const absl::Time now = options_.clock->Now();
  const LeaseId id{next_lease_++};
  leases_[id.value] = LeaseRecord{shard, t, AccessMode::kWrite, now + duration};
  changed_.SignalAll();
  return Lease{id, key, t, AccessMode::kWrite, c.slot, now + duration};
}

uint64_t TieredStore::Trim(JobId job, TierKind t, uint64_t target_bytes,
                           const std::optional<ShardKey>& incoming, bool urgent,
                           absl::Span<const ShardKey> keep) {
  absl::MutexLock lock(&mu_);
  if (!has_tier(t)) return 0;
  const int ti = TierIndex(t);
  const std::pair<JobId, int> job_key{job, ti};
  while (job_charged_[job_key] > target_bytes) {
    std::vector<Shard*> owners;
    for (Shard* s : cached_[ti]) {
      const Copy& c = s->copies[ti];
      if (s->key.job != job || c.state != CopyState::kResident || c.io_refs > 0) continue;
      if (c.pins == 0 && NeedsWriteBackLocked(*s, t)) continue;  // dirty: only a transfer may drop it
      if (std::find(keep.begin(), keep.end(), s->key) != keep.end()) continue;
      owners.push_back(s);
    }
    std::sort(owners.begin(), owners.end(),
              [](const Shard* a, const Shard* b) { return a->key < b->key; });
    std::vector<EvictionCandidate> candidates;
    bool any_unpinned = false;
    for (Shard* s : owners) {
      const Copy& c = s->copies[ti];
      candidates.push_back({s->key, tier(t)->FootprintBytes(s->size_bytes), c.last_use_tick, false,
                            c.prefetched_unused, c.pins > 0});
      any_unpinned = any_unpinned || c.pins == 0;
    }
    if (!any_unpinned) break;
    EvictionRequest request{t, incoming, /*demand=*/!incoming.has_value(), urgent};
    std::optional<size_t> pick = policy_->ChooseVictim(request, candidates);
    if (!pick.has_value() || *pick >= candidates.size() || candidates[*pick].pinned) {
      if (incoming.has_value()) break;  // a prefetch the policy does not make room for
      // The policy keeps everything: fall back to the first unpinned copy,
      // since the caller's bound (a budget) must hold.
      size_t first = 0;
      while (candidates[first].pinned) ++first;  // any_unpinned: one exists
      pick = first;
    }
    Shard* victim = owners[pick.value_or(0)];
    ++stats_.tiers[ti].evictions;
    ++job_stats_[job].tiers[ti].evictions;
    DropCopyLocked(*victim, t);
  }
  changed_.SignalAll();
  return job_charged_[job_key];
}

absl::Status TieredStore::Evict(const ShardKey& key, TierKind t) {
  absl::MutexLock lock(&mu_);
  Shard* shard = FindLocked(key);
  if (shard == nullptr) return absl::NotFoundError(absl::StrCat(ShardKeyToString(key), " not found"));
  if (!has_tier(t) || t == shard->home) {
    return absl::InvalidArgumentError(absl::StrCat("evicting ", ShardTier(key, t), ": not a cache tier of it"));
  }
  Copy& c = shard->copies[TierIndex(t)];
  if (c.state == CopyState::kAbsent) return absl::NotFoundError(absl::StrCat(ShardTier(key, t), " is absent"));
  if (c.state != CopyState::kResident || c.pins > 0 || c.io_refs > 0) {
    return absl::FailedPreconditionError(absl::StrCat("evicting ", ShardTier(key, t), ": pinned or moving"));
  }
  if (NeedsWriteBackLocked(*shard, t)) {
    return absl::FailedPreconditionError(
        absl::StrCat("evicting ", ShardTier(key, t), ": the only current copy (Demote writes it back)"));
  }
  ++stats_.tiers[TierIndex(t)].evictions;
  ++job_stats_[key.job].tiers[TierIndex(t)].evictions;
  DropCopyLocked(*shard, t);
  changed_.SignalAll();
  return absl::OkStatus();
}

StoreStats TieredStore::job_stats(JobId job) const {
  absl::MutexLock lock(&mu_);
  auto it = job_stats_.find(job);
  return it == job_stats_.end() ? StoreStats{} : it->second;
}

absl::Status TieredStore::RemoveShard(const ShardKey& key) {
  absl::MutexLock lock(&mu_);
  Shard* shard = FindLocked(key);
  if (shard == nullptr) return absl::NotFoundError(absl::StrCat(ShardKeyToString(key), " not found"));
  for (const Copy& c : shard->copies) {
    if (c.pins > 0 || c.io_refs > 0 || c.state == CopyState::kLoading ||
        c.state == CopyState::kEvicting) {
      return absl::FailedPreconditionError(absl::StrCat(
          "removing ", ShardKeyToString(key), ": it is pinned or moving; release it first"));
    }
  }
  for (int i = 0; i < kNumTiers; ++i) {
    const TierKind t = static_cast<TierKind>(i);
    if (shard->copies[i].state == CopyState::kAbsent) continue;
    DropCopyLocked(*shard, t);
  }
  shards_.erase(key);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TieredStore::CopyOp>> TieredStore::StartCopyLocked(
    Shard& shard, TierKind dst, const PromoteOptions& options, bool demand) {
  const bool prefetch = options.prefetch;
  std::optional<TierKind> src = SourceLocked(shard, dst);
  if (!src.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "the latest data of ", ShardKeyToString(shard.key), " is being written back"));
  }
  // A transfer must not read a copy while a lease holder may be writing it:
  // the bytes would be torn (a data race TSan found), and the copy made from
  // them labeled with the version before the write. It starts once the
  // write lease is released (Acquire waits for that; Promote and WriteBack
  // answer Unavailable).
  if (shard.copies[TierIndex(*src)].writers > 0) {
    return absl::UnavailableError(absl::StrCat(ShardTier(shard.key, *src),
                                               " is being written through a lease"));
  }
  auto op = std::make_unique<CopyOp>();
  if (dst != shard.home) {
    STRATA_RETURN_IF_ERROR(ChargeLocked(shard, dst, tier(dst)->FootprintBytes(shard.size_bytes),
                                        demand, options.urgent, &op->write_backs));
  }
  Copy& d = shard.copies[TierIndex(dst)];
  if (dst != shard.home) d.charged = true;
  d.state = CopyState::kLoading;
  op->handle = std::make_shared<Transfer>();
  d.transfer = op->handle;
  ++shard.copies[TierIndex(*src)].io_refs;
  op->shard = &shard;
  op->src = *src;
  op->dst = dst;
  op->src_version = shard.copies[TierIndex(*src)].version;
  op->prefetch = prefetch;
  op->demand = demand;
  op->urgent = options.urgent;
  ++stats_.tiers[TierIndex(dst)].promotions;
  ++job_stats_[shard.key.job].tiers[TierIndex(dst)].promotions;
  if (prefetch) {
    for (StoreStats* st : {&stats_, &job_stats_[shard.key.job]}) {
      ++st->prefetches_issued;
      ++st->tiers[TierIndex(dst)].prefetches_issued;
    }
  }
  ++ops_in_flight_;
  return op;
}

void TieredStore::Launch(std::unique_ptr<CopyOp> op) {
  std::shared_ptr<CopyOp> shared(std::move(op));
  options_.executor->Schedule([this, shared] { RunCopy(*shared); });
}

absl::StatusOr<TransferHandle> TieredStore::Promote(const ShardKey& key, TierKind t,
                                                    const PromoteOptions& options) {
  std::unique_ptr<CopyOp> op;
  {
    absl::MutexLock lock(&mu_);
    Shard* shard = FindLocked(key);
    if (shard == nullptr) {
      return absl::NotFoundError(absl::StrCat("promoting ", ShardKeyToString(key), ": not found"));
    }
    if (!has_tier(t) || TierIndex(t) > TierIndex(shard->home)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "promoting ", ShardKeyToString(key), " to ", TierKindName(t),
          ": not a configured tier at least as fast as its home (", TierKindName(shard->home), ")"));
    }
    Copy& c = shard->copies[TierIndex(t)];
    if (IsCurrentLocked(*shard, t)) return Transfer::Completed();
    if (c.state == CopyState::kLoading) return c.transfer;
    if (c.state == CopyState::kEvicting) {
      return absl::UnavailableError(
          absl::StrCat("promoting ", ShardTier(key, t), ": the copy is being written back"));
    }
    if (c.state == CopyState::kResident && t != shard->home) {  // stale
      if (c.pins > 0 || c.io_refs > 0) {
        return absl::UnavailableError(absl::StrCat(
            "promoting ", ShardTier(key, t), ": a stale copy is still pinned there"));
      }
      DropCopyLocked(*shard, t);
    }
    STRATA_ASSIGN_OR_RETURN(op, StartCopyLocked(*shard, t, options, options.demand && !options.prefetch));
  }
  TransferHandle handle = op->handle;
  Launch(std::move(op));
  return handle;
}

absl::StatusOr<TransferHandle> TieredStore::WriteBack(const ShardKey& key) {
  std::unique_ptr<CopyOp> op;
  {
    absl::MutexLock lock(&mu_);
    Shard* shard = FindLocked(key);
    if (shard == nullptr) {
      return absl::NotFoundError(absl::StrCat("writing back ", ShardKeyToString(key), ": not found"));
    }
    Copy& home = shard->copies[TierIndex(shard->home)];
    if (IsCurrentLocked(*shard, shard->home)) return Transfer::Completed();
    if (home.state == CopyState::kLoading) return home.transfer;
    STRATA_ASSIGN_OR_RETURN(op, StartCopyLocked(*shard, shard->home, PromoteOptions{}, false));
  }
  TransferHandle handle = op->handle;
  Launch(std::move(op));
  return handle;
}

std::vector<TieredStore::CachedCopy> TieredStore::CachedCopies(TierKind t) const {
  absl::MutexLock lock(&mu_);
  std::vector<CachedCopy> copies;
  if (!has_tier(t)) return copies;
  for (Shard* s : cached_[TierIndex(t)]) {
    copies.push_back({s->key, NeedsWriteBackLocked(*s, t), s->copies[TierIndex(t)].pins > 0});
  }
  std::sort(copies.begin(), copies.end(),
            [](const CachedCopy& a, const CachedCopy& b) { return a.key < b.key; });
  return copies;
}

void TieredStore::CountWastedLocked(JobId job, TierKind t) {
  for (StoreStats* st : {&stats_, &job_stats_[job]}) {
    ++st->prefetches_wasted;
    ++st->tiers[TierIndex(t)].prefetches_wasted;
  }
}

void TieredStore::CountMoveLocked(JobId job, TierKind src, TierKind dst, uint64_t bytes) {
  if (src == dst) return;
  for (StoreStats* st : {&stats_, &job_stats_[job]}) {
    st->tiers[TierIndex(src)].bytes_out += bytes;
    st->tiers[TierIndex(dst)].bytes_in += bytes;
    if (TierIndex(dst) < TierIndex(src)) {
      st->bytes_up += bytes;
    } else {
      st->bytes_down += bytes;
    }
  }
}

absl::Status TieredStore::CopyData(TierKind src, const TierSlot& src_slot, TierKind dst,
                                   const TierSlot& dst_slot, uint64_t size) {
  Tier* s = tier(src);
  Tier* d = tier(dst);
  absl::Span<std::byte> dst_view = d->HostView(dst_slot);
  if (!dst_view.empty()) return s->Read(src_slot, dst_view);
  absl::Span<std::byte> src_view = s->HostView(src_slot);
  if (!src_view.empty()) return d->Write(dst_slot, src_view);
  const size_t align =
      std::max<size_t>({4096, s->host_buffer_alignment(), d->host_buffer_alignment()});
  const uint64_t rounded = std::max<uint64_t>((size + align - 1) / align * align, align);
  StagingBuffer staging = NewStaging(rounded, align);
  STRATA_RETURN_IF_ERROR(s->Read(src_slot, absl::MakeSpan(staging.get(), rounded)));
  return d->Write(dst_slot, absl::MakeConstSpan(staging.get(), size));
}

absl::Status TieredStore::WriteBackData(Shard& shard, TierKind t) {
  TierSlot src_slot;
  TierSlot home_slot;
  {
    absl::MutexLock lock(&mu_);
    src_slot = shard.copies[TierIndex(t)].slot;
    home_slot = shard.copies[TierIndex(shard.home)].slot;
  }
  return Annotate(CopyData(t, src_slot, shard.home, home_slot, shard.size_bytes),
                  absl::StrCat("writing ", ShardTier(shard.key, t), " back to ",
                               TierKindName(shard.home)));
}

void TieredStore::RunCopy(CopyOp& op) {
  Shard& shard = *op.shard;
  absl::Status status;
  uint64_t bytes_down = 0;
  if (!op.write_backs.empty()) {
    {
      absl::MutexLock lock(&mu_);
      ++slots_releasing_[TierIndex(op.dst)];
    }
    status = RunWriteBacks(op.write_backs, &bytes_down);
    absl::MutexLock lock(&mu_);
    --slots_releasing_[TierIndex(op.dst)];
    changed_.SignalAll();
  }
  TierSlot src_slot;
  TierSlot dst_slot;
  {
    absl::MutexLock lock(&mu_);
    src_slot = shard.copies[TierIndex(op.src)].slot;
    if (op.dst == shard.home) {
      dst_slot = shard.copies[TierIndex(op.dst)].slot;
    } else if (status.ok()) {
      // The charge is ours, so the space exists; it may still be occupied by
      // victims another transfer is writing back, or fragmented.
      absl::StatusOr<TierSlot> slot = AllocateChargedLocked(shard, op.dst, op.demand, op.urgent);
      if (slot.ok()) {
        dst_slot = *slot;
        // Still loading, but holding its slot: an allocation that finds the
        // arena fragmented may wait for this copy, which ends without it.
        shard.copies[TierIndex(op.dst)].slot = dst_slot;
      } else {
        status = slot.status();
      }
    }
  }
  if (status.ok()) status = CopyData(op.src, src_slot, op.dst, dst_slot, shard.size_bytes);

  absl::MutexLock lock(&mu_);
  --shard.copies[TierIndex(op.src)].io_refs;
  Copy& d = shard.copies[TierIndex(op.dst)];
  d.transfer = nullptr;
  uint64_t bytes_up = 0;
  if (status.ok()) {
    d.state = CopyState::kResident;
    d.slot = dst_slot;
    d.version = op.src_version;
    d.last_use_tick = ++tick_;
    d.prefetched_unused = op.prefetch;
    if (op.dst != shard.home) cached_[TierIndex(op.dst)].insert(&shard);
    CountMoveLocked(shard.key.job, op.src, op.dst, shard.size_bytes);
    if (TierIndex(op.dst) < TierIndex(op.src)) {
      bytes_up = shard.size_bytes;
    } else {
      bytes_down += shard.size_bytes;
    }
  } else if (op.dst == shard.home) {
    d.state = CopyState::kResident;  // still the older version
  } else {
    if (dst_slot.valid()) tier(op.dst)->Free(dst_slot);
    UnchargeLocked(shard, op.dst);
    d = Copy{};
  }
  DropStaleLocked(shard);
  --ops_in_flight_;
  // Finished under the lock so an Acquire woken below sees the outcome.
  op.handle->Finish(
      Annotate(status, absl::StrCat("moving ", ShardKeyToString(shard.key), " from ",
                                    TierKindName(op.src), " to ", TierKindName(op.dst))),
      bytes_up, bytes_down);
  changed_.SignalAll();
}

absl::StatusOr<TransferHandle> TieredStore::Demote(const ShardKey& key, TierKind t) {
  auto op = std::make_shared<DemoteOp>();
  {
    absl::MutexLock lock(&mu_);
    Shard* shard = FindLocked(key);
    if (shard == nullptr) {
      return absl::NotFoundError(absl::StrCat("demoting ", ShardKeyToString(key), ": not found"));
    }
    if (!has_tier(t) || TierIndex(t) > TierIndex(shard->home)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "demoting ", ShardKeyToString(key), " to ", TierKindName(t),
          ": not a configured tier at least as fast as its home (", TierKindName(shard->home), ")"));
    }
    for (int i = 0; i < TierIndex(t); ++i) {
      const Copy& c = shard->copies[i];
      if (c.state == CopyState::kAbsent) continue;
      if (c.pins > 0 || c.io_refs > 0 || c.state != CopyState::kResident) {
        return absl::FailedPreconditionError(absl::StrCat(
            "demoting ", ShardTier(key, static_cast<TierKind>(i)),
            ": the copy is pinned or moving; release it first"));
      }
      op->dropped.push_back(static_cast<TierKind>(i));
    }
    if (op->dropped.empty()) return Transfer::Completed();
    // Save the data first when the dropped copies hold the only current one.
    if (shard->copies[TierIndex(shard->home)].version != shard->version) {
      bool survives = false;
      for (int i = TierIndex(t); i < kNumTiers; ++i) {
        if (static_cast<TierKind>(i) != shard->home &&
            IsCurrentLocked(*shard, static_cast<TierKind>(i))) {
          survives = true;
        }
      }
      if (!survives) {
        for (TierKind u : op->dropped) {
          if (IsCurrentLocked(*shard, u)) {
            op->write_back_from = u;
            break;
          }
        }
      }
    }
    for (TierKind u : op->dropped) {
      Copy& c = shard->copies[TierIndex(u)];
      UnchargeLocked(*shard, u);
      cached_[TierIndex(u)].erase(shard);
      if (c.prefetched_unused) CountWastedLocked(shard->key.job, u);
      c.prefetched_unused = false;
      c.state = CopyState::kEvicting;
    }
    op->shard = shard;
    op->handle = std::make_shared<Transfer>();
    ++ops_in_flight_;
  }
  TransferHandle handle = op->handle;
  options_.executor->Schedule([this, op] { RunDemote(*op); });
  return handle;
}

void TieredStore::RunDemote(DemoteOp& op) {
  Shard& shard = *op.shard;
  absl::Status status;
  {
    // The dropped copies are uncharged but hold their slots until below.
    // Counted once running, not when queued: an allocation waiting for
    // work that has not started could deadlock a small pool.
    absl::MutexLock lock(&mu_);
    for (TierKind u : op.dropped) ++slots_releasing_[TierIndex(u)];
  }
  if (op.write_back_from.has_value()) status = WriteBackData(shard, *op.write_back_from);
  absl::MutexLock lock(&mu_);
  for (TierKind u : op.dropped) --slots_releasing_[TierIndex(u)];
  uint64_t bytes_down = 0;
  if (status.ok()) {
    if (op.write_back_from.has_value()) {
      const TierKind from = *op.write_back_from;
      shard.copies[TierIndex(shard.home)].version = shard.copies[TierIndex(from)].version;
      ++stats_.tiers[TierIndex(from)].write_backs;
      CountMoveLocked(shard.key.job, from, shard.home, shard.size_bytes);
      bytes_down = shard.size_bytes;
    }
    for (TierKind u : op.dropped) {
      Copy& c = shard.copies[TierIndex(u)];
      tier(u)->Free(c.slot);
      c = Copy{};
    }
  } else {
    for (TierKind u : op.dropped) {
      Copy& c = shard.copies[TierIndex(u)];
      c.state = CopyState::kResident;
      c.charged = true;
      const uint64_t fp = tier(u)->FootprintBytes(shard.size_bytes);
      charged_[TierIndex(u)] += fp;
      job_charged_[{shard.key.job, TierIndex(u)}] += fp;
      cached_[TierIndex(u)].insert(&shard);
    }
  }
  DropStaleLocked(shard);
  --ops_in_flight_;
  op.handle->Finish(status, 0, bytes_down);
  changed_.SignalAll();
}

absl::StatusOr<Lease> TieredStore::Acquire(const ShardKey& key, TierKind t, AccessMode mode,
                                           std::optional<absl::Duration> lease) {
  const absl::Duration duration = lease.value_or(options_.default_lease);
  mu_.Lock();
  const absl::Time start = options_.clock->Now();
  bool counted = false;
  bool waited = false;
  TransferHandle awaited;
  while (true) {
    Shard* shard = FindLocked(key);
    if (shard == nullptr) {
      mu_.Unlock();
      return absl::NotFoundError(absl::StrCat("acquiring ", ShardKeyToString(key), ": not found"));
    }
    if (!has_tier(t) || TierIndex(t) > TierIndex(shard->home)) {
      mu_.Unlock();
      return absl::InvalidArgumentError(absl::StrCat(
          "acquiring ", ShardKeyToString(key), " in ", TierKindName(t),
          ": not a configured tier at least as fast as its home (", TierKindName(shard->home), ")"));
    }
    Copy& c = shard->copies[TierIndex(t)];
    if (IsCurrentLocked(*shard, t) && mode == AccessMode::kWrite && c.io_refs > 0) {
      // A transfer is reading this copy: writing now would tear what it
      // copies. It ends without us (and signals changed_).
      waited = true;
      changed_.Wait(&mu_);
      continue;
    }
    if (IsCurrentLocked(*shard, t)) {
      TierCounters& counters = stats_.tiers[TierIndex(t)];
      StoreStats& job_stats = job_stats_[key.job];
      if (!counted) {
        ++counters.acquire_hits;
        ++job_stats.tiers[TierIndex(t)].acquire_hits;
      }
      ++c.pins;
      if (mode == AccessMode::kWrite) ++c.writers;
      if (c.prefetched_unused) {
        for (StoreStats* st : {&stats_, &job_stats}) {
          ++st->prefetches_used;
          ++st->tiers[TierIndex(t)].prefetches_used;
        }
        c.prefetched_unused = false;
      }
      c.last_use_tick = ++tick_;
      const absl::Time now = options_.clock->Now();
      if (waited) {
        stats_.stall_time += now - start;
        ++stats_.stalled_acquires;
        job_stats.stall_time += now - start;
        ++job_stats.stalled_acquires;
      }
      const LeaseId id{next_lease_++};
      leases_[id.value] = LeaseRecord{shard, t, mode, now + duration};
      Lease result{id, key, t, mode, c.slot, now + duration};
      mu_.Unlock();
      return result;
    }
    if (!counted) {
      ++stats_.tiers[TierIndex(t)].acquire_misses;
      ++job_stats_[key.job].tiers[TierIndex(t)].acquire_misses;
      counted = true;
    }
    // A promotion we waited for ended without a current copy: report its
    // error instead of starting another one.
    if (awaited != nullptr && c.state != CopyState::kLoading && awaited->done()) {
      absl::Status failed = awaited->Wait();
      awaited = nullptr;
      if (!failed.ok()) {
        mu_.Unlock();
        return failed;
      }
    }
    if (c.state == CopyState::kLoading || c.state == CopyState::kEvicting ||
        (c.state == CopyState::kResident && t != shard->home && (c.pins > 0 || c.io_refs > 0))) {
      if (c.state == CopyState::kLoading) awaited = c.transfer;
      waited = true;
      changed_.Wait(&mu_);
      continue;
    }
    if (c.state == CopyState::kResident && t != shard->home) {  // stale, unused
      DropCopyLocked(*shard, t);
    }
    absl::StatusOr<std::unique_ptr<CopyOp>> op = StartCopyLocked(*shard, t, PromoteOptions{}, true);
    if (!op.ok()) {
      if (absl::IsUnavailable(op.status())) {  // the data is being written back
        waited = true;
        changed_.Wait(&mu_);
        continue;
      }
      mu_.Unlock();
      return Annotate(op.status(), absl::StrCat("acquiring ", ShardTier(key, t)));
    }
    awaited = (*op)->handle;
    waited = true;
    mu_.Unlock();
    Launch(*std::move(op));
    mu_.Lock();
  }
}

absl::Status TieredStore::Release(LeaseId lease, bool dirty) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease.value);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease.value, " expired or unknown"));
  }
  const LeaseRecord record = it->second;
  if (dirty && record.mode != AccessMode::kWrite) {
    return absl::InvalidArgumentError(
        absl::StrCat("releasing lease ", lease.value, " dirty, but it was acquired for reading"));
  }
  leases_.erase(it);
  Shard& shard = *record.shard;
  Copy& c = shard.copies[TierIndex(record.tier)];
  --c.pins;
  if (record.mode == AccessMode::kWrite) --c.writers;
  if (dirty) {
    ++shard.version;
    c.version = shard.version;
  }
  DropStaleLocked(shard);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status TieredStore::RenewLease(LeaseId lease, absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease.value);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease.value, " expired or unknown"));
  }
  it->second.deadline = options_.clock->Now() + duration;
  return absl::OkStatus();
}

absl::Status TieredStore::ReadShard(const Lease& lease, absl::Span<std::byte> dst) {
  {
    absl::MutexLock lock(&mu_);
    if (!leases_.contains(lease.id.value)) {
      return absl::NotFoundError(absl::StrCat("lease ", lease.id.value, " expired or unknown"));
    }
  }
  Tier* t = tier(lease.tier);
  if (t->host_buffer_alignment() > 1 &&
      reinterpret_cast<uintptr_t>(dst.data()) % t->host_buffer_alignment() != 0) {
    const size_t align = std::max<size_t>(4096, t->host_buffer_alignment());
    const uint64_t rounded = std::max<uint64_t>((dst.size() + align - 1) / align * align, align);
    StagingBuffer staging = NewStaging(rounded, align);
    STRATA_RETURN_IF_ERROR(t->Read(lease.slot, absl::MakeSpan(staging.get(), rounded)));
    std::copy(staging.get(), staging.get() + lease.slot.size_bytes, dst.data());
    return absl::OkStatus();
  }
  return t->Read(lease.slot, dst);
}

absl::Status TieredStore::WriteShard(const Lease& lease, absl::Span<const std::byte> src) {
  if (lease.mode != AccessMode::kWrite) {
    return absl::InvalidArgumentError(
        absl::StrCat("writing ", ShardKeyToString(lease.key), " through a read lease"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!leases_.contains(lease.id.value)) {
      return absl::NotFoundError(absl::StrCat("lease ", lease.id.value, " expired or unknown"));
    }
  }
  return WriteFromHost(tier(lease.tier), lease.slot, src);
}

absl::Status TieredStore::WriteHome(const ShardKey& key, absl::Span<const std::byte> src) {
  return ReplaceHome(key, src.size(), [&](Tier* home, const TierSlot& slot) { return WriteFromHost(home, slot, src); });
}

absl::Status TieredStore::InstallHome(const ShardKey& key,
                                      absl::FunctionRef<absl::Status(Tier& home, const TierSlot& slot)> install) {
  return ReplaceHome(key, std::nullopt, [&](Tier* home, const TierSlot& slot) { return install(*home, slot); });
}

absl::Status TieredStore::ReplaceHome(const ShardKey& key, std::optional<uint64_t> src_bytes,
                                      absl::FunctionRef<absl::Status(Tier*, const TierSlot&)> put) {
  Shard* shard = nullptr;
  TierSlot home_slot;
  {
    absl::MutexLock lock(&mu_);
    shard = FindLocked(key);
    if (shard == nullptr) return absl::NotFoundError(absl::StrCat("writing ", ShardKeyToString(key), " home: not found"));
    if (src_bytes.has_value() && *src_bytes != shard->size_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("writing ", *src_bytes, " bytes home to ", ShardKeyToString(key),
                                                     " of ", shard->size_bytes));
    }
    Copy& home = shard->copies[TierIndex(shard->home)];
    if (home.state != CopyState::kResident || home.io_refs > 0 || !IsCurrentLocked(*shard, shard->home)) {
      return absl::FailedPreconditionError(absl::StrCat("writing ", ShardKeyToString(key),
                                                        " home: the home is being read or is not the latest"));
    }
    for (int i = 0; i < kNumTiers; ++i) {
      const Copy& c = shard->copies[i];
      if (static_cast<TierKind>(i) == shard->home || c.state == CopyState::kAbsent) continue;
      if (c.state != CopyState::kResident || c.pins > 0 || c.io_refs > 0) {
        return absl::FailedPreconditionError(absl::StrCat("writing ", ShardKeyToString(key), " home: its copy in ",
                                                          TierKindName(static_cast<TierKind>(i)),
                                                          " is pinned or moving"));
      }
    }
    for (int i = 0; i < kNumTiers; ++i) {
      const TierKind t = static_cast<TierKind>(i);
      if (t != shard->home && shard->copies[i].state == CopyState::kResident) DropCopyLocked(*shard, t);
    }
    ++home.io_refs;  // keeps the shard (RemoveShard refuses) while it is written
    home_slot = home.slot;
  }
  const absl::Status status = put(tier(shard->home), home_slot);
  absl::MutexLock lock(&mu_);
  Copy& home = shard->copies[TierIndex(shard->home)];
  --home.io_refs;
  if (status.ok()) {
    // A promotion that read the home meanwhile carries the old version: stale.
    ++shard->version;
    home.version = shard->version;
    for (StoreStats* st : {&stats_, &job_stats_[key.job]}) {
      st->tiers[TierIndex(shard->home)].bytes_in += shard->size_bytes;
      st->bytes_down += shard->size_bytes;
    }
    DropStaleLocked(*shard);
  }
  changed_.SignalAll();
  return Annotate(status, absl::StrCat("writing ", ShardKeyToString(key), " home to ", TierKindName(shard->home)));
}

absl::Span<std::byte> TieredStore::HostView(const Lease& lease) {
  return tier(lease.tier)->HostView(lease.slot);
}

bool TieredStore::IsResident(const ShardKey& key, TierKind t) const {
  absl::MutexLock lock(&mu_);
  const Shard* shard = FindLocked(key);
  return shard != nullptr && has_tier(t) && IsCurrentLocked(*shard, t);
}

bool TieredStore::IsInFlight(const ShardKey& key, TierKind t) const {
  absl::MutexLock lock(&mu_);
  const Shard* shard = FindLocked(key);
  return shard != nullptr && shard->copies[TierIndex(t)].state == CopyState::kLoading;
}

absl::StatusOr<ShardInfo> TieredStore::Describe(const ShardKey& key) const {
  absl::MutexLock lock(&mu_);
  const Shard* shard = FindLocked(key);
  if (shard == nullptr) return absl::NotFoundError(absl::StrCat(ShardKeyToString(key), " not found"));
  ShardInfo info;
  info.key = key;
  info.size_bytes = shard->size_bytes;
  info.home = shard->home;
  for (int i = 0; i < kNumTiers; ++i) {
    const Copy& c = shard->copies[i];
    info.current[i] = IsCurrentLocked(*shard, static_cast<TierKind>(i));
    info.in_flight[i] = c.state == CopyState::kLoading || c.state == CopyState::kEvicting;
    info.pins[i] = c.pins;
  }
  info.dirty = shard->copies[TierIndex(shard->home)].version != shard->version;
  return info;
}

std::vector<ShardKey> TieredStore::Keys() const {
  absl::MutexLock lock(&mu_);
  std::vector<ShardKey> keys;
  keys.reserve(shards_.size());
  for (const auto& [key, shard] : shards_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

uint64_t TieredStore::charged_bytes(TierKind t) const {
  absl::MutexLock lock(&mu_);
  return charged_[TierIndex(t)];
}

uint64_t TieredStore::job_charged_bytes(JobId job, TierKind t) const {
  absl::MutexLock lock(&mu_);
  auto it = job_charged_.find({job, TierIndex(t)});
  return it == job_charged_.end() ? 0 : it->second;
}

uint64_t TieredStore::capacity_bytes(TierKind t) const {
  return has_tier(t) ? tier(t)->capacity_bytes() : 0;
}

StoreStats TieredStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status TieredStore::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  std::array<uint64_t, kNumTiers> charged{};
  absl::flat_hash_map<std::pair<JobId, int>, uint64_t> job_charged;
  absl::flat_hash_map<const Copy*, int> lease_pins;
  for (const auto& [id, record] : leases_) {
    ++lease_pins[&record.shard->copies[TierIndex(record.tier)]];
  }
  for (const auto& [key, shard] : shards_) {
    bool has_latest = false;
    for (int i = 0; i < kNumTiers; ++i) {
      const Copy& c = shard->copies[i];
      const std::string where = ShardTier(key, static_cast<TierKind>(i));
      if (c.charged) {
        const uint64_t fp = tiers_[i]->FootprintBytes(shard->size_bytes);
        charged[i] += fp;
        job_charged[{key.job, i}] += fp;
      }
      if (c.pins < 0 || c.io_refs < 0) return absl::InternalError(absl::StrCat(where, ": negative count"));
      if (c.writers < 0 || c.writers > c.pins) {
        return absl::InternalError(absl::StrCat(where, ": write leases disagree with pins"));
      }
      if (c.writers > 0 && c.io_refs > 0) {
        return absl::InternalError(absl::StrCat(where, ": written through a lease while a transfer reads it"));
      }
      if (c.pins > 0 && c.state != CopyState::kResident) {
        return absl::InternalError(absl::StrCat(where, ": pinned but not resident"));
      }
      auto lp = lease_pins.find(&c);
      if ((lp == lease_pins.end() ? 0 : lp->second) != c.pins) {
        return absl::InternalError(absl::StrCat(where, ": pins disagree with leases"));
      }
      const bool cached = cached_[i].contains(shard.get());
      const bool should_be_cached =
          static_cast<TierKind>(i) != shard->home && c.state == CopyState::kResident;
      if (cached != should_be_cached) {
        return absl::InternalError(absl::StrCat(where, ": eviction candidate set is wrong"));
      }
      if (c.version == shard->version &&
          (c.state == CopyState::kResident || c.state == CopyState::kEvicting ||
           (c.state == CopyState::kLoading && static_cast<TierKind>(i) == shard->home))) {
        has_latest = true;
      }
    }
    if (!has_latest) {
      return absl::InternalError(absl::StrCat(ShardKeyToString(key), ": latest version ",
                                              shard->version, " is held by no copy (lost)"));
    }
  }
  for (int i = 0; i < kNumTiers; ++i) {
    if (tiers_[i] == nullptr) continue;
    if (charged[i] != charged_[i]) {
      return absl::InternalError(absl::StrCat(TierKindName(static_cast<TierKind>(i)), ": charged ",
                                              charged_[i], " but copies add up to ", charged[i]));
    }
    if (charged_[i] > tiers_[i]->capacity_bytes()) {
      return absl::InternalError(absl::StrCat(TierKindName(static_cast<TierKind>(i)),
                                              ": over capacity: ", charged_[i]));
    }
  }
  for (const auto& [job_tier, bytes] : job_charged_) {
    auto it = job_charged.find(job_tier);
    if ((it == job_charged.end() ? 0 : it->second) != bytes) {
      return absl::InternalError(absl::StrCat("job ", job_tier.first.value(), ": charge mismatch"));
    }
    auto budget = job_budget_.find(job_tier);
    if (budget != job_budget_.end() && bytes > budget->second) {
      return absl::InternalError(absl::StrCat("job ", job_tier.first.value(), " over budget"));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
