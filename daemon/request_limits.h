// RequestLimits: caps on what one client may ask of the daemon, checked at
// the edge before anything is allocated (docs/SECURITY.md). Every cap has a
// default and a flag/config field (proto/strata/v1/config.proto, 103..110).
#ifndef STRATA_DAEMON_REQUEST_LIMITS_H_
#define STRATA_DAEMON_REQUEST_LIMITS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/zero_partition.h"

namespace strata {

struct RequestLimits {
  uint32_t max_jobs_per_uid = 64;
  uint32_t max_tensors_per_job = 65536;
  // 2^36 elements (68.7e9) per tensor and 2^37 per job: far beyond what one
  // node's pinned memory and NVMe hold for ZeRO states (16 bytes/param), and
  // small enough that no size computed from them can overflow 64 bits.
  uint64_t max_tensor_elements = uint64_t{1} << 36;
  uint64_t max_job_elements = uint64_t{1} << 37;
  uint64_t max_region_bytes = uint64_t{64} << 30;
  uint32_t max_name_length = 1024;
  uint32_t max_world_size = 4096;
  uint32_t max_pending_waits = 256;
};

// The hard ceilings a configured cap may not exceed: with them, every size
// the daemon derives (numel x 16 bytes x world size, padded) fits in 64 bits.
inline constexpr uint64_t kHardMaxElements = uint64_t{1} << 40;
inline constexpr uint32_t kHardMaxWorldSize = 65536;

// InvalidArgument naming the tensor and the field for: no tensors, an empty
// or over-long name, 0 elements, more elements than max_tensor_elements;
// ResourceExhausted naming the cap for too many tensors or elements in all.
absl::Status ValidateTensorList(const RequestLimits& limits, const std::vector<TensorSpec>& tensors);

}  // namespace strata

#endif  // STRATA_DAEMON_REQUEST_LIMITS_H_
