#include "client/doorbell_client.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace strata {
namespace {

// How long a waiter spins before it sleeps on the futex: about one wake-up's
// worth, so an answer that is on its way is caught without a context switch.
constexpr absl::Duration kSpin = absl::Microseconds(50);
// Sleeps are sliced so a missed wake-up costs at most this much.
constexpr int64_t kSliceNs = 100 * 1000 * 1000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientDoorbell>> ClientDoorbell::Map(UniqueFd memfd, UniqueFd eventfd,
                                                                    uint64_t bytes) {
  if (bytes != doorbell::kBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon's doorbell page is ", bytes, " bytes; this client speaks ", doorbell::kBytes));
  }
  struct stat st;
  if (fstat(memfd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InternalError("the daemon's doorbell page is smaller than it says");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd.get(), 0);
  if (base == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap of the doorbell failed: errno ", errno));
  std::unique_ptr<ClientDoorbell> bell(new ClientDoorbell());
  bell->shared_ = static_cast<doorbell::Shared*>(base);
  bell->memfd_ = std::move(memfd);
  bell->eventfd_ = std::move(eventfd);
  if (bell->shared_->magic != doorbell::kMagic || bell->shared_->version != doorbell::kVersion ||
      bell->shared_->capacity != doorbell::kCapacity) {
    return absl::FailedPreconditionError(absl::StrCat("the daemon's doorbell speaks version ",
                                                      bell->shared_->version, "; this client speaks ",
                                                      doorbell::kVersion));
  }
  // A re-attached rank continues where its last session left the ring; an
  // error reported to that session is not ours.
  bell->tail_ = bell->shared_->tail.load(std::memory_order_acquire);
  bell->error_seen_ = bell->shared_->error_seq.load(std::memory_order_acquire) & ~uint64_t{1};
  return bell;
}

ClientDoorbell::~ClientDoorbell() {
  if (shared_ != nullptr) munmap(shared_, doorbell::kBytes);
}

uint64_t ClientDoorbell::done_steps() const { return shared_->done_steps.load(std::memory_order_acquire); }

bool ClientDoorbell::CanSignal(uint32_t index, uint64_t step, size_t shards) const {
  return index < shards && shared_->flags.load(std::memory_order_acquire) == 0 &&
         shared_->open_step_plus1.load(std::memory_order_acquire) == step + 1;
}

bool ClientDoorbell::Refused() const {
  return (shared_->error_seq.load(std::memory_order_acquire) & ~uint64_t{1}) != error_seen_;
}

absl::Status ClientDoorbell::TakeRefusal() {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint64_t s1 = shared_->error_seq.load(std::memory_order_acquire);
    if ((s1 & 1) != 0) continue;  // being written
    if (s1 == error_seen_) return absl::OkStatus();
    const uint64_t code = shared_->error_code.load(std::memory_order_relaxed);
    const std::string text = doorbell::ReadText(shared_->error_text);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (shared_->error_seq.load(std::memory_order_relaxed) != s1) continue;
    error_seen_ = s1;
    const auto status_code = code > 16 ? absl::StatusCode::kUnknown : static_cast<absl::StatusCode>(code);
    return absl::Status(status_code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : status_code,
                        absl::StrCat("GradReady (doorbell): ", text));
  }
  return absl::OkStatus();  // the daemon keeps rewriting it: the next call reports it
}

template <typename Done>
ClientDoorbell::Wait ClientDoorbell::WaitFor(Done done, absl::Duration timeout) {
  auto check = [&]() -> std::optional<Wait> {
    if (done()) return Wait::kDone;
    if (Refused()) return Wait::kRefused;
    if (shared_->flags.load(std::memory_order_acquire) != 0) return Wait::kStop;
    return std::nullopt;
  };
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  const absl::Time spin_until = start + std::min(kSpin, timeout);
  while (true) {
    if (auto r = check()) return *r;
    if (absl::Now() >= spin_until) break;
    for (int i = 0; i < 32; ++i) CpuRelax();
  }
  while (true) {
    shared_->client_waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t epoch = shared_->epoch.load(std::memory_order_seq_cst);
    std::optional<Wait> r = check();
    const absl::Duration left = deadline - absl::Now();
    if (!r && left > absl::ZeroDuration()) {
      doorbell::FutexWait(&shared_->epoch, epoch, std::min<int64_t>(absl::ToInt64Nanoseconds(left), kSliceNs));
    }
    shared_->client_waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (r) return *r;
    if (auto again = check()) return *again;
    if (absl::Now() >= deadline) return Wait::kTimeout;
  }
}

absl::Status ClientDoorbell::Signal(uint32_t index, uint64_t step, uint64_t grad_bytes, absl::Duration timeout) {
  if (absl::Status s = TakeRefusal(); !s.ok()) return s;
  // The page's tail, not a private copy: entries an earlier session of this
  // rank published (and died before ringing) stay in the ring, ahead of ours.
  tail_ = shared_->tail.load(std::memory_order_relaxed);
  // A full ring: wait for the daemon to take entries.
  const Wait room = WaitFor(
      [&] { return tail_ - shared_->head.load(std::memory_order_acquire) < doorbell::kCapacity; }, timeout);
  if (room == Wait::kRefused) return TakeRefusal();
  if (room == Wait::kStop) return absl::UnavailableError("the job's doorbell closed");
  if (room == Wait::kTimeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("GradReady: the daemon took no doorbell entry for ", absl::FormatDuration(timeout)));
  }
  doorbell::Entry& e = shared_->entries[tail_ % doorbell::kCapacity];
  e.index.store(index, std::memory_order_relaxed);
  e.step.store(step, std::memory_order_relaxed);
  // What the daemon took is forgotten here too, so a trainer that never
  // waits for room keeps at most a ring of these.
  ForgetTaken();
  untaken_.emplace_back(tail_, grad_bytes);
  ++tail_;
  // The gradient bytes and the entry, then the tail; seq_cst, paired with
  // the poller's clearing of daemon_polling and its last look at the tail.
  shared_->tail.store(tail_, std::memory_order_seq_cst);
  if (shared_->daemon_polling.load(std::memory_order_seq_cst) != 0) return absl::OkStatus();  // it will see it
  const uint64_t one = 1;
  // EAGAIN: the counter is full, so the daemon has a wake-up pending anyway.
  (void)!write(eventfd_.get(), &one, sizeof(one));
  return absl::OkStatus();
}

void ClientDoorbell::ForgetTaken() {
  const uint64_t head = shared_->head.load(std::memory_order_acquire);
  while (!untaken_.empty() && static_cast<int64_t>(head - untaken_.front().first) > 0) untaken_.pop_front();
}

absl::Status ClientDoorbell::WaitGradRoom(uint64_t bytes, uint64_t unsignaled, absl::Duration timeout) {
  if (shared_->grad_room_bytes.load(std::memory_order_acquire) == 0) return absl::OkStatus();
  // What the daemon holds, plus our signals it has not taken. The head is
  // read first: the daemon counts a gradient as held before it moves the
  // head past its signal, so a signal it took is never missed (at worst
  // counted twice for a moment, which only waits longer).
  auto committed = [&]() -> uint64_t {
    ForgetTaken();
    uint64_t total = shared_->grad_held_bytes.load(std::memory_order_acquire);
    for (const auto& [position, grad_bytes] : untaken_) total += grad_bytes;
    return total;
  };
  auto room = [&] {
    const uint64_t limit = shared_->grad_room_bytes.load(std::memory_order_acquire);
    const uint64_t keep = shared_->grad_keep_bytes.load(std::memory_order_acquire);
    const uint64_t c = committed();
    // Room for the slot; or the daemon is down to what it keeps, and will
    // free nothing more before the step, which needs this slot written
    // (slots written and kept unsignaled, as gradient accumulation does,
    // then exceed the room: the trainer's choice).
    return limit == 0 || (c + unsignaled <= limit && bytes <= limit - c - unsignaled) || c <= keep;
  };
  const Wait w = WaitFor(room, timeout);
  if (w == Wait::kTimeout) {
    return absl::DeadlineExceededError(absl::StrCat(
        "WaitGradRoom: the daemon held ", shared_->grad_held_bytes.load(std::memory_order_relaxed),
        " bytes of this rank's gradients (room ", shared_->grad_room_bytes.load(std::memory_order_relaxed),
        ", ", unsignaled, " bytes written and not signaled, ", bytes, " wanted) for ", absl::FormatDuration(timeout),
        " without spilling any: is the daemon stuck on its NVMe? (strata stats)"));
  }
  // Refused (reported by the next GradReady), closed or failed (GradReady
  // then asks gRPC why): the write goes ahead, the signal fails.
  return absl::OkStatus();
}

absl::Status ClientDoorbell::Flush(absl::Duration timeout) {
  const Wait w = WaitFor(
      [&] { return static_cast<int64_t>(shared_->head.load(std::memory_order_acquire) - tail_) >= 0; }, timeout);
  if (w == Wait::kStop) return absl::UnavailableError("the job's doorbell closed");
  if (w == Wait::kTimeout) {
    return absl::DeadlineExceededError(absl::StrCat("the daemon did not take the doorbell's signals within ",
                                                    absl::FormatDuration(timeout)));
  }
  return TakeRefusal();
}

absl::StatusOr<std::optional<DoorbellStepOutcome>> ClientDoorbell::WaitStep(uint64_t step, absl::Duration timeout) {
  if (absl::Status s = TakeRefusal(); !s.ok()) return s;
  if (step > done_steps()) return std::nullopt;  // not the open step: gRPC says what it says
  const Wait w = WaitFor([&] { return done_steps() > step; }, timeout);
  if (w == Wait::kRefused) return TakeRefusal();
  if (w != Wait::kDone) return std::nullopt;
  const doorbell::Outcome& o = shared_->outcomes[step % doorbell::kOutcomes];
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint64_t tag = o.tag.load(std::memory_order_acquire);
    if (tag == 0) continue;  // being written
    if (tag != step + 1) return std::nullopt;  // overwritten by a later step: gRPC keeps more history
    DoorbellStepOutcome out;
    out.skipped = o.skipped.load(std::memory_order_relaxed) != 0;
    out.loss_scale = std::bit_cast<double>(o.loss_scale_bits.load(std::memory_order_relaxed));
    out.grad_norm = std::bit_cast<double>(o.grad_norm_bits.load(std::memory_order_relaxed));
    out.optimizer_steps = o.optimizer_steps.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (o.tag.load(std::memory_order_relaxed) == tag) return out;
  }
  return std::nullopt;
}

}  // namespace strata
