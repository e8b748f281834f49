// FaultInjectionTier: a Tier decorator for tests. It forwards to a real tier
// and can fail the n-th Read or Write, and hold Reads at a gate so a test can
// observe a promotion while it is in flight (an explicit hook instead of a
// sleep). Counts the calls it forwards.
//
// Thread-safe.
#ifndef STRATA_TIERS_TESTING_FAULT_INJECTION_TIER_H_
#define STRATA_TIERS_TESTING_FAULT_INJECTION_TIER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tiers/tier.h"

namespace strata {

class FaultInjectionTier final : public Tier {
 public:
  // `base` is borrowed and must outlive this tier.
  explicit FaultInjectionTier(Tier* base) : base_(base) {}

  // The n-th (1-based, counted from now on) Read / Write fails with
  // DataLoss; 0 disables.
  void FailNthRead(uint64_t n);
  void FailNthWrite(uint64_t n);
  // While closed, Reads block (after counting themselves as started).
  void CloseReadGate();
  void OpenReadGate();
  // Blocks until at least `n` Reads have started since creation.
  void AwaitReadsStarted(uint64_t n);

  uint64_t reads() const;
  uint64_t writes() const;

  TierKind kind() const override { return base_->kind(); }
  absl::string_view name() const override { return base_->name(); }
  uint64_t capacity_bytes() const override { return base_->capacity_bytes(); }
  uint64_t used_bytes() const override { return base_->used_bytes(); }
  uint64_t FootprintBytes(uint64_t size_bytes) const override {
    return base_->FootprintBytes(size_bytes);
  }
  absl::StatusOr<TierSlot> Allocate(const ShardKey& key, uint64_t size_bytes) override {
    return base_->Allocate(key, size_bytes);
  }
  void Free(const TierSlot& slot) override { base_->Free(slot); }
  absl::Status Write(const TierSlot& slot, absl::Span<const std::byte> src) override;
  absl::Status Read(const TierSlot& slot, absl::Span<std::byte> dst) override;
  // Hidden on purpose: every copy then goes through Read/Write, where the
  // faults and the gate are.
  absl::Span<std::byte> HostView(const TierSlot&) override { return {}; }
  uint64_t host_buffer_alignment() const override { return base_->host_buffer_alignment(); }

 private:
  bool GateOpen() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return gate_open_; }

  Tier* const base_;
  mutable absl::Mutex mu_;
  uint64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fail_read_at_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fail_write_at_ ABSL_GUARDED_BY(mu_) = 0;
  bool gate_open_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace strata

#endif  // STRATA_TIERS_TESTING_FAULT_INJECTION_TIER_H_
