#include "daemon/param_cache.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/shard_key.h"
#include "daemon/param_store.h"
#include "prefetch/access_predictor.h"
#include "prefetch/farthest_next_use_policy.h"
#include "prefetch/prediction_trust.h"
#include "prefetch/trace_predictor.h"
#include "swap/extent_store.h"

namespace strata {
namespace {

ShardKey HomeKey(uint64_t job, uint32_t rank, uint32_t index) {
  return ShardKey{JobId(job), Rank(rank), TensorId(index), TensorKind::kParam16, 0};
}

absl::Status Context(const absl::Status& s, absl::string_view what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

// The job's predicted future: each rank follows its own trace (ranks run the
// same model in step, so their distances are comparable). Safe to call under
// the store's lock: its mutex is a leaf.
class ParamCache::Predictor final : public AccessPredictor {
 public:
  explicit Predictor(uint32_t ranks) : ranks_(ranks) {}

  double NextUse(const ShardKey& key) const override {
    absl::MutexLock lock(&mu_);
    const uint32_t r = key.rank.value();
    return r < ranks_.size() ? ranks_[r].predictor.NextUse(key) : kNeverUsed;
  }
  double NextUseFrom(const ShardKey& key, double distance) const override {
    absl::MutexLock lock(&mu_);
    const uint32_t r = key.rank.value();
    if (r >= ranks_.size()) return kNeverUsed;
    return ranks_[r].predictor.NextUseFrom(key, distance <= 0 ? 0 : static_cast<size_t>(distance));
  }
  std::vector<PredictedAccess> Upcoming(size_t /*max_count*/) const override { return {}; }

  void Observe(const ShardKey& key) {
    absl::MutexLock lock(&mu_);
    RankTrace& t = ranks_[key.rank.value()];
    t.current.push_back(key);
    (void)t.predictor.Observe(key);
  }
  void EndIteration(uint32_t rank) {
    absl::MutexLock lock(&mu_);
    RankTrace& t = ranks_[rank];
    t.predictor.EndIteration(t.current, t.previous);
    t.previous = std::move(t.current);
    t.current.clear();
  }
  // The next `count` predicted accesses of `rank`, nearest first.
  std::vector<ShardKey> Next(uint32_t rank, size_t count) const {
    std::vector<ShardKey> next;
    if (count == 0) return next;
    absl::MutexLock lock(&mu_);
    ranks_[rank].predictor.Walk([&](const ShardKey& key, size_t) {
      if (std::find(next.begin(), next.end(), key) == next.end()) next.push_back(key);
      return next.size() < count;
    });
    return next;
  }

 private:
  struct RankTrace {
    TracePredictor predictor;
    std::vector<ShardKey> current;   // this iteration's accesses so far
    std::vector<ShardKey> previous;  // the last iteration's
  };
  mutable absl::Mutex mu_;
  std::vector<RankTrace> ranks_ ABSL_GUARDED_BY(mu_);
};

ParamCache::ParamCache(uint64_t job_id, uint32_t ranks, ParamStore* params, Locate locate, uint64_t budget_bytes,
                       uint32_t lookahead, Discard discard)
    : job_id_(job_id),
      ranks_(ranks),
      locate_(std::move(locate)),
      budget_bytes_(budget_bytes),
      lookahead_(lookahead),
      discard_(std::move(discard)) {
  Init(params);
}

ParamCache::ParamCache(uint64_t job_id, uint32_t ranks, ExtentStore* store, Locate locate, uint64_t budget_bytes,
                       uint32_t lookahead, TransferExecutor* /*workers*/, Discard discard)
    : job_id_(job_id),
      ranks_(ranks),
      locate_(std::move(locate)),
      budget_bytes_(budget_bytes),
      lookahead_(lookahead),
      discard_(std::move(discard)) {
  ParamStoreOptions options;
  options.io_threads = 0;  // a job's own store adds no threads
  absl::StatusOr<std::unique_ptr<ParamStore>> own = ParamStore::Create(store, nullptr, options);
  if (!own.ok()) {
    init_status_ = own.status();
    return;
  }
  owned_ = std::move(*own);
  Init(owned_.get());
}

void ParamCache::Init(ParamStore* params) {
  params_ = params;
  store_ = params->store();
  nvme_ = params->nvme();
  predictor_ = std::make_unique<Predictor>(ranks_);
  {
    absl::MutexLock lock(&mu_);
    prefetch_tier_.assign(ranks_, TierKind::kPinnedHost);
  }
  Locate locate = locate_;
  init_status_ = params->windows()->AddJob(
      JobId(job_id_),
      [locate](uint32_t rank, uint32_t index) {
        const ShardRef ref = locate(rank, index);
        return WindowTier::WindowSlot{ref.slot, ref.offset, ref.bytes};
      },
      discard_);
  // The window budget is kept by this cache, not as the store's hard per-job
  // budget: room is made before each read (Trim), and a demand read whose
  // shards the trainer pins beyond the budget goes over it rather than fail
  // (ZeRO-3 holds a layer's shards at once; docs/DAEMON.md, the window).
  // The tier's capacity (the daemon's pinned capacity) is the store's.
}

ParamCache::~ParamCache() {
  Detach();
  owned_.reset();
}

void ParamCache::Detach() {
  std::vector<TransferHandle> in_flight;
  std::vector<LeaseId> leases;
  std::vector<Index> known;
  {
    absl::MutexLock lock(&mu_);
    if (detached_ || params_ == nullptr) return;
    detached_ = true;
    changed_.SignalAll();
    in_flight.swap(in_flight_);
    for (auto& [index, ids] : leases_) leases.insert(leases.end(), ids.begin(), ids.end());
    leases_.clear();
    known.assign(known_.begin(), known_.end());
    known_.clear();
  }
  // Transfers write into the window: they end before its slots go.
  for (const TransferHandle& h : in_flight) (void)h->Wait();
  for (LeaseId id : leases) (void)store_->Release(id, false);
  for (const Index& i : known) {
    const ShardKey key = KeyOf(i.first, i.second);
    // A write-back the store started for an eviction ends by itself.
    for (int attempt = 0; attempt < 10000; ++attempt) {
      absl::Status s = store_->RemoveShard(key);
      if (!absl::IsFailedPrecondition(s)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  params_->policies()->Unregister(JobId(job_id_));
  params_->windows()->RemoveJob(JobId(job_id_));
  if (store_->has_tier(TierKind::kDevice)) (void)store_->SetJobBudget(JobId(job_id_), TierKind::kDevice, 0);
}

absl::Status ParamCache::Usable() const {
  if (!init_status_.ok()) return init_status_;
  absl::MutexLock lock(&mu_);
  if (detached_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id_, "'s params were handed to its reloaded copy; attach again"));
  }
  return absl::OkStatus();
}

ShardKey ParamCache::KeyOf(uint32_t rank, uint32_t index) const { return HomeKey(job_id_, rank, index); }

absl::Status ParamCache::EnsureShard(uint32_t rank, uint32_t index) {
  if (rank >= ranks_) return absl::OutOfRangeError(absl::StrCat("rank ", rank, " is out of range"));
  {
    absl::MutexLock lock(&mu_);
    if (known_.contains({rank, index})) return absl::OkStatus();
  }
  const ShardRef ref = locate_(rank, index);
  // The home is on NVMe already (written by InitParams or a load, or by an
  // earlier daemon): adopted, not rewritten. A shard not yet written has a
  // home only once StoreHome writes it.
  absl::Status s = store_->AdoptShard(KeyOf(rank, index), TierKind::kNvme, ref.bytes);
  if (!s.ok() && !absl::IsAlreadyExists(s)) return s;
  absl::MutexLock lock(&mu_);
  known_.insert({rank, index});
  if (trust_ == nullptr && ref.bytes > 0) {
    // The trust's shadow caches hold what the budget holds, in shards.
    PredictionTrustOptions options;
    options.capacity_shards = std::max<uint64_t>(1, budget_bytes_ / ref.bytes);
    absl::StatusOr<std::unique_ptr<PredictionTrust>> trust = PredictionTrust::Create(options);
    if (trust.ok()) {
      trust_ = std::move(*trust);
      policy_ = std::make_unique<FarthestNextUsePolicy>(predictor_.get(), trust_.get());
      params_->policies()->Register(JobId(job_id_), policy_.get());
    }
  }
  return absl::OkStatus();
}

absl::Status ParamCache::StoreHome(uint32_t rank, uint32_t index) {
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (absl::Status s = EnsureShard(rank, index); !s.ok()) return s;
  const ShardKey key = KeyOf(rank, index);
  // The slot already holds the new params (the caller wrote them): the store
  // takes it as the latest copy without reading anything into it, and
  // writes it home.
  absl::StatusOr<Lease> lease = store_->AcquireForOverwrite(key, TierKind::kPinnedHost);
  if (!lease.ok()) {
    return Context(lease.status(), absl::StrCat("storing the params of shard ", index, " of rank ", rank));
  }
  if (absl::Status s = store_->Release(lease->id, /*dirty=*/true); !s.ok()) return s;
  // Waited for here, in the step's streaming thread: a variant that let the
  // write run behind the next shard (one in flight) measured 0.1 s faster at
  // 200M params but made the state loads of an 800M step ten times slower
  // (step 58 s against 10.5 s, `strata bench offload`, 2026-12-02); the
  // cause is not understood yet (docs/DAEMON.md).
  absl::StatusOr<TransferHandle> written = store_->WriteBack(key);
  absl::Status s = written.ok() ? (*written)->Wait() : written.status();
  if (!s.ok()) {
    return Context(s, absl::StrCat("writing the params of shard ", index, " of rank ", rank, " to NVMe"));
  }
  // The step just rewrote this shard; keep within the budget by dropping
  // the unpinned shards needed last.
  TrimToBudget();
  return absl::OkStatus();
}

absl::Status ParamCache::StoreHomeFrom(uint32_t rank, uint32_t index, absl::Span<const std::byte> params) {
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (absl::Status s = EnsureShard(rank, index); !s.ok()) return s;
  const ShardRef ref = locate_(rank, index);
  if (params.size() != ref.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("storing ", params.size(), " bytes of params into shard ", index,
                                                   " of rank ", rank, "'s slot of ", ref.bytes));
  }
  const ShardKey key = KeyOf(rank, index);
  // Room beside the params the window holds (this shard's old copy aside).
  uint64_t held = resident_bytes();
  if (store_->IsResident(key, TierKind::kPinnedHost)) held -= std::min(held, ref.bytes);
  bool keep;
  {
    absl::MutexLock lock(&mu_);
    keep = held + ref.bytes <= ParamRoomLocked();
  }
  if (!keep) {
    absl::Status home = store_->WriteHome(key, params);
    if (home.ok()) return absl::OkStatus();
    // A copy pinned or moving (not during an update, but cheap to survive):
    // through the slot as before.
    if (!absl::IsFailedPrecondition(home)) {
      return Context(home, absl::StrCat("writing the params of shard ", index, " of rank ", rank, " to NVMe"));
    }
  }
  std::memcpy(ref.slot, params.data(), ref.bytes);
  return StoreHome(rank, index);
}

absl::Status ParamCache::InstallHome(uint32_t rank, uint32_t index, const ShardKey& pending) {
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (absl::Status s = EnsureShard(rank, index); !s.ok()) return s;
  if (nvme_ == nullptr) return absl::FailedPreconditionError("no NVMe store");
  const ShardRef ref = locate_(rank, index);
  absl::StatusOr<uint64_t> size = nvme_->SizeOf(pending);
  if (!size.ok()) {
    return Context(size.status(), absl::StrCat("installing the new params of shard ", index, " of rank ", rank));
  }
  if (*size != ref.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("installing ", *size, " bytes of params (",
                                                   ShardKeyToString(pending), ") as shard ", index, " of rank ",
                                                   rank, ", whose slot is ", ref.bytes));
  }
  const ShardKey key = KeyOf(rank, index);
  absl::Status s = store_->InstallHome(key, [&](Tier&, const TierSlot&) { return nvme_->Rename(pending, key); });
  return Context(s, absl::StrCat("installing the new params of shard ", index, " of rank ", rank));
}

absl::Status ParamCache::ReadHome(uint32_t rank, uint32_t index, absl::Span<std::byte> into) const {
  const ShardRef ref = locate_(rank, index);
  if (nvme_ == nullptr) return absl::FailedPreconditionError("no NVMe store");
  absl::StatusOr<uint64_t> got = nvme_->Read(KeyOf(rank, index), into);
  if (!got.ok()) {
    return absl::Status(got.status().code(), absl::StrCat("reading the params of shard ", index, " of rank ", rank,
                                                          " from NVMe: ", got.status().message()));
  }
  if (*got != ref.bytes) {
    return absl::DataLossError(absl::StrCat("param shard ", index, " of rank ", rank, " is ", *got,
                                            " bytes on NVMe, expected ", ref.bytes));
  }
  return absl::OkStatus();
}

void ParamCache::TrimToBudget() {
  uint64_t target;
  {
    absl::MutexLock lock(&mu_);
    target = ParamRoomLocked();
  }
  (void)store_->Trim(JobId(job_id_), TierKind::kPinnedHost, target);
}

uint64_t ParamCache::SetReserved(uint64_t bytes) {
  bool updating;
  {
    absl::MutexLock lock(&mu_);
    reserved_bytes_ = bytes;
    updating = updating_;
  }
  // During an update the slot of the shard being stepped may hold new
  // params not yet stored: StoreHome trims once they are home.
  if (!updating && init_status_.ok()) TrimToBudget();
  return resident_bytes();
}

bool ParamCache::Drop(uint32_t rank, uint32_t index) {
  if (!init_status_.ok()) return false;
  return store_->Evict(KeyOf(rank, index), TierKind::kPinnedHost).ok();
}

uint64_t ParamCache::resident_bytes() const {
  if (store_ == nullptr) return 0;
  return store_->job_charged_bytes(JobId(job_id_), TierKind::kPinnedHost);
}

bool ParamCache::has_device_tier() const { return store_ != nullptr && store_->has_tier(TierKind::kDevice); }

absl::Status ParamCache::SetDeviceBudget(uint64_t bytes) {
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (!has_device_tier()) {
    return absl::FailedPreconditionError("this daemon has no device tier (start stratad with --device)");
  }
  if (absl::Status s = store_->SetJobBudget(JobId(job_id_), TierKind::kDevice, bytes); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  device_budget_ = bytes;
  return absl::OkStatus();
}

void ParamCache::Prefetch(uint32_t rank) {
  PredictionTrust* trust;
  TierKind tier;
  uint64_t room;
  {
    absl::MutexLock lock(&mu_);
    if (updating_ || detached_ || !init_status_.ok() || rank >= ranks_) return;
    ++issuing_;  // BeginUpdate waits for this call's promotions too
    trust = trust_.get();
    tier = prefetch_tier_[rank];
    room = ParamRoomLocked();
    // Handles of finished transfers are not needed any more.
    in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                    [](const TransferHandle& h) { return h->done(); }),
                     in_flight_.end());
  }
  // A job whose accesses the prediction gets wrong is paged by demand.
  const std::vector<ShardKey> next = (trust != nullptr && !trust->Trusted())
                                         ? std::vector<ShardKey>{}
                                         : predictor_->Next(rank, lookahead_);
  IssueEnd issue_end{this};
  for (size_t i = 0; i < next.size(); ++i) {
    const ShardKey& key = next[i];
    if (store_->IsResident(key, tier) || store_->IsInFlight(key, tier)) continue;
    if (!EnsureShard(key.rank.value(), key.tensor.value()).ok()) continue;
    const bool urgent = i == 0;
    if (tier == TierKind::kPinnedHost) {
      // Within what the gradients leave: room is made only where the policy
      // agrees (never by dropping a shard needed sooner).
      const uint64_t bytes = locate_(key.rank.value(), key.tensor.value()).bytes;
      const uint64_t target = room > bytes ? room - bytes : 0;
      if (store_->Trim(JobId(job_id_), tier, target, key, urgent) > target) break;
    }
    PromoteOptions options;
    options.prefetch = true;
    options.urgent = urgent;
    absl::StatusOr<TransferHandle> h = store_->Promote(key, tier, options);
    if (!h.ok()) break;  // no room the policy would make: later ones fit even less
    absl::MutexLock lock(&mu_);
    in_flight_.push_back(*h);
  }
}

ParamCache::IssueEnd::~IssueEnd() {
  absl::MutexLock lock(&cache->mu_);
  --cache->issuing_;
  cache->changed_.SignalAll();
}

bool ParamCache::WaitForTransfers(absl::Time deadline) {
  std::vector<TransferHandle> in_flight;
  {
    absl::MutexLock lock(&mu_);
    in_flight = in_flight_;
  }
  bool waited = false;
  for (const TransferHandle& h : in_flight) {
    if (h->done()) continue;
    waited = true;
    if (absl::IsDeadlineExceeded(h->WaitUntil(deadline))) return false;
  }
  return waited;
}

absl::StatusOr<std::vector<Lease>> ParamCache::AcquireIn(uint32_t rank, absl::Span<const uint32_t> indices,
                                                         TierKind tier, absl::Time deadline) {
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (rank >= ranks_) return absl::OutOfRangeError(absl::StrCat("rank ", rank, " is out of range"));
  PredictionTrust* trust;
  {
    absl::MutexLock lock(&mu_);
    // An optimizer step is rewriting the slots: wait for it.
    while (updating_ && !detached_) {
      if (changed_.WaitWithDeadline(&mu_, deadline) && updating_) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank, "'s params are being updated by the optimizer step; it did not end in time"));
      }
    }
    prefetch_tier_[rank] = tier;
    ++issuing_;
  }
  IssueEnd issue_end{this};
  for (uint32_t index : indices) {
    if (absl::Status s = EnsureShard(rank, index); !s.ok()) return s;
  }
  {
    absl::MutexLock lock(&mu_);
    trust = trust_.get();
  }
  const absl::Time start = absl::Now();
  if (tier == TierKind::kPinnedHost) {
    // Room first (clean copies needed last go), so the read lands within
    // what the gradients leave whenever the unpinned shards allow it.
    uint64_t needed = 0;
    std::vector<ShardKey> keep;
    for (uint32_t index : indices) {
      const ShardKey key = KeyOf(rank, index);
      keep.push_back(key);
      if (!store_->IsResident(key, tier) && !store_->IsInFlight(key, tier)) needed += locate_(rank, index).bytes;
    }
    uint64_t room;
    {
      absl::MutexLock lock(&mu_);
      room = ParamRoomLocked();
    }
    if (needed > 0) {
      (void)store_->Trim(JobId(job_id_), tier, room > needed ? room - needed : 0, std::nullopt, false, keep);
    }
  }
  std::vector<TransferHandle> handles;
  uint64_t hits = 0, misses = 0, waits = 0;
  for (uint32_t index : indices) {
    const ShardKey key = KeyOf(rank, index);
    if (trust != nullptr) trust->OnAccess(key, *predictor_);
    predictor_->Observe(key);
    if (store_->IsResident(key, tier)) {
      ++hits;
    } else if (store_->IsInFlight(key, tier)) {
      ++waits;
    } else {
      ++misses;
    }
    PromoteOptions options;
    options.demand = true;
    absl::StatusOr<TransferHandle> h = store_->Promote(key, tier, options);
    if (absl::IsResourceExhausted(h.status()) && WaitForTransfers(deadline)) {
      h = store_->Promote(key, tier, options);  // the copies that were moving are evictable now
    }
    if (!h.ok() && !absl::IsUnavailable(h.status())) {
      return Context(h.status(), absl::StrCat("bringing param shard ", index, " of rank ", rank, " into the ",
                                              TierKindName(tier), " tier"));
    }
    if (h.ok()) {
      handles.push_back(*h);
      absl::MutexLock lock(&mu_);
      in_flight_.push_back(*h);  // where WaitForTransfers and BeginUpdate find it
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ParamTierStats& counted = tier == TierKind::kDevice ? device_stats_ : window_stats_;
    counted.hits += hits;
    counted.misses += misses;
    counted.waits_in_flight += waits;
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    absl::Status s = handles[i]->WaitUntil(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat("param shards of rank ", rank, " did not arrive from NVMe "
                                                      "in time"));
    }
  }
  std::vector<Lease> leases;
  for (uint32_t index : indices) {
    // Pins the copy; when it went again meanwhile (or the promotion failed)
    // the store brings it back or reports why.
    absl::StatusOr<Lease> lease = store_->Acquire(KeyOf(rank, index), tier, AccessMode::kRead);
    if (absl::IsResourceExhausted(lease.status()) && WaitForTransfers(deadline)) {
      lease = store_->Acquire(KeyOf(rank, index), tier, AccessMode::kRead);
    }
    if (!lease.ok()) {
      for (const Lease& l : leases) (void)store_->Release(l.id, false);
      return absl::Status(lease.status().code(),
                          absl::StrCat("reading param shard ", index, " of rank ", rank, " into the ",
                                       TierKindName(tier), " tier: ", lease.status().message(),
                                       "; the job's state is unchanged: Acquire again (the read is retried), "
                                       "and if the shard keeps failing restore the job from a checkpoint "
                                       "(LoadCheckpoint)"));
    }
    leases.push_back(*lease);
  }
  bool detached;
  {
    absl::MutexLock lock(&mu_);
    detached = detached_;
    if (!detached) {
      for (size_t i = 0; i < indices.size(); ++i) leases_[{rank, indices[i]}].push_back(leases[i].id);
      (tier == TierKind::kDevice ? device_stats_ : window_stats_).stall_s +=
          absl::ToDoubleSeconds(absl::Now() - start);
    }
  }
  if (detached) {
    // Detach ran meanwhile: its pins must not outlive the job's shards.
    for (const Lease& l : leases) (void)store_->Release(l.id, false);
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id_, "'s params were handed to its reloaded copy; attach again"));
  }
  // What comes next, only now that these shards are pinned: just acquired,
  // their next use is the farthest, so a prefetch issued while they were
  // still unpinned could evict them (their read done) and leave the budget
  // to copies in flight -- the acquire then failed with ResourceExhausted
  // (ParamStoreTest under load, CI).
  Prefetch(rank);
  return leases;
}

