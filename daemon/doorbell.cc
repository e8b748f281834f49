#include "daemon/doorbell.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"

namespace strata {

using doorbell::kCapacity;

Doorbell::Doorbell(std::string name, uint32_t shards, DoorbellHandlers handlers)
    : name_(std::move(name)), shards_(shards), handlers_(std::move(handlers)) {}

absl::StatusOr<std::unique_ptr<Doorbell>> Doorbell::Create(DoorbellHub* hub, const std::string& name,
                                                           uint32_t shards, DoorbellHandlers handlers) {
  if (hub == nullptr) return absl::InternalError("doorbell created without a hub");
  std::unique_ptr<Doorbell> bell(new Doorbell(name, shards, std::move(handlers)));
  bell->memfd_ = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (bell->memfd_ < 0) return ErrnoToStatus(errno, absl::StrCat("memfd_create '", name, "'"));
  if (ftruncate(bell->memfd_, static_cast<off_t>(doorbell::kBytes)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("sizing doorbell '", name, "'"));
  }
  // As the exchange regions: a holder's ftruncate must fail, not SIGBUS us.
  if (fcntl(bell->memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("sealing doorbell '", name, "'"));
  }
  void* mapped = mmap(nullptr, doorbell::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, bell->memfd_, 0);
  if (mapped == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("mapping doorbell '", name, "'"));
  bell->shared_ = new (mapped) doorbell::Shared();
  bell->shared_->magic = doorbell::kMagic;
  bell->shared_->version = doorbell::kVersion;
  bell->shared_->capacity = kCapacity;
  // Non-blocking: the hub drains it without waiting, and a trainer's write
  // to a counter near its maximum fails (EAGAIN) instead of blocking it.
  bell->eventfd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (bell->eventfd_ < 0) return ErrnoToStatus(errno, absl::StrCat("eventfd for doorbell '", name, "'"));
  absl::StatusOr<uint64_t> id = hub->Add(bell.get());
  if (!id.ok()) return id.status();
  bell->hub_ = hub;
  bell->hub_id_ = *id;
  return bell;
}

Doorbell::~Doorbell() {
  if (hub_ != nullptr) hub_->Remove(hub_id_);
  if (shared_ != nullptr) {
    // A trainer still waiting goes back to gRPC, which says why.
    shared_->flags.fetch_or(doorbell::kFlagClosed);
    Wake();
    munmap(shared_, doorbell::kBytes);
  }
  if (eventfd_ >= 0) close(eventfd_);
  if (memfd_ >= 0) close(memfd_);
}

void Doorbell::Wake() {
  shared_->epoch.fetch_add(1, std::memory_order_seq_cst);
  if (shared_->client_waiters.load(std::memory_order_seq_cst) != 0) doorbell::FutexWakeAll(&shared_->epoch);
}

void Doorbell::PublishState(uint64_t open_step_plus1, uint64_t done_steps, uint32_t flags) {
  shared_->open_step_plus1.store(open_step_plus1, std::memory_order_release);
  shared_->done_steps.store(done_steps, std::memory_order_release);
  shared_->flags.store(flags, std::memory_order_release);
  Wake();  // seq_cst: orders the stores above before the epoch a waiter sees
}

void Doorbell::PublishGradWindow(uint64_t room, uint64_t keep, uint64_t held) {
  if (shared_->grad_room_bytes.load(std::memory_order_relaxed) == room &&
      shared_->grad_keep_bytes.load(std::memory_order_relaxed) == keep &&
      shared_->grad_held_bytes.load(std::memory_order_relaxed) == held) {
    return;  // (the trainer may have scribbled on these: then this publishes again)
  }
  shared_->grad_room_bytes.store(room, std::memory_order_release);
  shared_->grad_keep_bytes.store(keep, std::memory_order_release);
  shared_->grad_held_bytes.store(held, std::memory_order_release);
  Wake();
}

void Doorbell::PublishOutcome(const DoorbellOutcome& outcome) {
  doorbell::Outcome& o = shared_->outcomes[outcome.step % doorbell::kOutcomes];
  o.tag.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  o.skipped.store(outcome.skipped ? 1 : 0, std::memory_order_relaxed);
  o.loss_scale_bits.store(std::bit_cast<uint64_t>(outcome.loss_scale), std::memory_order_relaxed);
  o.grad_norm_bits.store(std::bit_cast<uint64_t>(outcome.grad_norm), std::memory_order_relaxed);
  o.optimizer_steps.store(outcome.optimizer_steps, std::memory_order_relaxed);
  o.tag.store(outcome.step + 1, std::memory_order_release);
}

void Doorbell::ReportRefusal(const absl::Status& status) {
  // A seqlock: odd while the code and text are being written.
  shared_->error_seq.store(error_seq_ + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  shared_->error_code.store(static_cast<uint64_t>(status.code()), std::memory_order_relaxed);
  doorbell::WriteText(shared_->error_text, std::string_view(status.message().data(), status.message().size()));
  error_seq_ += 2;
  shared_->error_seq.store(error_seq_, std::memory_order_release);
}

bool Doorbell::HasPending() const {
  // seq_cst: paired with the trainer's tail store and daemon_polling load.
  return !failed_ && shared_->tail.load(std::memory_order_seq_cst) != head_;
}

void Doorbell::SetPolling(bool polling) {
  shared_->daemon_polling.store(polling ? 1 : 0, std::memory_order_seq_cst);
}

int Doorbell::Service() {
  if (failed_) return -1;
  // Drain the eventfd before reading the tail: a ring after this read wakes
  // the hub again, so no published entry is left behind.
  uint64_t rings = 0;
  (void)!read(eventfd_, &rings, sizeof(rings));
  // One read of the trainer's tail; every check below is against this copy.
  const uint64_t tail = shared_->tail.load(std::memory_order_acquire);
  const uint64_t ahead = tail - head_;  // wraps for a tail behind the head: caught below
  absl::Status broken;
  if (ahead > kCapacity) {
    broken = absl::InvalidArgumentError(absl::StrCat(
        "doorbell ", name_, ": the trainer published ring position ", tail, " but the daemon has taken ", head_,
        " entries of a ", kCapacity, "-entry ring (the shared page was overwritten or the client is broken)"));
  }
  int taken = 0;
  while (broken.ok() && head_ != tail) {
    const doorbell::Entry& e = shared_->entries[head_ % kCapacity];
    const uint64_t index = e.index.load(std::memory_order_relaxed);
    const uint64_t step = e.step.load(std::memory_order_relaxed);
    ++head_;
    ++taken;
    if (index >= shards_) {
      broken = absl::OutOfRangeError(absl::StrCat("doorbell ", name_, ": entry ", head_ - 1, " names shard index ",
                                                  index, " but the rank has ", shards_, " shards"));
      break;
    }
    absl::Status s = handlers_.signal(static_cast<uint32_t>(index), step);
    if (s.code() == absl::StatusCode::kOutOfRange) {
      broken = absl::OutOfRangeError(absl::StrCat("doorbell ", name_, ": ", s.message()));
    } else if (!s.ok()) {
      ReportRefusal(s);
    }
  }
  shared_->head.store(head_, std::memory_order_release);
  if (!broken.ok()) {
    failed_ = true;
    handlers_.fail(broken);
  }
  if (taken > 0 || failed_) Wake();
  return failed_ ? -1 : taken;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<DoorbellHub>> DoorbellHub::Create(Options options) {
  std::unique_ptr<DoorbellHub> hub(new DoorbellHub(options));
  hub->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (hub->epoll_fd_ < 0) return ErrnoToStatus(errno, "epoll_create1 for the doorbell hub");
  hub->stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (hub->stop_fd_ < 0) return ErrnoToStatus(errno, "eventfd for the doorbell hub");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // ids start at 1
  if (epoll_ctl(hub->epoll_fd_, EPOLL_CTL_ADD, hub->stop_fd_, &ev) != 0) {
    return ErrnoToStatus(errno, "epoll_ctl for the doorbell hub");
  }
  DoorbellHub* self = hub.get();
  hub->thread_ = std::thread([self] { self->Loop(); });
  return hub;
}

DoorbellHub::~DoorbellHub() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (stop_fd_ >= 0) close(stop_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

DoorbellHub::Stats DoorbellHub::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<uint64_t> DoorbellHub::Add(Doorbell* bell) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, bell->eventfd(), &ev) != 0) {
    return ErrnoToStatus(errno, "adding a doorbell to the hub's epoll set");
  }
  slots_[id] = Slot{bell, bell->eventfd()};
  return id;
}

void DoorbellHub::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return;
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);  // ENOENT when muted or dead
  slots_.erase(it);
  while (servicing_ == id) serviced_.Wait(&mu_);
}

