// What the daemon tests and the crash harness drive: a small 2-rank
// ZeRO-Infinity job with fp32 params and gradients, AdamW with weight decay
// and no clipping, and a 64 KiB pinned budget (smaller than one rank's
// params, so they really page to NVMe), and the helper that writes a value
// per tensor element into a shard's slot.
#ifndef STRATA_TESTS_INFINITY_JOB_H_
#define STRATA_TESTS_INFINITY_JOB_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/strata_client.h"

namespace strata {

inline JobSpec SmallInfinitySpec(const std::string& name, double lr = 0.01, double weight_decay = 0.1) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 2;
  spec.mode = JobMode::kInfinity;
  spec.deepspeed_config_json = absl::StrCat(
      R"({"gradient_clipping": 0, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"},
          "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}},
          "optimizer": {"type": "AdamW", "params": {"lr": )",
      lr, R"(, "weight_decay": )", weight_decay, "}}}");
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  spec.pinned_budget_bytes = 64 << 10;
  return spec;
}

// Writes value(tensor, element) as fp32 into the slot at `base` for every
// element the shard owns.
template <typename Fn>
void FillOwned(const ShardView& shard, std::byte* base, Fn value) {
  float* out = reinterpret_cast<float*>(base);
  for (const OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) out[r.shard_offset + e] = value(r.tensor.value(), r.tensor_offset + e);
  }
}

}  // namespace strata

#endif  // STRATA_TESTS_INFINITY_JOB_H_