absl::Status ParamCache::Acquire(uint32_t rank, absl::Span<const uint32_t> indices, absl::Time deadline) {
  absl::StatusOr<std::vector<Lease>> leases = AcquireIn(rank, indices, TierKind::kPinnedHost, deadline);
  if (!leases.ok()) return leases.status();
  // Within what the gradients leave (pinned shards stay, even over it).
  TrimToBudget();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> ParamCache::AcquireDevice(uint32_t rank, absl::Span<const uint32_t> indices,
                                                                absl::Time deadline) {
  if (!has_device_tier()) {
    return absl::FailedPreconditionError(
        "Acquire into the device tier: this daemon has no device tier (start stratad with --device cuda or "
        "--device emulated)");
  }
  {
    absl::MutexLock lock(&mu_);
    if (device_budget_ == 0) {
      return absl::FailedPreconditionError(
          "Acquire into the device tier: the job has no device budget (create it with device_budget_bytes > 0)");
    }
  }
  absl::StatusOr<std::vector<Lease>> leases = AcquireIn(rank, indices, TierKind::kDevice, deadline);
  if (!leases.ok()) return leases.status();
  std::vector<uint64_t> offsets;
  offsets.reserve(leases->size());
  for (const Lease& l : *leases) offsets.push_back(l.slot.offset_bytes);
  return offsets;
}

absl::Status ParamCache::Release(uint32_t rank, absl::Span<const uint32_t> indices) {
  std::vector<LeaseId> ids;
  {
    absl::MutexLock lock(&mu_);
    absl::flat_hash_map<Index, size_t> wanted;
    for (uint32_t index : indices) ++wanted[{rank, index}];
    for (const auto& [i, n] : wanted) {
      auto it = leases_.find(i);
      if (it == leases_.end() || it->second.size() < n) {
        return absl::FailedPreconditionError(
            absl::StrCat("param shard ", i.second, " of rank ", rank, " is not acquired"));
      }
    }
    for (uint32_t index : indices) {
      std::vector<LeaseId>& held = leases_[{rank, index}];
      ids.push_back(held.back());
      held.pop_back();
      if (held.empty()) leases_.erase({rank, index});
    }
  }
  for (LeaseId id : ids) (void)store_->Release(id, false);
  return absl::OkStatus();
}

void ParamCache::ReleaseAll(uint32_t rank) {
  std::vector<LeaseId> ids;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->first.first == rank) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        leases_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (LeaseId id : ids) (void)store_->Release(id, false);
}

