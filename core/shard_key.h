// ShardKey names one contiguous byte range of one kind of training state owned
// by one rank of one job: the unit every tier stores and moves.
#ifndef STRATA_CORE_SHARD_KEY_H_
#define STRATA_CORE_SHARD_KEY_H_

#include <compare>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/ids.h"

namespace strata {

// What a shard holds. The optimizer-specific states are named after the
// optimizer that uses them so a checkpoint says what it is.
enum class TensorKind : uint8_t {
  kParam16 = 0,      // fp16/bf16 working params
  kMaster32 = 1,     // fp32 master params
  kGrad = 2,         // gradients (fp32, fp16 or bf16)
  kExpAvg = 3,       // Adam/AdamW first moment, Lion momentum
  kExpAvgSq = 4,     // Adam/AdamW second moment
  kMaxExpAvgSq = 5,  // AMSGrad's running max of the second moment
  kAdagradSum = 6,   // Adagrad's accumulated squared gradients
};
inline constexpr int kNumTensorKinds = 7;

// "param16", "master32", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "adagrad_sum".
absl::string_view TensorKindName(TensorKind kind);
absl::StatusOr<TensorKind> ParseTensorKind(absl::string_view text);

struct ShardKey {
  JobId job;
  Rank rank;
  TensorId tensor;
  TensorKind kind = TensorKind::kParam16;
  uint32_t index = 0;  // which shard of the tensor's partition, for split tensors

  friend auto operator<=>(const ShardKey&, const ShardKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ShardKey& k) {
    return H::combine(std::move(h), k.job, k.rank, k.tensor, k.kind, k.index);
  }
};

// "job7/rank0/t12/exp_avg/0": used in logs, errors and on-disk manifests.
std::string ShardKeyToString(const ShardKey& key);
absl::StatusOr<ShardKey> ParseShardKey(absl::string_view text);

}  // namespace strata

#endif  // STRATA_CORE_SHARD_KEY_H_