int DoorbellHub::ServiceOne(uint64_t id) {
  Doorbell* bell = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(id);
    if (it == slots_.end() || it->second.dead || it->second.muted_until != absl::InfinitePast()) return 0;
    bell = it->second.bell;
    servicing_ = id;
  }
  // Outside the lock: the handlers take the job's lock, and the job adds
  // doorbells while holding it.
  const int taken = bell->Service();
  absl::MutexLock lock(&mu_);
  servicing_ = 0;
  serviced_.SignalAll();
  ++stats_.wakeups;
  auto it = slots_.find(id);
  if (it == slots_.end()) return taken;  // removed meanwhile
  Slot& slot = it->second;
  if (taken < 0) {
    slot.dead = true;
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, slot.fd, nullptr);
    return taken;
  }
  stats_.entries += static_cast<uint64_t>(taken);
  if (taken > 0) {
    slot.empty_in_a_row = 0;
    return taken;
  }
  ++stats_.empty_wakeups;
  if (++slot.empty_in_a_row >= options_.empty_wakeups_before_mute) {
    slot.empty_in_a_row = 0;
    slot.muted_until = absl::Now() + options_.mute;
    ++stats_.mutes;
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, slot.fd, nullptr);
  }
  return 0;
}

bool DoorbellHub::PendingOf(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(id);
  return it != slots_.end() && !it->second.dead && it->second.muted_until == absl::InfinitePast() &&
         it->second.bell->HasPending();
}

