// TieredStore: shards of training state kept across the tiers (device,
// pinned host, NVMe), each with a home tier that always holds a slot for it
// and copies in faster tiers that come and go.
//
// Movement. Promote(key, tier) brings a copy up asynchronously and returns a
// Transfer to wait on; a second Promote of a copy already in flight returns
// the same Transfer. A promotion that does not fit the tier's capacity or the
// job's budget evicts cached copies chosen by the EvictionPolicy; if the
// policy refuses (prefetch: nothing needed later than the incoming shard) or
// nothing is evictable, the promotion fails with ResourceExhausted. Demote
// drops cached copies. Dirty copies (written through a lease, newer than the
// home copy) are written back to the home tier before they are dropped; a
// cached copy is dropped without a write-back when another current copy
// survives it.
//
// Use. Acquire(key, tier) pins a current copy in `tier` and returns a Lease;
// if the copy is being promoted it waits for that promotion instead of
// starting a second one, and if it is absent it starts a demand promotion.
// Release unpins (marking the copy dirty if the holder wrote it). Pinned
// copies are never evicted or dropped. Every lease has a deadline: a client
// that dies without releasing loses its pins at ExpireLeases() (which the
// daemon calls periodically, and the store calls itself when eviction finds
// everything pinned). Writes through a lease are not exclusive: clients that
// write one shard from two places coordinate among themselves, as ZeRO ranks do.
// The store's own transfers never read a copy under a write lease (the bytes
// would be torn): a write Acquire waits for the transfers reading the copy,
// and a transfer from a copy being written waits for the Release (Acquire) or
// is Unavailable (Promote, WriteBack). So a holder of a write lease must not
// Acquire the same shard in another tier before releasing it.
//
// Budgets. Each tier's capacity, and optionally a per-job budget per tier,
// bound the bytes charged to copies (footprints: sizes rounded up to the
// tier's allocation unit). Budgets are never exceeded: a copy's charge is
// taken before its slot is allocated and returned when it is dropped.
//
// Fragmentation. A tier that sub-allocates an arena (first fit over shards
// of mixed sizes) can refuse a slot the charge allows: enough free bytes, no
// free range long enough (Tier::FreeSpaceFor tells the two apart). The store
// then evicts more of the same job's unpinned copies in that tier -- by the
// eviction policy, among the copies whose freeing leaves a long enough range
// when there are any (else those next to free space, else any) -- and
// retries, as a caching allocator frees cached blocks and retries; when
// nothing of the job is left to evict, ResourceExhausted says "fragmented"
// with the budget, the free bytes, the largest free range and the request.
// It never evicts another job's copies for this, and never moves a slot
// (a pinned copy's offset is in a client's hands). So an arena needs no
// headroom over the budget.
//
// Concurrency. Thread-safe. One mutex guards the shard table; it is never
// held across I/O: the data moves in the TransferExecutor (a thread pool in
// the daemon; inline in the simulated benchmark), between Tier::Read/Write
// calls made without the lock. Counters: stats().
//
// Errors: NotFound (unknown shard or lease), InvalidArgument (bad tier for
// the operation, size mismatch), FailedPrecondition (removing or demoting a
// pinned or moving shard), ResourceExhausted (no room), and the tiers' I/O
// errors with the shard named.
#ifndef STRATA_TIERS_TIERED_STORE_H_
#define STRATA_TIERS_TIERED_STORE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/clock.h"
#include "core/ids.h"
#include "core/shard_key.h"
#include "core/tier_kind.h"
#include "tiers/eviction_policy.h"
#include "tiers/store_stats.h"
#include "tiers/tier.h"
#include "tiers/transfer.h"
#include "tiers/transfer_executor.h"

