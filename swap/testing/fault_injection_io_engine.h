// FaultInjectionIoEngine: an IoEngine decorator that injects request-level
// faults in front of a real engine, for testing what callers (ExtentStore,
// tiers) do when I/O fails.
//
//   kEio / kEnospc  the request completes with that error and never reaches
//                   the file;
//   kTornWrite      only the first `torn_bytes` of a write are written, then
//                   the request completes with EIO -- the bytes a crash in the
//                   middle of a write leaves behind; with `torn_silent` it
//                   completes OK (a lost tail only a checksum on read finds);
//   kDelay          Submit waits `delay` on the Clock before forwarding (a
//                   FakeClock makes this instant and observable);
//   crash()         after SimulateCrash(), every write is dropped (it
//                   completes with Unavailable and touches nothing), as if the
//                   process had died before issuing it.
// Short transfers and EAGAIN belong beneath an engine's retry logic: use
// FaultInjector as IoEngineOptions::result_hook for those (with the same
// InFlightTags as the decorator to scope them to one IoRequest::tag).
// Rules with only_tag fire only on requests carrying that tag.
//
// Thread-compatible, like the engine it wraps. The inner engine is borrowed
// and must outlive the decorator.
#ifndef STRATA_SWAP_TESTING_FAULT_INJECTION_IO_ENGINE_H_
#define STRATA_SWAP_TESTING_FAULT_INJECTION_IO_ENGINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/clock.h"
#include "swap/io_engine.h"
#include "swap/testing/fault_policy.h"
#include "swap/testing/in_flight_tags.h"

namespace strata {

class FaultInjectionIoEngine final : public IoEngine {
 public:
  // `clock` may be null (delays then use a RealClock); borrowed otherwise.
  FaultInjectionIoEngine(IoEngine* inner, FaultPolicy policy, Clock* clock = nullptr);
  // As above, counting events on `shared` (borrowed), so that decorators of
  // several engines (a store's I/O lanes) see one sequence of events.
  FaultInjectionIoEngine(IoEngine* inner, FaultSchedule* shared, Clock* clock = nullptr);

  const IoEngineInfo& info() const override { return inner_->info(); }
  absl::StatusOr<IoFileId> RegisterFile(int fd, absl::string_view path) override;
  absl::Status UnregisterFile(IoFileId file) override { return inner_->UnregisterFile(file); }
  absl::Status RegisterBuffers(absl::Span<const BufferRegion> regions) override {
    return inner_->RegisterBuffers(regions);
  }
  absl::StatusOr<uint32_t> RequiredAlignment(IoFileId file) const override {
    return inner_->RequiredAlignment(file);
  }
  absl::StatusOr<size_t> Submit(absl::Span<const IoRequest> requests) override;
  absl::Status Reap(size_t min_completions, absl::Duration timeout,
                    std::vector<IoCompletion>* out) override;
  size_t outstanding() const override { return inner_->outstanding() + synthesized_.size(); }
  void Shutdown() override { inner_->Shutdown(); }

  // From now on writes are dropped (see above). Reads still work, so a test
  // can look at what a crash left behind through the same engine.
  void SimulateCrash() { crashed_ = true; }

  const FaultSchedule& schedule() const { return *schedule_; }

  // Records each forwarded request's byte range and tag in `tags` until its
  // completion is reaped (borrowed, may be shared by several decorators).
  // Set before the first Submit.
  void set_in_flight_tags(InFlightTags* tags) { tags_ = tags; }

 private:
  struct Forwarded {
    uint64_t user_data = 0;
    bool torn = false;
    bool torn_silent = false;
    IoRequest original;
    uint64_t forwarded_length = 0;
  };

  IoEngine* inner_;
  std::unique_ptr<FaultSchedule> owned_schedule_;
  FaultSchedule* schedule_;
  std::unique_ptr<Clock> owned_clock_;
  Clock* clock_;
  InFlightTags* tags_ = nullptr;
  bool crashed_ = false;
  absl::flat_hash_map<uint32_t, std::string> paths_;
  uint64_t next_tag_ = 1;
  absl::flat_hash_map<uint64_t, Forwarded> forwarded_;  // by inner user_data
  std::deque<IoCompletion> synthesized_;
  std::vector<IoCompletion> scratch_;
};

}  // namespace strata

#endif  // STRATA_SWAP_TESTING_FAULT_INJECTION_IO_ENGINE_H_
