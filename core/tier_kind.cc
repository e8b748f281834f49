#include "core/tier_kind.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::string_view TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kDevice: return "device";
    case TierKind::kPinnedHost: return "pinned_host";
    case TierKind::kNvme: return "nvme";
  }
  return "unknown";
}

absl::StatusOr<TierKind> ParseTierKind(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "device" || lower == "gpu" || lower == "cuda") return TierKind::kDevice;
  if (lower == "pinned_host" || lower == "cpu" || lower == "host") return TierKind::kPinnedHost;
  if (lower == "nvme") return TierKind::kNvme;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown tier '", text, "': expected one of device, pinned_host, nvme"));
}

}  // namespace strata