void DoorbellHub::SetPollingOf(uint64_t id, bool polling) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(id);
  if (it != slots_.end() && !it->second.dead) it->second.bell->SetPolling(polling);
}

int DoorbellHub::MuteTimeoutMs() {
  int timeout_ms = -1;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (const auto& [id, slot] : slots_) {
    if (slot.muted_until == absl::InfinitePast()) continue;
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(slot.muted_until - now) + 1);
    timeout_ms = timeout_ms < 0 ? static_cast<int>(ms) : std::min(timeout_ms, static_cast<int>(ms));
  }
  return timeout_ms;
}

void DoorbellHub::Loop() {
  std::vector<epoll_event> events(64);
  // Rings that had entries within the last options_.spin: polled without
  // waiting for a ring (their trainers see daemon_polling and skip the
  // eventfd), while epoll is still looked at each round for the others. A
  // ring cools options_.spin after its last entry, so the hub spins only
  // while signals are arriving and otherwise sleeps in epoll_wait.
  absl::flat_hash_map<uint64_t, absl::Time> hot;
  while (true) {
    const int timeout_ms = hot.empty() || options_.spin <= absl::ZeroDuration() ? MuteTimeoutMs() : 0;
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0 && errno != EINTR) return;  // EBADF and the like: nothing to recover
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == 0) return;  // stop
      if (ServiceOne(id) > 0 && options_.spin > absl::ZeroDuration()) {
        if (!hot.contains(id)) SetPollingOf(id, true);
        hot[id] = absl::Now();
      }
    }
    // Muted ranks whose time is up: back into the poll set, and drained once
    // (entries may have arrived while they were out).
    std::vector<uint64_t> unmuted;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (auto& [id, slot] : slots_) {
        if (slot.muted_until == absl::InfinitePast() || slot.muted_until > now || slot.dead) continue;
        slot.muted_until = absl::InfinitePast();
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = id;
        (void)epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, slot.fd, &ev);
        unmuted.push_back(id);
      }
    }
    for (uint64_t id : unmuted) ServiceOne(id);
    for (auto it = hot.begin(); it != hot.end();) {
      const uint64_t id = it->first;
      if (PendingOf(id)) {
        if (ServiceOne(id) > 0) it->second = absl::Now();
        ++it;
        continue;
      }
      if (absl::Now() - it->second < options_.spin) {
        ++it;
        continue;
      }
      // Cool it: stop telling its trainer we poll, then look once more. A
      // trainer that saw the flag set (and did not ring) published before
      // the flag was cleared, so its entry is seen here; later ones ring.
      SetPollingOf(id, false);
      if (PendingOf(id) && ServiceOne(id) > 0) {
        SetPollingOf(id, true);
        it->second = absl::Now();
        ++it;
        continue;
      }
      hot.erase(it++);
    }
  }
}

}  // namespace strata
