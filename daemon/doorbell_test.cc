// The doorbell's daemon side against a trainer simulated on the raw page
// (core/doorbell_layout.h), including trainers that write wild values, die
// between writing an entry and publishing it, or ring without end.
#include "daemon/doorbell.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using doorbell::kCapacity;

// What a doorbell's handlers saw.
struct Recorder {
  absl::Mutex mu;
  std::vector<std::pair<uint32_t, uint64_t>> signals;
  std::vector<absl::Status> failures;
  // Signals for this step are refused (a stale step).
  uint64_t refuse_step = UINT64_MAX;

  DoorbellHandlers Handlers() {
    DoorbellHandlers h;
    h.signal = [this](uint32_t index, uint64_t step) -> absl::Status {
      absl::MutexLock lock(&mu);
      signals.emplace_back(index, step);
      if (step == refuse_step) return absl::FailedPreconditionError("step 9 was already applied");
      return absl::OkStatus();
    };
    h.fail = [this](const absl::Status& s) {
      absl::MutexLock lock(&mu);
      failures.push_back(s);
    };
    return h;
  }
  size_t count() {
    absl::MutexLock lock(&mu);
    return signals.size();
  }
  size_t failed() {
    absl::MutexLock lock(&mu);
    return failures.size();
  }
};

// A trainer's view: its own mapping of the page and the eventfd.
class FakeTrainer {
 public:
  explicit FakeTrainer(const Doorbell& bell) : eventfd_(bell.eventfd()) {
    void* p = mmap(nullptr, bell.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, bell.memfd(), 0);
    EXPECT_NE(p, MAP_FAILED);
    page_ = static_cast<doorbell::Shared*>(p);
    tail_ = page_->tail.load();
  }
  ~FakeTrainer() { munmap(page_, doorbell::kBytes); }
  doorbell::Shared* page() { return page_; }

  void Write(uint64_t index, uint64_t step) {
    page_->entries[tail_ % kCapacity].index.store(index);
    page_->entries[tail_ % kCapacity].step.store(step);
    ++tail_;
  }
  void Publish() { page_->tail.store(tail_, std::memory_order_release); }
  void Ring() {
    const uint64_t one = 1;
    (void)!write(eventfd_, &one, sizeof(one));
  }
  void Send(uint64_t index, uint64_t step) {
    Write(index, step);
    Publish();
    Ring();
  }
  // As the client library does: no ring while the daemon says it polls.
  void SendLikeTheClient(uint64_t index, uint64_t step) {
    Write(index, step);
    page_->tail.store(tail_, std::memory_order_seq_cst);
    if (page_->daemon_polling.load(std::memory_order_seq_cst) == 0) Ring();
  }
  // Waits until the daemon's head reaches `n` (true) or 10 s pass.
  bool WaitHead(uint64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (page_->head.load() < n) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Microseconds(50));
    }
    return true;
  }

 private:
  int eventfd_;
  doorbell::Shared* page_ = nullptr;
  uint64_t tail_ = 0;
};

bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(100));
  }
  return true;
}

std::unique_ptr<DoorbellHub> MakeHub(DoorbellHub::Options options = {}) {
  auto hub = DoorbellHub::Create(options);
  EXPECT_TRUE(hub.ok()) << hub.status();
  return std::move(*hub);
}

std::unique_ptr<Doorbell> MakeBell(DoorbellHub* hub, Recorder& rec, uint32_t shards = 4) {
  auto bell = Doorbell::Create(hub, "test-bell", shards, rec.Handlers());
  EXPECT_TRUE(bell.ok()) << bell.status();
  return std::move(*bell);
}

TEST(DoorbellTest, PageIsSealedAndDescribesItself) {
  auto hub = MakeHub();
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  EXPECT_NE(ftruncate(bell->memfd(), 0), 0) << "a trainer must not be able to shrink the page";
  FakeTrainer t(*bell);
  EXPECT_EQ(t.page()->magic, doorbell::kMagic);
  EXPECT_EQ(t.page()->version, doorbell::kVersion);
  EXPECT_EQ(t.page()->capacity, kCapacity);
}

TEST(DoorbellTest, SignalsArriveInOrderAndHeadAdvances) {
  auto hub = MakeHub();
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  FakeTrainer t(*bell);
  t.Write(0, 5);
  t.Write(3, 5);
  t.Write(1, 5);
  t.Publish();
  t.Ring();
  ASSERT_TRUE(t.WaitHead(3));
  absl::MutexLock lock(&rec.mu);
  const std::vector<std::pair<uint32_t, uint64_t>> want = {{0, 5}, {3, 5}, {1, 5}};
  EXPECT_EQ(rec.signals, want);
  EXPECT_TRUE(rec.failures.empty());
}

