#include "examples/deepspeed_configs.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace strata {
namespace {

// AdamW at lr 1e-2: large enough for the loss to fall visibly in five steps
// of a small MLP, small enough not to diverge. Weight decay is on so that
// the decoupled-decay path of the kernel runs too.
constexpr absl::string_view kOptimizer = R"(
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
  })";

}  // namespace

std::string OffloadDeepSpeedConfig(int micro_batch_rows) {
  return absl::StrCat(R"({
  "train_micro_batch_size_per_gpu": )", micro_batch_rows, R"(,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 0,
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true}
  },)", kOptimizer, "\n}\n");
}

std::string InfinityDeepSpeedConfig(int micro_batch_rows, absl::string_view nvme_path) {
  // JSON-escape the two characters a path may hold that would break the string.
  const std::string path = absl::StrReplaceAll(nvme_path, {{"\\", "\\\\"}, {"\"", "\\\""}});
  return absl::StrCat(R"({
  "train_micro_batch_size_per_gpu": )", micro_batch_rows, R"(,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 0,
  "zero_optimization": {
    "stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": ")", path, R"(", "pin_memory": true},
    "offload_optimizer": {"device": "nvme", "nvme_path": ")", path, R"(", "pin_memory": true}
  },)", kOptimizer, "\n}\n");
}

}  // namespace strata
