// ClientDoorbell::WaitGradRoom against a page this test plays the daemon on
// (core/doorbell_layout.h): when a trainer may write one more gradient slot.
#include "client/doorbell_client.h"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

class DaemonSide {
 public:
  DaemonSide() {
    fd_ = memfd_create("doorbell-client-test", MFD_CLOEXEC);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, doorbell::kBytes), 0);
    void* base = mmap(nullptr, doorbell::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(base, MAP_FAILED);
    page_ = static_cast<doorbell::Shared*>(base);
    page_->magic = doorbell::kMagic;
    page_->version = doorbell::kVersion;
    page_->capacity = doorbell::kCapacity;
    page_->open_step_plus1.store(1);  // step 0 takes gradients
  }
  ~DaemonSide() {
    munmap(page_, doorbell::kBytes);
    close(fd_);
  }
  std::unique_ptr<ClientDoorbell> Map() {
    auto bell = ClientDoorbell::Map(UniqueFd(dup(fd_)), UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
                                    doorbell::kBytes);
    EXPECT_TRUE(bell.ok()) << bell.status();
    return bell.ok() ? std::move(*bell) : nullptr;
  }
  // As Doorbell::PublishGradWindow: the figures, then the epoch and a wake.
  void Publish(uint64_t room, uint64_t keep, uint64_t held) {
    page_->grad_room_bytes.store(room);
    page_->grad_keep_bytes.store(keep);
    page_->grad_held_bytes.store(held);
    page_->epoch.fetch_add(1);
    doorbell::FutexWakeAll(&page_->epoch);
  }
  // Takes every published signal, publishing what it then holds first (the
  // daemon's order: held, then the head).
  void TakeAll(uint64_t room, uint64_t keep, uint64_t held_after) {
    Publish(room, keep, held_after);
    page_->head.store(page_->tail.load());
    page_->epoch.fetch_add(1);
    doorbell::FutexWakeAll(&page_->epoch);
  }
  doorbell::Shared* page() { return page_; }

 private:
  int fd_ = -1;
  doorbell::Shared* page_ = nullptr;
};

constexpr uint64_t kSlot = 1000;
constexpr absl::Duration kShort = absl::Milliseconds(50);

TEST(ClientDoorbellGradRoomTest, NoLimitNeverWaits) {
  DaemonSide daemon;
  auto bell = daemon.Map();
  ASSERT_NE(bell, nullptr);
  daemon.Publish(/*room=*/0, 0, /*held=*/1 << 30);
  EXPECT_TRUE(bell->WaitGradRoom(kSlot, 1 << 30, kShort).ok());
}

TEST(ClientDoorbellGradRoomTest, WaitsWhileTheDaemonHoldsTheRoomAndGoesOnWhenItSpills) {
  DaemonSide daemon;
  auto bell = daemon.Map();
  ASSERT_NE(bell, nullptr);
  daemon.Publish(/*room=*/3 * kSlot, /*keep=*/2 * kSlot, /*held=*/3 * kSlot);
  absl::Status full = bell->WaitGradRoom(kSlot, 0, kShort);
  EXPECT_EQ(full.code(), absl::StatusCode::kDeadlineExceeded) << full;
  EXPECT_NE(full.message().find("held 3000 bytes"), std::string::npos) << full;
  EXPECT_NE(full.message().find("room 3000"), std::string::npos) << full;
  // A spill brings the hold down while the trainer waits: it goes on.
  absl::Notification waiting;
  std::thread spill([&] {
    waiting.WaitForNotification();
    absl::SleepFor(absl::Milliseconds(20));
    daemon.Publish(3 * kSlot, 2 * kSlot, 2 * kSlot);
  });
  waiting.Notify();
  const absl::Time start = absl::Now();
  EXPECT_TRUE(bell->WaitGradRoom(kSlot, 0, absl::Seconds(10)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  spill.join();
}

TEST(ClientDoorbellGradRoomTest, SignalsNotYetTakenAndSlotsNotYetSignaledCount) {
  DaemonSide daemon;
  auto bell = daemon.Map();
  ASSERT_NE(bell, nullptr);
  daemon.Publish(/*room=*/3 * kSlot, /*keep=*/kSlot, /*held=*/0);
  // Two signals the daemon has not taken: 2 slots of 3; a third fits.
  ASSERT_TRUE(bell->Signal(0, 0, kSlot, kShort).ok());
  ASSERT_TRUE(bell->Signal(1, 0, kSlot, kShort).ok());
  EXPECT_TRUE(bell->WaitGradRoom(kSlot, 0, kShort).ok());
  // ... but not beside a slot written and not signaled.
  EXPECT_EQ(bell->WaitGradRoom(kSlot, kSlot, kShort).code(), absl::StatusCode::kDeadlineExceeded);
  // Taken and counted as held now: the same 2 slots, still no room for 2 more.
  daemon.TakeAll(3 * kSlot, kSlot, 2 * kSlot);
  EXPECT_EQ(bell->WaitGradRoom(kSlot, kSlot, kShort).code(), absl::StatusCode::kDeadlineExceeded);
  // One spilled: room again.
  daemon.Publish(3 * kSlot, kSlot, kSlot);
  EXPECT_TRUE(bell->WaitGradRoom(kSlot, kSlot, kShort).ok());
}

TEST(ClientDoorbellGradRoomTest, ADaemonDownToItsKeepLetsTheWriteThrough) {
  // Gradient accumulation keeps slots written and unsignaled beyond the room:
  // the daemon can free nothing more, so waiting would never end.
  DaemonSide daemon;
  auto bell = daemon.Map();
  ASSERT_NE(bell, nullptr);
  daemon.Publish(/*room=*/3 * kSlot, /*keep=*/2 * kSlot, /*held=*/2 * kSlot);
  EXPECT_TRUE(bell->WaitGradRoom(kSlot, 5 * kSlot, kShort).ok());
  // Above its keep, it will spill: then the trainer waits.
  daemon.Publish(3 * kSlot, 2 * kSlot, 2 * kSlot + 1);
  EXPECT_EQ(bell->WaitGradRoom(kSlot, 5 * kSlot, kShort).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ClientDoorbellGradRoomTest, AClosedOrFailedJobDoesNotHoldTheTrainer) {
  DaemonSide daemon;
  auto bell = daemon.Map();
  ASSERT_NE(bell, nullptr);
  daemon.Publish(3 * kSlot, 2 * kSlot, 3 * kSlot);
  daemon.page()->flags.store(doorbell::kFlagFailed);
  // The write goes ahead; its GradReady then asks gRPC, which says why.
  EXPECT_TRUE(bell->WaitGradRoom(kSlot, 0, absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace strata