namespace strata {

enum class AccessMode : uint8_t { kRead = 0, kWrite = 1 };

struct LeaseId {
  uint64_t value = 0;
  friend bool operator==(LeaseId, LeaseId) = default;
};

// A pin on one copy. The slot stays valid (and the copy in place) until the
// lease is released or expires.
struct Lease {
  LeaseId id;
  ShardKey key;
  TierKind tier = TierKind::kDevice;
  AccessMode mode = AccessMode::kRead;
  TierSlot slot;
  absl::Time deadline;
};

struct PromoteOptions {
  // Counted as a prefetch, and the eviction policy may refuse to make room
  // (a demand promotion, from Acquire, always gets a victim if one exists).
  bool prefetch = false;
  // A prefetch of a shard needed very soon (passed to the policy).
  bool urgent = false;
  // A client waits for this copy now (as Acquire's own promotion): the
  // policy must choose a victim if there is one.
  bool demand = false;
};

// A snapshot of one shard, for tests, the CLI and the prefetcher.
struct ShardInfo {
  ShardKey key;
  uint64_t size_bytes = 0;
  TierKind home = TierKind::kNvme;
  std::array<bool, kNumTiers> current{};    // holds the latest data, ready to acquire
  std::array<bool, kNumTiers> in_flight{};  // being filled or written back
  std::array<int, kNumTiers> pins{};
  bool dirty = false;  // some copy is newer than the home copy
};

struct TieredStoreOptions {
  Clock* clock = nullptr;                // borrowed, required: lease deadlines, stall time
  TransferExecutor* executor = nullptr;  // borrowed, required
  EvictionPolicy* policy = nullptr;      // borrowed; null: LRU
  absl::Duration default_lease = absl::Seconds(60);
};

class TieredStore {
 public:
  // `tiers`: at most one per TierKind, borrowed, outliving the store.
  // InvalidArgument when a tier kind repeats, none is given, or a required
  // option is missing.
  static absl::StatusOr<std::unique_ptr<TieredStore>> Create(std::vector<Tier*> tiers,
                                                             const TieredStoreOptions& options);
  // Waits for transfers in flight, then frees every slot.
  ~TieredStore();

  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // Caps the bytes `job` may hold in `tier` (0 removes the cap). Copies
  // already over a lowered cap stay until evicted.
  absl::Status SetJobBudget(JobId job, TierKind tier, uint64_t bytes);

  // Creates `key` with `data` in its `home` tier (blocking: the data is
  // written before it returns). AlreadyExists; ResourceExhausted when the home
  // tier or the job's budget there is full (home copies are never evicted).
  absl::Status AddShard(const ShardKey& key, TierKind home, absl::Span<const std::byte> data);
  // Registers `key` whose home copy already exists in `home` (a tier whose
  // slots are named by the key, such as NvmeTier over an extent written
  // earlier, or by an earlier daemon): charges and allocates the home slot
  // without writing it. The home is taken as the latest version; when no
  // data was ever written there, reads fail with the tier's error until a
  // newer version is written back.
  absl::Status AdoptShard(const ShardKey& key, TierKind home, uint64_t size_bytes);
  // Forgets `key` and frees its slots. FailedPrecondition when pinned or moving.
  absl::Status RemoveShard(const ShardKey& key);

  // Brings a current copy of `key` into `tier` (faster than or equal to the
  // home tier: InvalidArgument otherwise). Returns at once; the Transfer says
  // when it is there. Errors that are known at once (NotFound,
  // ResourceExhausted) are returned directly.
  absl::StatusOr<TransferHandle> Promote(const ShardKey& key, TierKind tier,
                                         const PromoteOptions& options = {});
  // Drops the copies of `key` in tiers faster than `tier`, writing dirty data
  // back to the home tier first. `tier` must not be slower than the home.
  // FailedPrecondition when one of those copies is pinned or moving.
  absl::StatusOr<TransferHandle> Demote(const ShardKey& key, TierKind tier);

  // Writes the latest data of `key` to its home tier now, keeping the cached
  // copies (they become clean, so evicting them later costs no write-back).
  // Completed at once when the home copy is current.
  absl::StatusOr<TransferHandle> WriteBack(const ShardKey& key);
  // The cached (non-home) copies resident in `tier`, sorted by key: what
  // an eviction could choose from.
  struct CachedCopy {
    ShardKey key;
    bool dirty = false;  // would need a write-back if evicted now
    bool pinned = false;
  };
  std::vector<CachedCopy> CachedCopies(TierKind tier) const;

