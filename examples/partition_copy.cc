#include "examples/partition_copy.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace strata {

absl::Status ValidateShardRanges(uint32_t shard_index, uint64_t padded_numel,
                                 absl::Span<const OwnedRange> ranges,
                                 const std::vector<ModelTensor>& tensors) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) in the shard
  for (const OwnedRange& r : ranges) {
    const uint32_t t = r.tensor.value();
    if (t >= tensors.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", shard_index, ": a range names tensor ", t, " but the model has ", tensors.size()));
    }
    if (r.tensor_offset + r.numel > tensors[t].numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", shard_index, ": range [", r.tensor_offset, ", +", r.numel, ") of tensor '",
          tensors[t].name, "' reaches past its ", tensors[t].numel, " elements"));
    }
    if (r.shard_offset + r.numel > padded_numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", shard_index, ": range at shard offset ", r.shard_offset, " (+", r.numel,
          ") reaches past the shard's ", padded_numel, " elements"));
    }
    spans.emplace_back(r.shard_offset, r.shard_offset + r.numel);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", shard_index, ": ranges overlap at shard offset ", spans[i].first));
    }
  }
  return absl::OkStatus();
}

std::vector<FlatRun> FlatRunsOf(absl::Span<const OwnedRange> ranges,
                                const std::vector<ModelTensor>& tensors) {
  std::vector<FlatRun> runs;
  runs.reserve(ranges.size());
  for (const OwnedRange& r : ranges) {
    runs.push_back({tensors[r.tensor.value()].flat_offset + r.tensor_offset, r.numel});
  }
  return runs;
}

void CopyFlatToShard(absl::Span<const float> flat, absl::Span<const OwnedRange> ranges,
                     const std::vector<ModelTensor>& tensors, absl::Span<float> shard) {
  std::fill(shard.begin(), shard.end(), 0.0f);
  for (const OwnedRange& r : ranges) {
    const uint64_t from = tensors[r.tensor.value()].flat_offset + r.tensor_offset;
    STRATA_CHECK(from + r.numel <= flat.size() && r.shard_offset + r.numel <= shard.size());
    std::memcpy(shard.data() + r.shard_offset, flat.data() + from, r.numel * sizeof(float));
  }
}

void CopyShardToFlat(absl::Span<const float> shard, absl::Span<const OwnedRange> ranges,
                     const std::vector<ModelTensor>& tensors, absl::Span<float> flat) {
  for (const OwnedRange& r : ranges) {
    const uint64_t to = tensors[r.tensor.value()].flat_offset + r.tensor_offset;
    STRATA_CHECK(to + r.numel <= flat.size() && r.shard_offset + r.numel <= shard.size());
    std::memcpy(flat.data() + to, shard.data() + r.shard_offset, r.numel * sizeof(float));
  }
}

}  // namespace strata