TEST(DoorbellTest, RefusalIsReportedInThePageAndIsNotFatal) {
  auto hub = MakeHub();
  Recorder rec;
  rec.refuse_step = 9;
  auto bell = MakeBell(hub.get(), rec);
  FakeTrainer t(*bell);
  t.Send(0, 9);
  t.Send(1, 10);
  ASSERT_TRUE(t.WaitHead(2));
  EXPECT_EQ(t.page()->error_seq.load(), 2u);
  EXPECT_EQ(t.page()->error_code.load(), static_cast<uint64_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(doorbell::ReadText(t.page()->error_text), "step 9 was already applied");
  EXPECT_EQ(rec.count(), 2u);
  EXPECT_EQ(rec.failed(), 0u);
}

TEST(DoorbellTest, WildShardIndexFailsTheJobAndNothingAfterIt) {
  auto hub = MakeHub();
  Recorder rec, other_rec;
  auto bell = MakeBell(hub.get(), rec);
  auto other = MakeBell(hub.get(), other_rec);
  FakeTrainer t(*bell), o(*other);
  t.Write(0, 1);
  t.Write(uint64_t{1} << 40, 1);  // would be 0 if truncated to 32 bits
  t.Write(1, 1);
  t.Publish();
  t.Ring();
  ASSERT_TRUE(WaitUntil([&] { return rec.failed() == 1; }));
  {
    absl::MutexLock lock(&rec.mu);
    EXPECT_EQ(rec.signals.size(), 1u);
    EXPECT_NE(rec.failures[0].message().find("shard index 1099511627776"), std::string::npos) << rec.failures[0];
    EXPECT_NE(rec.failures[0].message().find("4 shards"), std::string::npos) << rec.failures[0];
  }
  // The failed rank is no longer served; another rank is.
  t.Send(2, 1);
  o.Send(2, 1);
  ASSERT_TRUE(o.WaitHead(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(rec.count(), 1u);
  EXPECT_EQ(rec.failed(), 1u);
  EXPECT_EQ(other_rec.count(), 1u);
}

TEST(DoorbellTest, TailBeyondOneRingFailsTheJob) {
  auto hub = MakeHub();
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  FakeTrainer t(*bell);
  t.page()->tail.store(kCapacity + 1);
  t.Ring();
  ASSERT_TRUE(WaitUntil([&] { return rec.failed() == 1; }));
  EXPECT_EQ(rec.count(), 0u);
  absl::MutexLock lock(&rec.mu);
  EXPECT_NE(rec.failures[0].message().find("ring position 1025"), std::string::npos) << rec.failures[0];
}

TEST(DoorbellTest, TailBehindTheHeadFailsTheJob) {
  auto hub = MakeHub();
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  FakeTrainer t(*bell);
  t.Send(0, 0);
  ASSERT_TRUE(t.WaitHead(1));
  t.page()->tail.store(0);  // rewound: 0 - 1 wraps far beyond one ring
  t.Ring();
  ASSERT_TRUE(WaitUntil([&] { return rec.failed() == 1; }));
  EXPECT_EQ(rec.count(), 1u);
}

TEST(DoorbellTest, TrainerDyingMidRingLosesOnlyWhatItDidNotPublish) {
  auto hub = MakeHub();
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  {
    // Died after writing an entry, before publishing the tail: the ring
    // it sent is spurious and the entry is not taken.
    FakeTrainer t(*bell);
    t.Send(0, 0);
    ASSERT_TRUE(t.WaitHead(1));
    t.Write(1, 0);
    t.Ring();
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_EQ(rec.count(), 1u);
  }
  {
    // The next session starts from the published tail; a trainer that
    // published and died before ringing has its entry taken at the next ring.
    FakeTrainer t(*bell);
    t.Write(2, 0);
    t.Publish();
    EXPECT_EQ(rec.count(), 1u);
  }
  FakeTrainer t(*bell);
  t.Send(3, 0);
  ASSERT_TRUE(t.WaitHead(3));
  absl::MutexLock lock(&rec.mu);
  const std::vector<std::pair<uint32_t, uint64_t>> want = {{0, 0}, {2, 0}, {3, 0}};
  EXPECT_EQ(rec.signals, want);
  EXPECT_TRUE(rec.failures.empty());
}

TEST(DoorbellTest, RingStormIsMutedAndOthersAreStillServed) {
  DoorbellHub::Options options;
  options.empty_wakeups_before_mute = 16;
  options.mute = absl::Milliseconds(50);
  auto hub = MakeHub(options);
  Recorder rec, other_rec;
  auto bell = MakeBell(hub.get(), rec);
  auto other = MakeBell(hub.get(), other_rec);
  FakeTrainer o(*other);
  std::atomic<bool> stop{false};
  std::thread storm([&] {
    const uint64_t one = 1;
    while (!stop.load()) (void)!write(bell->eventfd(), &one, sizeof(one));
  });
  const bool muted = WaitUntil([&] { return hub->stats().mutes > 0; });
  // Meanwhile another rank's signals go through.
  for (uint64_t i = 0; i < 50; ++i) {
    o.Send(i % 4, 0);
    ASSERT_TRUE(o.WaitHead(i + 1));
  }
  stop = true;
  storm.join();
  EXPECT_TRUE(muted);
  EXPECT_EQ(other_rec.count(), 50u);
  EXPECT_EQ(rec.count(), 0u);
  EXPECT_EQ(rec.failed(), 0u);  // ringing is not an error, only muted
  // After the mute the rank is served again.
  FakeTrainer t(*bell);
  t.Send(1, 0);
  ASSERT_TRUE(t.WaitHead(1));
  EXPECT_EQ(rec.count(), 1u);
}

TEST(DoorbellTest, ManyResendsNeedNoMoreThanOneRing) {
  auto hub = MakeHub();
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  FakeTrainer t(*bell);
  constexpr uint64_t kSignals = 200000;
  uint64_t sent = 0;
  while (sent < kSignals) {
    // Fill whatever room the ring has, as a trainer would.
    const uint64_t head = t.page()->head.load(std::memory_order_acquire);
    const uint64_t room = kCapacity - (sent - head);
    for (uint64_t i = 0; i < room && sent < kSignals; ++i, ++sent) t.Write(0, 0);
    t.Publish();
    t.Ring();
    if (room == 0) absl::SleepFor(absl::Microseconds(20));
  }
  ASSERT_TRUE(t.WaitHead(kSignals));
  EXPECT_EQ(rec.count(), kSignals);
  EXPECT_EQ(rec.failed(), 0u);
  EXPECT_EQ(hub->stats().entries, kSignals);
}

TEST(DoorbellTest, ATrainerSkippingRingsWhileThePollerSpinsLosesNoEntry) {
  DoorbellHub::Options options;
  options.spin = absl::Microseconds(30);
  auto hub = MakeHub(options);
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  FakeTrainer t(*bell);
  std::mt19937 rng(7);
  constexpr uint64_t kSignals = 3000;
  uint64_t skipped_rings = 0;
  for (uint64_t i = 0; i < kSignals; ++i) {
    // Pauses around the poller's 30 us spin, so entries land before, during
    // and just after it.
    const int pause_us = rng() % 2 == 0 ? 0 : static_cast<int>(rng() % 80);
    if (pause_us > 0) absl::SleepFor(absl::Microseconds(pause_us));
    skipped_rings += t.page()->daemon_polling.load() != 0;
    t.SendLikeTheClient(i % 4, 0);
    if (i % 500 == 499) {
      ASSERT_TRUE(t.WaitHead(i + 1)) << "entry " << i << " was never taken";
    }
  }
  ASSERT_TRUE(t.WaitHead(kSignals));
  EXPECT_EQ(rec.count(), kSignals);
  std::printf("rings skipped because the poller was spinning: %llu of %llu\n",
              static_cast<unsigned long long>(skipped_rings), static_cast<unsigned long long>(kSignals));
}

TEST(DoorbellTest, DestructionWaitsForADrainInProgressAndClosesThePage) {
  auto hub = MakeHub();
  absl::Notification entered, release;
  DoorbellHandlers h;
  std::atomic<bool> returned{false};
  h.signal = [&](uint32_t, uint64_t) {
    entered.Notify();
    release.WaitForNotification();
    returned = true;
    return absl::OkStatus();
  };
  h.fail = [](const absl::Status&) {};
  auto created = Doorbell::Create(hub.get(), "test-bell", 4, h);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<Doorbell> bell = std::move(*created);
  auto t = std::make_unique<FakeTrainer>(*bell);
  t->Send(0, 0);
  entered.WaitForNotification();
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    bell.reset();
    destroyed = true;
  });
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(destroyed.load()) << "the doorbell went away while its handler ran";
  release.Notify();
  destroyer.join();
  EXPECT_TRUE(returned.load());
  // The trainer's mapping outlives the daemon's: it reads "closed".
  EXPECT_NE(t->page()->flags.load() & doorbell::kFlagClosed, 0u);
}

TEST(DoorbellTest, PublishedStateWakesAWaitingTrainer) {
  auto hub = MakeHub();
  Recorder rec;
  auto bell = MakeBell(hub.get(), rec);
  FakeTrainer t(*bell);
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    doorbell::Shared* p = t.page();
    p->client_waiters.fetch_add(1);
    while (p->done_steps.load() < 3) {
      const uint32_t e = p->epoch.load();
      if (p->done_steps.load() >= 3) break;
      doorbell::FutexWait(&p->epoch, e, 5'000'000'000);
    }
    p->client_waiters.fetch_sub(1);
    woke = true;
  });
  absl::SleepFor(absl::Milliseconds(20));
  bell->PublishOutcome(DoorbellOutcome{2, true, 512.0, 3.5, 7});
  bell->PublishState(/*open_step_plus1=*/4, /*done_steps=*/3, 0);
  waiter.join();
  EXPECT_TRUE(woke.load());
  const doorbell::Outcome& o = t.page()->outcomes[2 % doorbell::kOutcomes];
  EXPECT_EQ(o.tag.load(), 3u);
  EXPECT_EQ(o.skipped.load(), 1u);
  EXPECT_EQ(std::bit_cast<double>(o.loss_scale_bits.load()), 512.0);
  EXPECT_EQ(std::bit_cast<double>(o.grad_norm_bits.load()), 3.5);
  EXPECT_EQ(o.optimizer_steps.load(), 7u);
  EXPECT_EQ(t.page()->open_step_plus1.load(), 4u);
}

}  // namespace
}  // namespace strata