  // Pins a current copy of `key` in `tier`, waiting for (or starting) its
  // promotion. The lease lasts `lease` (default: options.default_lease).
  // Errors of the promotion are returned (ResourceExhausted when nothing can
  // be evicted).
  absl::StatusOr<Lease> Acquire(const ShardKey& key, TierKind tier, AccessMode mode,
                                std::optional<absl::Duration> lease = std::nullopt);
  // Pins a slot for `key` in `tier` (faster than its home) for a write that
  // replaces the whole shard: nothing is read into it (the old bytes may be
  // anything). The copy becomes the latest version when released dirty, and
  // is dropped as stale when released clean. Waits for transfers into or out
  // of that slot; a slot not yet there is charged as a demand promotion
  // (evicting by the policy) and allocated.
  absl::StatusOr<Lease> AcquireForOverwrite(const ShardKey& key, TierKind tier,
                                            std::optional<absl::Duration> lease = std::nullopt);
  // Unpins. `dirty` (only for kWrite leases: InvalidArgument otherwise) makes
  // this copy the latest version; other copies become stale and are dropped
  // as soon as nobody uses them. NotFound when the lease expired or is unknown.
  absl::Status Release(LeaseId lease, bool dirty);
  // Drops `job`'s clean, unpinned, idle cached copies in `tier`, chosen by
  // the policy (as for a demand miss), until the job holds at most
  // `target_bytes` there (or nothing droppable is left). Never blocks on
  // I/O: dirty copies are left (Demote writes them back). With `incoming`,
  // the room is for that shard's prefetch: the policy may refuse (do no
  // harm) and the trim then stops short. Copies of `keep` stay (shards about
  // to be acquired). Returns the job's charged bytes in `tier` afterwards.
  uint64_t Trim(JobId job, TierKind tier, uint64_t target_bytes,
                const std::optional<ShardKey>& incoming = std::nullopt, bool urgent = false,
                absl::Span<const ShardKey> keep = {});
  // Drops the cached copy of `key` in `tier` now when it is clean, unpinned
  // and idle. NotFound when absent; FailedPrecondition when pinned, moving,
  // or the only current copy.
  absl::Status Evict(const ShardKey& key, TierKind tier);
  // Moves the deadline to now + `lease`. NotFound when expired or unknown.
  absl::Status RenewLease(LeaseId lease, absl::Duration duration);
  // Drops every lease past its deadline; returns how many.
  size_t ExpireLeases();

  // Copy the leased copy's bytes out of / into host memory (any tier; for the
  // pinned tier HostView is cheaper). WriteShard needs a kWrite lease and does
  // not by itself mark the copy dirty: Release(lease, true) does.
  absl::Status ReadShard(const Lease& lease, absl::Span<std::byte> dst);
  absl::Status WriteShard(const Lease& lease, absl::Span<const std::byte> src);
  // Replaces the whole shard with `src` by writing it to its home tier
  // directly (from the caller's buffer: no cached slot is faulted in or
  // written first), dropping the cached copies, which would be stale. For a
  // writer that produced the new bytes in memory of its own (the optimizer
  // step's staging) and has no use for a cached copy. FailedPrecondition,
  // touching nothing, when a cached copy is pinned, moving or the only
  // latest version, or a transfer reads the home: the caller then goes
  // through AcquireForOverwrite. The caller keeps others from acquiring or
  // promoting `key` until it returns (a promotion started meanwhile ends
  // stale and is dropped, but a pin taken on it in between would see a mix).
  // The bytes count as moved down into the home (its bytes_in, bytes_down).
  absl::Status WriteHome(const ShardKey& key, absl::Span<const std::byte> src);
  // As WriteHome, but the caller stored the new version already, in the home
  // tier's medium under a name of its own, and `install(home tier, home
  // slot)` puts it in place of the home's version (for the NVMe home:
  // ExtentStore::Rename, no data moved). Same preconditions and the same
  // effect on the cached copies; the shard's bytes count as moved down, as
  // the caller's write did move them. An error from `install` leaves the
  // home as it was (the cached copies, clean copies of it, are dropped).
  absl::Status InstallHome(const ShardKey& key,
                           absl::FunctionRef<absl::Status(Tier& home, const TierSlot& slot)> install);
  // The leased copy's memory when its tier is host-addressable; else empty.
  absl::Span<std::byte> HostView(const Lease& lease);

