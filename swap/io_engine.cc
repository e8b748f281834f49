#include "swap/io_engine.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::string_view IoOpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

absl::Status ValidateIoEngineOptions(const IoEngineOptions& options) {
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "io engine queue_depth ", options.queue_depth, " is out of range: use 1..4096"));
  }
  if (options.block_size_bytes < 4096 || options.block_size_bytes > (uint64_t{1} << 30) ||
      options.block_size_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "io engine block_size ", options.block_size_bytes,
        " bytes is invalid: use a multiple of 4096 between 4 KiB and 1 GiB"));
  }
  if (options.max_outstanding_requests < 1) {
    return absl::InvalidArgumentError("io engine max_outstanding_requests must be at least 1");
  }
  if (options.sqpoll && options.sqpoll_idle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("io engine sqpoll_idle must not be negative");
  }
  return absl::OkStatus();
}

absl::string_view IoEngineKindName(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kUring: return "io_uring";
    case IoEngineKind::kAio: return "libaio";
    case IoEngineKind::kPsync: return "psync";
  }
  return "unknown";
}

absl::StatusOr<IoEngineKind> ParseIoEngineKind(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "io_uring" || t == "uring") return IoEngineKind::kUring;
  if (t == "libaio" || t == "aio") return IoEngineKind::kAio;
  if (t == "psync") return IoEngineKind::kPsync;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown io engine '", text, "': use io_uring, libaio or psync"));
}

absl::StatusOr<std::unique_ptr<IoEngine>> NewIoEngine(IoEngineKind kind,
                                                      const IoEngineOptions& options) {
  switch (kind) {
    case IoEngineKind::kUring: return NewUringEngine(options);
    case IoEngineKind::kAio: return NewAioEngine(options);
    case IoEngineKind::kPsync: return NewPsyncEngine(options);
  }
  return absl::InvalidArgumentError("unknown io engine kind");
}

absl::StatusOr<std::unique_ptr<IoEngine>> OpenIoEngine(const IoEngineOptions& options,
                                                       std::optional<IoEngineKind> forced,
                                                       std::vector<std::string>* fallback_notes) {
  if (forced.has_value()) return NewIoEngine(*forced, options);
  absl::Status last;
  for (IoEngineKind kind : {IoEngineKind::kUring, IoEngineKind::kAio, IoEngineKind::kPsync}) {
    absl::StatusOr<std::unique_ptr<IoEngine>> e = NewIoEngine(kind, options);
    if (e.ok()) return e;
    // Bad options fail every engine alike: say so instead of falling back.
    if (absl::IsInvalidArgument(e.status())) return e.status();
    if (fallback_notes != nullptr) {
      fallback_notes->push_back(absl::StrCat(IoEngineKindName(kind), " unavailable: ",
                                             e.status().message()));
    }
    last = e.status();
  }
  return last;
}

}  // namespace strata