void ParamCache::IterationBoundary(uint32_t rank) {
  if (rank >= ranks_ || predictor_ == nullptr) return;
  predictor_->EndIteration(rank);
  // Bring up the start of the next iteration while the step runs.
  Prefetch(rank);
}

void ParamCache::BeginUpdate() {
  std::vector<TransferHandle> in_flight;
  {
    absl::MutexLock lock(&mu_);
    updating_ = true;
    // Promotions asked for before the flag was up are in in_flight_ once
    // their callers are done issuing.
    while (issuing_ > 0) changed_.Wait(&mu_);
    in_flight.swap(in_flight_);
  }
  for (const TransferHandle& h : in_flight) (void)h->Wait();
}

void ParamCache::EndUpdate() {
  {
    absl::MutexLock lock(&mu_);
    updating_ = false;
    changed_.SignalAll();
  }
  TrimToBudget();
  for (uint32_t rank = 0; rank < ranks_; ++rank) Prefetch(rank);
}

absl::StatusOr<ParamMove> ParamCache::Park(TierKind to) {
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (to != TierKind::kPinnedHost && to != TierKind::kNvme) {
    return absl::InvalidArgumentError(
        absl::StrCat("Park to ", TierKindName(to), ": a job parks in pinned_host or nvme"));
  }
  const absl::Time start = absl::Now();
  std::vector<Index> known;
  std::vector<TransferHandle> in_flight;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [i, ids] : leases_) {
      if (!ids.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Park: rank ", i.first, " holds param shard ", i.second, "; release its shards first"));
      }
    }
    known.assign(known_.begin(), known_.end());
    in_flight.swap(in_flight_);
    updating_ = true;  // no prefetch while parking
  }
  for (const TransferHandle& h : in_flight) (void)h->Wait();
  std::sort(known.begin(), known.end());
  ParamMove move;
  std::vector<std::pair<ShardKey, TierKind>> parked;
  std::vector<std::pair<TransferHandle, ShardKey>> demotes;
  absl::Status status;
  for (const Index& i : known) {
    const ShardKey key = KeyOf(i.first, i.second);
    absl::StatusOr<ShardInfo> info = store_->Describe(key);
    if (!info.ok()) continue;
    bool above = false;
    for (TierKind t : {TierKind::kDevice, TierKind::kPinnedHost}) {
      if (TierIndex(t) < TierIndex(to) && info->current[TierIndex(t)]) {
        parked.emplace_back(key, t);
        above = true;
      }
    }
    if (!above) continue;
    if (to == TierKind::kPinnedHost && info->current[TierIndex(TierKind::kDevice)] &&
        !info->current[TierIndex(TierKind::kPinnedHost)]) {
      // Parked in the window: the device copy goes there first.
      PromoteOptions options;
      options.demand = true;
      absl::StatusOr<TransferHandle> up = store_->Promote(key, TierKind::kPinnedHost, options);
      absl::Status s = up.ok() ? (*up)->Wait() : up.status();
      if (!s.ok()) {
        status = s;
        break;
      }
      move.bytes_moved += (*up)->bytes_up();
    }
    absl::StatusOr<TransferHandle> h = store_->Demote(key, to);
    if (!h.ok()) {
      status = h.status();
      break;
    }
    demotes.emplace_back(*h, key);
    ++move.shards;
  }
  for (const auto& [h, key] : demotes) {
    absl::Status s = h->Wait();
    if (!s.ok() && status.ok()) status = s;
    move.bytes_moved += h->bytes_down();
  }
  {
    absl::MutexLock lock(&mu_);
    updating_ = false;
    changed_.SignalAll();
    if (status.ok()) parked_ = std::move(parked);
  }
  if (!status.ok()) return Context(status, absl::StrCat("parking job ", job_id_, " in ", TierKindName(to)));
  move.top = to;
  move.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return move;
}