  // True when `tier` holds a current copy of `key` that Acquire would pin
  // without waiting.
  bool IsResident(const ShardKey& key, TierKind tier) const;
  // True when a promotion of `key` into `tier` is in flight.
  bool IsInFlight(const ShardKey& key, TierKind tier) const;
  absl::StatusOr<ShardInfo> Describe(const ShardKey& key) const;
  std::vector<ShardKey> Keys() const;

  // Bytes charged in `tier` (all jobs, or one job).
  uint64_t charged_bytes(TierKind tier) const;
  uint64_t job_charged_bytes(JobId job, TierKind tier) const;
  // The tier's capacity as the store budgets it; 0 when the tier is absent.
  uint64_t capacity_bytes(TierKind tier) const;
  bool has_tier(TierKind tier) const { return tiers_[TierIndex(tier)] != nullptr; }

  StoreStats stats() const;
  // The counters of `job`'s shards alone (zero for an unknown job).
  StoreStats job_stats(JobId job) const;

  // Checks the store's invariants: charges within capacities and job budgets
  // and equal to the sum of the copies' footprints; pinned copies resident;
  // every shard's latest version held by some copy. Internal when broken
  // (naming the shard); for tests and debug builds.
  absl::Status CheckInvariants() const;

 private:
  enum class CopyState : uint8_t { kAbsent, kLoading, kResident, kEvicting };
  struct Copy {
    CopyState state = CopyState::kAbsent;
    TierSlot slot;
    uint64_t version = 0;
    int pins = 0;
    int writers = 0;  // write leases among the pins
    int io_refs = 0;  // transfers reading from this copy
    bool charged = false;
    bool prefetched_unused = false;
    uint64_t last_use_tick = 0;
    TransferHandle transfer;  // while kLoading or kEvicting
  };
  struct Shard {
    ShardKey key;
    uint64_t size_bytes = 0;
    TierKind home = TierKind::kNvme;
    uint64_t version = 1;  // of the latest data
    std::array<Copy, kNumTiers> copies;
  };
  // A dirty cached copy to write to the home before its slot is freed.
  struct PendingWriteBack {
    Shard* shard;
    TierKind tier;
  };
  // One movement of data into `dst` (a promotion, or a write-back to the
  // home when dst is the home), with the write-backs its room needed first.
  struct CopyOp {
    Shard* shard;
    TierKind src;
    TierKind dst;
    uint64_t src_version;
    bool prefetch;
    bool demand;  // for the eviction policy, should fragmentation need more room
    bool urgent;
    std::vector<PendingWriteBack> write_backs;
    TransferHandle handle;
  };
  struct DemoteOp {
    Shard* shard;
    std::vector<TierKind> dropped;          // copies in kEvicting
    std::optional<TierKind> write_back_from;  // the dirty copy to save first
    TransferHandle handle;
  };
  struct LeaseRecord {
    Shard* shard;
    TierKind tier;
    AccessMode mode;
    absl::Time deadline;
  };

  TieredStore(std::vector<Tier*> tiers, const TieredStoreOptions& options);

