#include "core/shard_key.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata {
namespace {

constexpr absl::string_view kKindNames[kNumTensorKinds] = {
    "param16", "master32", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "adagrad_sum"};

bool ParsePrefixed(absl::string_view text, absl::string_view prefix, uint64_t* out) {
  if (!absl::ConsumePrefix(&text, prefix)) return false;
  return absl::SimpleAtoi(text, out);
}

}  // namespace

absl::string_view TensorKindName(TensorKind kind) {
  int index = static_cast<int>(kind);
  return index < kNumTensorKinds ? kKindNames[index] : "unknown";
}

absl::StatusOr<TensorKind> ParseTensorKind(absl::string_view text) {
  for (int i = 0; i < kNumTensorKinds; ++i) {
    if (text == kKindNames[i]) return static_cast<TensorKind>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown tensor kind '", text,
      "': expected one of param16, master32, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, adagrad_sum"));
}

std::string ShardKeyToString(const ShardKey& key) {
  return absl::StrCat("job", key.job.value(), "/rank", key.rank.value(), "/t",
                      key.tensor.value(), "/", TensorKindName(key.kind), "/", key.index);
}

absl::StatusOr<ShardKey> ParseShardKey(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '/');
  uint64_t job = 0, rank = 0, tensor = 0, index = 0;
  if (parts.size() != 5 || !ParsePrefixed(parts[0], "job", &job) ||
      !ParsePrefixed(parts[1], "rank", &rank) || !ParsePrefixed(parts[2], "t", &tensor) ||
      !absl::SimpleAtoi(parts[4], &index) || rank > UINT32_MAX || tensor > UINT32_MAX ||
      index > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed shard key '", text, "': expected job<N>/rank<N>/t<N>/<kind>/<index>"));
  }
  ShardKey key;
  key.job = JobId(job);
  key.rank = Rank(static_cast<uint32_t>(rank));
  key.tensor = TensorId(static_cast<uint32_t>(tensor));
  auto kind = ParseTensorKind(parts[3]);
  if (!kind.ok()) return kind.status();
  key.kind = *kind;
  key.index = static_cast<uint32_t>(index);
  return key;
}

}  // namespace strata
