#include "daemon/param_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/shard_key.h"
#include "swap/extent_store.h"

namespace strata {
namespace {

ShardKey HomeKey(uint64_t job, uint32_t rank, uint32_t index) {
  return ShardKey{JobId(job), Rank(rank), TensorId(index), TensorKind::kParam16, 0};
}

}  // namespace

ParamCache::ParamCache(uint64_t job_id, uint32_t ranks, ExtentStore* store, Locate locate,
                       uint64_t budget_bytes, uint32_t lookahead, TransferExecutor* workers, Discard discard)
    : job_id_(job_id),
      store_(store),
      locate_(std::move(locate)),
      budget_bytes_(budget_bytes),
      lookahead_(lookahead),
      discard_(std::move(discard)),
      traces_(ranks),
      workers_(workers) {}

ParamCache::~ParamCache() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  changed_.SignalAll();
  // A read writes into the exchange region: the turn queued or running must
  // be over before the region goes (queued reads are dropped).
  while (read_scheduled_) changed_.Wait(&mu_);
}

absl::Status ParamCache::StoreHome(uint32_t rank, uint32_t index) {
  ShardRef ref = locate_(rank, index);
  absl::Status s =
      store_->Write(HomeKey(job_id_, rank, index), absl::Span<const std::byte>(ref.slot, ref.bytes));
  absl::MutexLock lock(&mu_);
  if (!s.ok()) return s;
  stats_.bytes_written += ref.bytes;
  Entry& e = entries_[{rank, index}];
  if (e.state != State::kResident) {
    e.state = State::kResident;
    e.bytes = ref.bytes;
    resident_bytes_ += ref.bytes;
  }
  e.read_error = absl::OkStatus();
  // The step just rewrote every shard; keep within the budget by dropping the
  // unpinned shards needed last.
  MakeRoomLocked(rank, 0);
  return absl::OkStatus();
}

absl::Status ParamCache::ReadHome(uint32_t rank, uint32_t index, absl::Span<std::byte> into) const {
  const ShardRef ref = locate_(rank, index);
  absl::StatusOr<uint64_t> got = store_->Read(HomeKey(job_id_, rank, index), into);
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

ShardKey ParamCache::KeyOf(uint32_t rank, uint32_t index) const { return HomeKey(job_id_, rank, index); }

double ParamCache::DistanceLocked(uint32_t rank, uint32_t index) const {
  return traces_[rank].predictor.NextUse(KeyOf(rank, index));
}

bool ParamCache::MakeRoomLocked(uint32_t rank, uint64_t bytes) {
  while (resident_bytes_ + reserved_bytes_ + bytes > budget_bytes_) {
    // Evict the unpinned resident shard needed farthest ahead.
    std::pair<uint32_t, uint32_t> victim;
    double worst = 0;
    bool found = false;
    for (auto& [key, e] : entries_) {
      if ((rank != kAnyRank && key.first != rank) || e.state != State::kResident || e.pins > 0) continue;
      double d = DistanceLocked(key.first, key.second);
      if (!found || d > worst) {
        worst = d;
        victim = key;
        found = true;
      }
    }
    if (!found) return false;
    EvictLocked(victim);
  }
  return true;
}

void ParamCache::EvictLocked(std::pair<uint32_t, uint32_t> key) {
  Entry& e = entries_[key];
  if (e.prefetched_unused) ++stats_.prefetches_unused;
  e.prefetched_unused = false;
  e.state = State::kAbsent;
  resident_bytes_ -= e.bytes;
  // A clean copy of its home: the memory goes back.
  if (discard_) discard_(key.first, key.second);
}

uint64_t ParamCache::SetReserved(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_bytes_ = bytes;
  MakeRoomLocked(kAnyRank, 0);
  return resident_bytes_;
}

bool ParamCache::Drop(uint32_t rank, uint32_t index) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find({rank, index});
  if (it == entries_.end() || it->second.state != State::kResident || it->second.pins > 0) return false;
  EvictLocked(it->first);
  return true;
}

uint64_t ParamCache::resident_bytes() const {
  absl::MutexLock lock(&mu_);
  return resident_bytes_;
}

void ParamCache::StartReadLocked(uint32_t rank, uint32_t index, bool prefetch) {
  Entry& e = entries_[{rank, index}];
  if (e.state != State::kAbsent) return;
  ShardRef ref = locate_(rank, index);
  if (!MakeRoomLocked(rank, ref.bytes)) {
    if (prefetch) return;  // no room for a guess; a demand read goes over budget
  }
  e.state = State::kReading;
  e.bytes = ref.bytes;
  e.prefetched_unused = prefetch;
  resident_bytes_ += ref.bytes;
  if (prefetch) ++stats_.prefetches;
  reads_.push_back({rank, index});
  ScheduleReadLocked();
  changed_.SignalAll();
}

void ParamCache::PrefetchLocked(uint32_t rank) {
  if (updating_) return;
  // The next `lookahead_` predicted accesses, nearest first.
  std::vector<uint32_t> next;
  traces_[rank].predictor.Walk([&](const ShardKey& key, size_t) {
    next.push_back(key.tensor.value());
    return next.size() < lookahead_;
  });
  for (uint32_t index : next) StartReadLocked(rank, index, /*prefetch=*/true);
}