  Tier* tier(TierKind kind) const { return tiers_[TierIndex(kind)]; }
  Shard* FindLocked(const ShardKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsCurrentLocked(const Shard& shard, TierKind t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fastest copy other than `exclude` that holds the latest data and may
  // be read now.
  std::optional<TierKind> SourceLocked(const Shard& shard, TierKind exclude) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NeedsWriteBackLocked(const Shard& shard, TierKind t) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Takes `footprint` in `t` for `shard`, evicting by policy as needed.
  absl::Status ChargeLocked(Shard& shard, TierKind t, uint64_t footprint, bool demand,
                            bool urgent, std::vector<PendingWriteBack>* write_backs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnchargeLocked(Shard& shard, TierKind t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocates the slot of `shard`'s copy in `t`, whose footprint is charged
  // already. A refusal then means victims' slots not yet freed (it waits for
  // the transfers freeing them) or fragmentation, which it mends by evicting
  // more of the job's unpinned copies in `t` and retrying (see the header
  // comment); their write-backs run here, with the lock released meanwhile.
  absl::StatusOr<TierSlot> AllocateChargedLocked(Shard& shard, TierKind t, bool demand, bool urgent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResourceExhausted for a slot that fits the job's budget but no free range.
  absl::Status FragmentedErrorLocked(const Shard& shard, TierKind t, const Tier::FreeSpace& space,
                                     absl::string_view why) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the cached copy of `shard` in `t` (REQUIRES evictable), queueing a
  // write-back when it is the only current copy.
  void EvictLocked(Shard& shard, TierKind t, std::vector<PendingWriteBack>* write_backs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the slot of a cached copy and marks it absent.
  void DropCopyLocked(Shard& shard, TierKind t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops stale cached copies nobody uses.
  void DropStaleLocked(Shard& shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WriteHome and InstallHome: checks (`src_bytes`, when given, against the
  // shard's size), drops the cached copies, then `put` makes the home's new
  // version (outside the lock; the home copy is held meanwhile).
  absl::Status ReplaceHome(const ShardKey& key, std::optional<uint64_t> src_bytes,
                           absl::FunctionRef<absl::Status(Tier*, const TierSlot&)> put) ABSL_LOCKS_EXCLUDED(mu_);
  size_t ExpireLeasesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Prepares (under the lock) a movement of the latest data into `dst`.
  // Returns the op to run, or a status (Unavailable: wait and retry).
  absl::StatusOr<std::unique_ptr<CopyOp>> StartCopyLocked(Shard& shard, TierKind dst,
                                                          const PromoteOptions& options,
                                                          bool demand)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Launch(std::unique_ptr<CopyOp> op) ABSL_LOCKS_EXCLUDED(mu_);
  void RunCopy(CopyOp& op) ABSL_LOCKS_EXCLUDED(mu_);
  void RunDemote(DemoteOp& op) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the cached copy `t` of `shard` to its home slot (no lock held).
  absl::Status WriteBackData(Shard& shard, TierKind t) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves `size` bytes between two slots, through host memory when needed.
  absl::Status CopyData(TierKind src, const TierSlot& src_slot, TierKind dst,
                        const TierSlot& dst_slot, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the write-backs a charge queued (no lock held).
  // Writes evicted dirty copies home; `bytes_written` (optional) grows by
  // what reached the home tier.
  absl::Status RunWriteBacks(const std::vector<PendingWriteBack>& write_backs,
                             uint64_t* bytes_written = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // AddShard (`data` set: written to the new home slot) and AdoptShard
  // (`data` null: the home tier already holds the bytes).
  absl::Status PlaceHome(const ShardKey& key, TierKind home, uint64_t size_bytes,
                         const absl::Span<const std::byte>* data) ABSL_LOCKS_EXCLUDED(mu_);
  void CountMoveLocked(JobId job, TierKind src, TierKind dst, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A prefetched copy in tier `t` dropped before any acquire.
  void CountWastedLocked(JobId job, TierKind t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NoOpsInFlight() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ops_in_flight_ == 0; }

  const std::array<Tier*, kNumTiers> tiers_;
  const TieredStoreOptions options_;
  LruPolicy default_policy_;
  EvictionPolicy* const policy_;

  mutable absl::Mutex mu_;
  // Signalled (SignalAll) whenever a copy changes state or a pin is dropped.
  absl::CondVar changed_;
  absl::flat_hash_map<ShardKey, std::unique_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  // Shards with a cached (non-home) copy in kResident, per tier: the
  // eviction candidates.
  std::array<absl::flat_hash_set<Shard*>, kNumTiers> cached_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, kNumTiers> charged_ ABSL_GUARDED_BY(mu_){};
  absl::flat_hash_map<std::pair<JobId, int>, uint64_t> job_charged_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<JobId, int>, uint64_t> job_budget_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, LeaseRecord> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  // Transfers running now that will free slots of copies no longer charged
  // (victims being written back, copies being demoted), per tier of those
  // slots: an allocation the charge allows but the tier refuses waits for
  // them before it evicts anything more.
  std::array<int, kNumTiers> slots_releasing_ ABSL_GUARDED_BY(mu_){};
  int ops_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  StoreStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<JobId, StoreStats> job_stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_TIERS_TIERED_STORE_H_
