#include "daemon/scheduler_hint.h"

#include <sched.h>

#include <thread>

#include "daemon/doorbell.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Kernels before EEVDF's slice requests (6.12) accept sched_runtime for
// SCHED_OTHER and report 0 back; there the hint is a no-op.
bool KernelKeepsSlices() {
  bool kept = false;
  std::thread([&] {
    if (RequestShortSlice(250'000).ok()) kept = CurrentSliceNs() == 250'000;
  }).join();
  return kept;
}

TEST(SchedulerHintTest, TheSliceIsSetOnTheCallingThreadOnly) {
  if (!KernelKeepsSlices()) GTEST_SKIP() << "this kernel does not keep per-task slices (EEVDF, Linux 6.12+)";
  const uint64_t before = CurrentSliceNs();
  uint64_t inside = 0;
  std::thread([&] {
    ASSERT_TRUE(RequestShortSlice(100'000).ok());
    inside = CurrentSliceNs();
  }).join();
  EXPECT_EQ(inside, 100'000u);
  EXPECT_EQ(CurrentSliceNs(), before);  // this thread's is untouched
}

TEST(SchedulerHintTest, AnOutOfRangeSliceIsRefusedOrClampedNeverFatal) {
  std::thread([] {
    const absl::Status s = RequestShortSlice(1);  // below the kernel's 100 us floor
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("slice"), absl::string_view::npos) << s;
    }
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);  // never a real-time class
  }).join();
}

TEST(SchedulerHintTest, TheDoorbellHubThreadRunsWithItsConfiguredSlice) {
  if (!KernelKeepsSlices()) GTEST_SKIP() << "this kernel does not keep per-task slices (EEVDF, Linux 6.12+)";
  for (const absl::Duration slice : {absl::Microseconds(100), absl::Microseconds(300)}) {
    DoorbellHub::Options options;
    options.slice = slice;
    auto hub = DoorbellHub::Create(options);
    ASSERT_TRUE(hub.ok()) << hub.status();
    uint64_t seen = 0;
    for (int i = 0; i < 2000 && seen == 0; ++i) {  // the thread records it when it starts
      seen = (*hub)->stats().slice_ns;
      if (seen == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(seen, static_cast<uint64_t>(absl::ToInt64Nanoseconds(slice)));
  }
}

}  // namespace
}  // namespace strata
