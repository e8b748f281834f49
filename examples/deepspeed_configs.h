// The DeepSpeed configs the example passes to the daemon, kept in one place
// so that all three modes share one optimizer section: local mode reads its
// AdamW hyperparameters from the offload config, and the daemon reads the
// same numbers from the config each job carries.
//
// fp32 params and gradients, no fp16/bf16 loss scaling and no gradient
// clipping: with those, every mode runs the same fp32 master math, which is
// what makes their losses bit-identical.
#ifndef STRATA_EXAMPLES_DEEPSPEED_CONFIGS_H_
#define STRATA_EXAMPLES_DEEPSPEED_CONFIGS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace strata {

// ZeRO stage 2, optimizer offloaded to the CPU. Local mode uses it too.
std::string OffloadDeepSpeedConfig(int micro_batch_rows);

// ZeRO stage 3 with params and optimizer states offloaded to NVMe under
// `nvme_path` (DeepSpeed requires the key; stratad places shards under its
// own --nvme_path).
std::string InfinityDeepSpeedConfig(int micro_batch_rows, absl::string_view nvme_path);

}  // namespace strata

#endif  // STRATA_EXAMPLES_DEEPSPEED_CONFIGS_H_
