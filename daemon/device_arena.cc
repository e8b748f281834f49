#include "daemon/device_arena.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/status_macros.h"
#include "tiers/cuda_device_factory.h"
#include "tiers/emulated_device.h"

namespace strata {
namespace {

// The tier's slot alignment: a page, so a shard in the emulated arena is
// page-aligned in the trainer's mapping as well (and 256-byte aligned, as
// CUDA kernels want, on a GPU).
constexpr uint64_t kSlotAlignment = 4096;

}  // namespace

DeviceArena::~DeviceArena() {
  tier_.reset();  // frees the arena before the device goes
  device_.reset();
}

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::Create(DeviceChoice choice, uint64_t capacity_bytes,
                                                                 std::vector<std::string>* choices) {
  if (choice == DeviceChoice::kNone) {
    choices->push_back("device tier: off (--device none); jobs with a device budget are refused");
    return std::unique_ptr<DeviceArena>();
  }
  if (capacity_bytes == 0 || capacity_bytes % kSlotAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("device_capacity: ", capacity_bytes,
                                                   " bytes is not valid for a device tier; expected a positive "
                                                   "multiple of 4 KiB (or --device none)"));
  }
  std::unique_ptr<DeviceArena> arena(new DeviceArena());
  JobDeviceTierOptions tier_options;
  tier_options.capacity_bytes = capacity_bytes;
  tier_options.slot_alignment_bytes = kSlotAlignment;
  // The device holds every job's arena, each exactly its budget (rounded up
  // to the slot alignment): device memory = the admitted budgets. The store
  // mends fragmentation inside an arena by evicting the job's own copies
  // (tiers/tiered_store.h), so no headroom is reserved.
  const uint64_t device_bytes = capacity_bytes;
  std::string why_emulated;
  if (choice == DeviceChoice::kCuda || choice == DeviceChoice::kAuto) {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (count.ok() && *count > 0) {
      CudaDeviceOptions options;
      // No device-wide arena: each job's arena is its own cudaMalloc, so its
      // IPC handle opens that job's memory and nothing else.
      options.arena_bytes = 0;
      options.capacity_bytes = device_bytes;
      absl::StatusOr<std::unique_ptr<Device>> cuda = NewCudaDevice(options);
      if (!cuda.ok()) {
        return absl::Status(cuda.status().code(),
                            absl::StrCat("--device: the CUDA device arena of --device_capacity ",
                                         FormatBytes(capacity_bytes), ": ", cuda.status().message()));
      }
      arena->device_ = std::move(*cuda);
    } else if (choice == DeviceChoice::kCuda) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--device cuda: no usable GPU (",
          count.ok() ? std::string("the driver reports 0 devices") : std::string(count.status().message()),
          "); use --device emulated or auto"));
    } else {
      why_emulated = count.ok() ? "the driver reports 0 devices" : std::string(count.status().message());
    }
  }
  const bool emulated = arena->device_ == nullptr;
  if (emulated) {
    EmulatedDeviceOptions options;
    options.capacity_bytes = device_bytes;
    options.shared_memory = true;  // each job's arena is a memfd its trainers map
    STRATA_ASSIGN_OR_RETURN(arena->device_, EmulatedDevice::Create(options));
  }
  absl::StatusOr<std::unique_ptr<JobDeviceTier>> tier = JobDeviceTier::Create(arena->device_.get(), tier_options);
  if (!tier.ok()) {
    return absl::Status(tier.status().code(),
                        absl::StrCat("--device_capacity ", FormatBytes(capacity_bytes), ": ", tier.status().message()));
  }
  arena->tier_ = std::move(*tier);
  if (emulated) {
    choices->push_back(absl::StrCat("device tier: emulated, ", FormatBytes(capacity_bytes),
                                    " for per-job memfd arenas, each shared read-only with its job's trainers only",
                                    why_emulated.empty() ? std::string(" (--device emulated)")
                                                         : absl::StrCat(" (--device auto: no GPU: ", why_emulated, ")")));
  } else {
    choices->push_back(absl::StrCat("device tier: ", arena->device_->info().name, ", ", FormatBytes(capacity_bytes),
                                    " for per-job arenas (one cudaMalloc each), each shared by CUDA IPC with its "
                                    "job's trainers only"));
  }
  return arena;
}

}  // namespace strata
