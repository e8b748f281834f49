// JobMode: how a job keeps its training state -- the one word the client, the
// daemon and the checkpoints share. The wire form is strata.v1.Mode (converted
// at the service edge, daemon/job_proto.h); the numbers match it on purpose.
#ifndef STRATA_CORE_JOB_MODE_H_
#define STRATA_CORE_JOB_MODE_H_

#include <cstdint>
#include <string_view>

namespace strata {

enum class JobMode : uint8_t {
  kOffload = 1,   // ZeRO-Offload: masters and optimizer states in pinned host memory
  kInfinity = 2,  // ZeRO-Infinity: params and optimizer states on NVMe
};

inline std::string_view JobModeName(JobMode mode) {
  return mode == JobMode::kInfinity ? "infinity" : "offload";
}

}  // namespace strata

#endif  // STRATA_CORE_JOB_MODE_H_
