// The memory tiers, fastest first.
#ifndef STRATA_CORE_TIER_KIND_H_
#define STRATA_CORE_TIER_KIND_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class TierKind : uint8_t { kDevice = 0, kPinnedHost = 1, kNvme = 2 };
inline constexpr int kNumTiers = 3;

constexpr int TierIndex(TierKind kind) { return static_cast<int>(kind); }

// "device", "pinned_host", "nvme".
absl::string_view TierKindName(TierKind kind);
// Accepts the names above and DeepSpeed's offload devices "gpu"/"cuda"
// (device), "cpu" (pinned_host), "nvme".
absl::StatusOr<TierKind> ParseTierKind(absl::string_view text);

}  // namespace strata

#endif  // STRATA_CORE_TIER_KIND_H_
