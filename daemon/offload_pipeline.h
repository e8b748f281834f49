// OffloadPipeline: ZeRO-Offload (docs/DAEMON.md). The fp32 masters and
// optimizer states live in pinned host memory (HostShardStateStore), each
// rank's region is populated and holds its params at all times, and without
// loss scaling or clipping each shard is stepped as soon as its gradient is
// in, overlapping the trainers' backward. Nothing is durable: a daemon
// restart loses the job (checkpoints keep it).
#ifndef STRATA_DAEMON_OFFLOAD_PIPELINE_H_
#define STRATA_DAEMON_OFFLOAD_PIPELINE_H_

#include "daemon/step_pipeline.h"

namespace strata {

class OffloadPipeline final : public StepPipeline {
 public:
  // `early_apply`: no loss scaling and no gradient clipping.
  explicit OffloadPipeline(bool early_apply) : early_apply_(early_apply) {}

  bool durable() const override { return false; }
  bool early_apply() const override { return early_apply_; }
  bool windowed() const override { return false; }

  absl::StatusOr<std::unique_ptr<ShardStateStore>> MakeStates(const StateLayout& layout,
                                                              uint64_t tile_bytes) override;
  absl::StatusOr<uint64_t> RankPinnedBytes(uint32_t rank, const ExchangeLayout& layout,
                                           const StateLayout& states) const override;
  absl::Status OpenWindow(const std::vector<const std::vector<ExchangeSlot>*>&, ExchangeRegions*,
                          TransferExecutor*, std::function<void()>) override {
    return absl::OkStatus();
  }
  void AddRankLocked(absl::Mutex&, uint32_t, uint32_t, size_t) override {}
  void DropRankLocked(absl::Mutex&, uint32_t) override {}
  void CloseWindow() override {}
  void ReleasePinned() override {}
  uint64_t pinned_bytes() const override { return 0; }
  void CountLocked(absl::Mutex&, JobCounters&) const override {}
  ParamCacheStats param_stats() const override { return {}; }

  // Params are always in their slots.
  absl::Status ParamsWritten(uint32_t, uint32_t) override { return absl::OkStatus(); }
  absl::StatusOr<const std::byte*> ParamsToSave(uint32_t, const ExchangeSlot&, const std::byte* in_slot,
                                                std::optional<AlignedBuffer>&) const override {
    return in_slot;
  }
  absl::Status Acquire(uint32_t, const std::vector<uint32_t>&, absl::Time) override { return absl::OkStatus(); }
  absl::Status Release(uint32_t, const std::vector<uint32_t>&) override { return absl::OkStatus(); }
  void IterationBoundary(uint32_t) override {}
  void DropPins(uint32_t) override {}

  // Gradients stay in their slots until the step reads them.
  void GradArrivedLocked(absl::Mutex&, uint32_t, uint32_t, const ExchangeSlot&) override {}
  absl::Status AfterInspectLocked(absl::Mutex&, uint32_t, uint32_t, const ExchangeSlot&) override {
    return absl::OkStatus();
  }
  StepHooks BeginStep(absl::Mutex&, const std::vector<ShardId>&,
                      const std::vector<std::vector<ExchangeSlot>>&) override {
    return {};
  }
  void EndStep(absl::Mutex&) override {}
  void SkipStep(absl::Mutex&) override {}

 private:
  const bool early_apply_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_OFFLOAD_PIPELINE_H_
