// The daemon side of the doorbell (core/doorbell_layout.h): per-bucket
// gradient-ready signals arrive through a ring in shared memory instead of a
// gRPC call, and finished steps are published back through the same page.
//
// Doorbell: one per rank -- a sealed memfd holding the ring, and an eventfd
// the trainer writes to wake the daemon. The job creates it when the rank maps
// its shared memory and publishes its step state into it.
//
// DoorbellHub: one per daemon -- a single poller thread (epoll over every
// rank's eventfd) that drains the rings and hands each signal to the rank's
// handlers (Job::GradReady). No thread per job: the pool of job workers stays
// what it is; the hub only does bookkeeping and queues work.
//
// Hostile trainers: the page is writable by the trainer. The daemon keeps its
// own head and reads every entry once; a tail more than a ring ahead or a
// shard index out of range fails that rank's job through `fail` (with a
// message naming the value), nothing else. Signals the job refuses for a
// reason a well-behaved trainer can hit (a stale step) are reported back in
// the page's error slot. A rank that never rings costs nothing; one that rings
// without publishing entries (a storm of empty wake-ups) is taken out of the
// poll set for a while, so it costs the hub a bounded share of one thread;
// each rank's drain is capped at one ring per wake-up so others are served in
// between.
#ifndef STRATA_DAEMON_DOORBELL_H_
#define STRATA_DAEMON_DOORBELL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/doorbell_layout.h"

namespace strata {

class DoorbellHub;

struct DoorbellHandlers {
  // One gradient-ready signal (the job's GradReady for this rank). OK, or a
  // status reported back to the trainer; OutOfRange fails the job.
  std::function<absl::Status(uint32_t index, uint64_t step)> signal;
  // The trainer broke the protocol (a wild value in the ring): fail the job.
  std::function<void(const absl::Status&)> fail;
};

struct DoorbellOutcome {
  uint64_t step = 0;
  bool skipped = false;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
  uint64_t optimizer_steps = 0;
};

class Doorbell {
 public:
  // `shards`: the rank's shard count (valid indices are below it). `name`
  // names the memfd (visible in /proc/PID/fd) and the errors.
  static absl::StatusOr<std::unique_ptr<Doorbell>> Create(DoorbellHub* hub, const std::string& name,
                                                          uint32_t shards, DoorbellHandlers handlers);
  // Leaves the hub (after this no handler runs: a drain in progress is waited
  // for, so the caller must not hold a lock the handlers take), marks the page
  // closed and wakes the trainer's waiters.
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  int memfd() const { return memfd_; }
  int eventfd() const { return eventfd_; }
  uint64_t bytes() const { return doorbell::kBytes; }

  // The job's side; callers serialize these (the job calls them under its lock).
  // open_step_plus1: the step gradients are accepted for + 1, or 0.
  void PublishState(uint64_t open_step_plus1, uint64_t done_steps, uint32_t flags);
  void PublishOutcome(const DoorbellOutcome& outcome);
  // The rank's gradient window (doorbell::Shared::grad_room_bytes): wakes
  // the trainer's waiters when it changed.
  void PublishGradWindow(uint64_t room, uint64_t keep, uint64_t held);

  // The hub's side (one thread). Drains the eventfd and up to one ring of
  // entries. Returns how many entries were taken; -1 when the rank's job was
  // failed (the hub stops polling it).
  int Service();
  // Entries published and not yet taken (the hub's short spin).
  bool HasPending() const;
  // Tells the trainer whether the hub is spinning on this ring (it may then
  // skip the eventfd). After clearing it the hub checks HasPending once more.
  void SetPolling(bool polling);

 private:
  Doorbell(std::string name, uint32_t shards, DoorbellHandlers handlers);
  void Wake();
  void ReportRefusal(const absl::Status& status);

  const std::string name_;
  const uint32_t shards_;
  const DoorbellHandlers handlers_;
  DoorbellHub* hub_ = nullptr;
  uint64_t hub_id_ = 0;
  int memfd_ = -1;
  int eventfd_ = -1;
  doorbell::Shared* shared_ = nullptr;
  // Hub thread only.
  uint64_t head_ = 0;
  uint64_t error_seq_ = 0;
  bool failed_ = false;
};

class DoorbellHub {
 public:
  struct Options {
    // After this many wake-ups in a row that found no entry, a rank's eventfd
    // is left out of the poll set for `mute`. A trainer that rings once per
    // entry never gets there (at most every other wake-up is empty).
    int empty_wakeups_before_mute = 64;
    absl::Duration mute = absl::Milliseconds(10);
    // A ring that had entries is polled (no wake-up needed) until this long
    // after its last entry; the hub sleeps in epoll when no ring is that
    // fresh. 0 (the default): no polling, every signal rings. Polling pays
    // only with a core to spare: on the 2-core test machine at load 15 a
    // 30 us poll made grad_ready's p50 93 us (the spinning hub used up its
    // scheduler share and waited for the CPU) against 13-25 us without.
    absl::Duration spin = absl::ZeroDuration();
  };
  static absl::StatusOr<std::unique_ptr<DoorbellHub>> Create(Options options);
  static absl::StatusOr<std::unique_ptr<DoorbellHub>> Create() { return Create(Options()); }
  ~DoorbellHub();  // stops the thread; every doorbell must be gone

  struct Stats {
    uint64_t entries = 0;      // signals taken
    uint64_t wakeups = 0;      // services run
    uint64_t empty_wakeups = 0;
    uint64_t mutes = 0;        // times a rank was muted for empty wake-ups
  };
  Stats stats() const;

 private:
  friend class Doorbell;
  explicit DoorbellHub(Options options) : options_(options) {}
  absl::StatusOr<uint64_t> Add(Doorbell* bell);
  // After it returns, the doorbell's Service is not running and never will.
  void Remove(uint64_t id);
  void Loop();
  // Runs bell `id`'s Service unless it was removed, is muted or dead;
  // updates the mute state. Returns the entries taken (-1: the job failed).
  int ServiceOne(uint64_t id);
  bool PendingOf(uint64_t id);
  void SetPollingOf(uint64_t id, bool polling);
  // epoll_wait's timeout: until the earliest mute ends, or -1.
  int MuteTimeoutMs();

  struct Slot {
    Doorbell* bell = nullptr;
    int fd = -1;
    int empty_in_a_row = 0;
    bool dead = false;                    // its job failed: no longer polled
    absl::Time muted_until = absl::InfinitePast();
  };
  const Options options_;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t servicing_ ABSL_GUARDED_BY(mu_) = 0;  // the id whose Service runs now
  absl::CondVar serviced_;                        // servicing_ went back to 0
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_DAEMON_DOORBELL_H_