absl::StatusOr<ParamMove> ParamCache::Resume() {
  if (absl::Status s = Usable(); !s.ok()) return s;
  const absl::Time start = absl::Now();
  std::vector<std::pair<ShardKey, TierKind>> parked;
  {
    absl::MutexLock lock(&mu_);
    parked.swap(parked_);
  }
  // Slower tiers first, so a device copy comes from the window where both
  // were resident.
  std::stable_sort(parked.begin(), parked.end(),
                   [](const auto& a, const auto& b) { return TierIndex(a.second) > TierIndex(b.second); });
  ParamMove move;
  absl::flat_hash_set<ShardKey> shards;
  absl::Status status;
  for (const auto& [key, tier] : parked) {
    PromoteOptions options;
    options.demand = true;
    absl::StatusOr<TransferHandle> h = store_->Promote(key, tier, options);
    absl::Status s = h.ok() ? (*h)->Wait() : h.status();
    if (!s.ok()) {
      status = s;
      break;
    }
    move.bytes_moved += (*h)->bytes_up();
    shards.insert(key);
    if (TierIndex(tier) < TierIndex(move.top)) move.top = tier;
  }
  if (!status.ok()) return Context(status, absl::StrCat("resuming job ", job_id_));
  move.shards = shards.size();
  move.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return move;
}

ParamCacheStats ParamCache::stats() const {
  ParamCacheStats s;
  {
    absl::MutexLock lock(&mu_);
    s.window = window_stats_;
    s.device = device_stats_;
  }
  for (const ParamTierStats* t : {&s.window, &s.device}) {
    s.hits += t->hits;
    s.misses += t->misses;
    s.waits_in_flight += t->waits_in_flight;
    s.stall_s += t->stall_s;
  }
  if (store_ == nullptr) return s;
  const StoreStats js = store_->job_stats(JobId(job_id_));
  for (auto [tier, t] : {std::pair{TierKind::kPinnedHost, &s.window}, std::pair{TierKind::kDevice, &s.device}}) {
    t->bytes = store_->job_charged_bytes(JobId(job_id_), tier);
    t->prefetches = js.tier(tier).prefetches_issued;
    t->prefetches_unused = js.tier(tier).prefetches_wasted;
  }
  s.prefetches = js.prefetches_issued;
  s.prefetches_unused = js.prefetches_wasted;
  s.bytes_read = js.tier(TierKind::kPinnedHost).bytes_in + js.tier(TierKind::kDevice).bytes_in;
  s.bytes_written = js.tier(TierKind::kNvme).bytes_in;
  return s;
}

}  // namespace strata
