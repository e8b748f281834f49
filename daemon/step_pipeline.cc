#include "daemon/step_pipeline.h"

#include "daemon/infinity_pipeline.h"
#include "daemon/job.h"
#include "daemon/offload_pipeline.h"

namespace strata {

absl::StatusOr<std::unique_ptr<StepPipeline>> MakeStepPipeline(uint64_t job_id, const JobSettings& settings,
                                                               const JobServices& services) {
  if (settings.mode == JobMode::kInfinity) {
    if (services.nvme == nullptr) {
      return absl::FailedPreconditionError(
          "MODE_INFINITY needs the NVMe tier, and this daemon has none: start stratad with --nvme_path DIR");
    }
    // Early, speculatively under loss scaling (an overflow rolls the early
    // updates back), but not with clipping (the coefficient needs every
    // norm). The new params wait on NVMe until the step (EarlyStepLocked).
    const bool early = settings.gradient_clipping <= 0;
    return std::make_unique<InfinityPipeline>(job_id, settings.name, settings.world_size,
                                              SlotDTypes{settings.param_dtype, settings.grad_dtype},
                                              settings.pinned_budget_bytes, services.nvme, services.pinned,
                                              services.params, early);
  }
  // ZeRO-Offload without loss scaling or clipping: each shard is stepped as
  // soon as its gradient is in, overlapping the trainers' backward. With
  // either, the update depends on every rank's gradients and waits for all.
  return std::make_unique<OffloadPipeline>(settings.mode == JobMode::kOffload &&
                                           !settings.loss_scale.enabled && settings.gradient_clipping <= 0);
}

std::optional<StepHooks> StepPipeline::EarlyStepLocked(absl::Mutex& /*job_mu*/, uint32_t /*rank*/,
                                                       uint32_t /*index*/, const ExchangeSlot& /*slot*/,
                                                       bool /*step_certain*/) {
  return StepHooks{};
}

GradWindow StepPipeline::GradWindowLocked(absl::Mutex& /*job_mu*/, uint32_t /*rank*/) const { return GradWindow{}; }

}  // namespace strata