void ParamCache::ScheduleReadLocked() {
  if (read_scheduled_ || stopping_ || updating_ || reads_.empty()) return;
  read_scheduled_ = true;
  workers_->Schedule([this] { ReadTurn(); });
}

void ParamCache::ReadTurn() {
  std::pair<uint32_t, uint32_t> next;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || updating_ || reads_.empty()) {
      // Stopped, or BeginUpdate dropped the reads; EndUpdate schedules anew.
      read_scheduled_ = false;
      changed_.SignalAll();
      return;
    }
    next = reads_.front();
    reads_.pop_front();
    ++reads_in_flight_;
  }
  ShardRef ref = locate_(next.first, next.second);
  absl::StatusOr<uint64_t> got =
      store_->Read(HomeKey(job_id_, next.first, next.second), absl::Span<std::byte>(ref.slot, ref.bytes));
  absl::MutexLock lock(&mu_);
  --reads_in_flight_;
  Entry& e = entries_[next];
  if (got.ok() && *got != ref.bytes) {
    got = absl::DataLossError(absl::StrCat("param shard ", next.second, " of rank ", next.first,
                                           " is ", *got, " bytes on NVMe, expected ", ref.bytes));
  }
  if (!got.ok()) {
    e.read_error = got.status();
    e.state = State::kAbsent;
    resident_bytes_ -= e.bytes;
    if (discard_) discard_(next.first, next.second);  // whatever half arrived
  } else {
    e.read_error = absl::OkStatus();  // an earlier failed read of this shard is history
    e.state = State::kResident;
    stats_.bytes_read += ref.bytes;
  }
  read_scheduled_ = false;
  ScheduleReadLocked();  // the next read waits behind other jobs' turns
  changed_.SignalAll();
}

absl::Status ParamCache::Acquire(uint32_t rank, absl::Span<const uint32_t> indices, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const absl::Time start = absl::Now();
  RankTrace& t = traces_[rank];
  for (uint32_t index : indices) {
    t.current.push_back(KeyOf(rank, index));
    (void)t.predictor.Observe(KeyOf(rank, index));
    Entry& e = entries_[{rank, index}];
    if (e.state == State::kResident) {
      ++stats_.hits;
    } else if (e.state == State::kReading) {
      ++stats_.waits_in_flight;
    } else {
      ++stats_.misses;
      StartReadLocked(rank, index, /*prefetch=*/false);
    }
    ++entries_[{rank, index}].pins;
  }
  PrefetchLocked(rank);
  for (uint32_t index : indices) {
    while (entries_[{rank, index}].state == State::kReading) {
      if (changed_.WaitWithDeadline(&mu_, deadline)) {
        if (entries_[{rank, index}].state == State::kReading) {
          for (uint32_t i : indices) --entries_[{rank, i}].pins;
          return absl::DeadlineExceededError(
              absl::StrCat("param shard ", index, " of rank ", rank, " did not arrive from NVMe in time"));
        }
      }
    }
    Entry& e = entries_[{rank, index}];
    e.prefetched_unused = false;
    if (!e.read_error.ok() || e.state != State::kResident) {
      absl::Status error = e.read_error.ok() ? absl::UnavailableError("read failed") : e.read_error;
      for (uint32_t i : indices) --entries_[{rank, i}].pins;
      return absl::Status(error.code(), absl::StrCat("reading param shard ", index, " of rank ", rank,
                                                     " from NVMe: ", error.message(),
                                                     "; the job's state is unchanged: Acquire again (the read "
                                                     "is retried), and if the shard keeps failing restore the "
                                                     "job from a checkpoint (LoadCheckpoint)"));
    }
  }
  stats_.stall_s += absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status ParamCache::Release(uint32_t rank, absl::Span<const uint32_t> indices) {
  absl::MutexLock lock(&mu_);
  for (uint32_t index : indices) {
    auto it = entries_.find({rank, index});
    if (it == entries_.end() || it->second.pins == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("param shard ", index, " of rank ", rank, " is not acquired"));
    }
  }
  for (uint32_t index : indices) --entries_[{rank, index}].pins;
  return absl::OkStatus();
}

void ParamCache::ReleaseAll(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, e] : entries_) {
    if (key.first == rank) e.pins = 0;
  }
}

void ParamCache::IterationBoundary(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  RankTrace& t = traces_[rank];
  t.predictor.EndIteration(t.current, t.previous);
  t.previous = std::move(t.current);
  t.current.clear();
  // Bring up the start of the next iteration while the step runs.
  PrefetchLocked(rank);
}

void ParamCache::BeginUpdate() {
  absl::MutexLock lock(&mu_);
  updating_ = true;
  // Queued reads never start: their shards go back to absent.
  for (const auto& key : reads_) {
    Entry& e = entries_[key];
    if (e.state == State::kReading) {
      e.state = State::kAbsent;
      resident_bytes_ -= e.bytes;
      if (e.prefetched_unused) ++stats_.prefetches_unused;
      e.prefetched_unused = false;
    }
  }
  reads_.clear();
  while (reads_in_flight_ > 0) changed_.Wait(&mu_);
}

void ParamCache::EndUpdate() {
  absl::MutexLock lock(&mu_);
  updating_ = false;
  for (uint32_t rank = 0; rank < traces_.size(); ++rank) PrefetchLocked(rank);
  ScheduleReadLocked();
  changed_.SignalAll();
}

ParamCacheStats ParamCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace strata
