// Moving a rank's partition between the model's flat buffers and a shard.
//
// A shard (the daemon's ShardView, or the local backend's own buffers) holds
// `padded_numel` elements; its OwnedRanges say which tensor elements sit
// where (core/zero_partition.h). The rest is padding, which the example fills
// with zeros so the optimizer reads defined values there. OwnedRange::tensor
// is the index in the model's tensor list: the order the ranks register.
#ifndef STRATA_EXAMPLES_PARTITION_COPY_H_
#define STRATA_EXAMPLES_PARTITION_COPY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/zero_partition.h"
#include "examples/mlp.h"
#include "examples/shm_world.h"

namespace strata {

// InvalidArgument, naming the shard and range, when a range names a tensor
// outside `tensors`, reaches past its tensor or past the shard, or overlaps
// another range of the shard.
absl::Status ValidateShardRanges(uint32_t shard_index, uint64_t padded_numel,
                                 absl::Span<const OwnedRange> ranges,
                                 const std::vector<ModelTensor>& tensors);

// The runs of the flat model buffer that `ranges` cover.
// REQUIRES: ValidateShardRanges(...).ok().
std::vector<FlatRun> FlatRunsOf(absl::Span<const OwnedRange> ranges,
                                const std::vector<ModelTensor>& tensors);

// Writes the owned elements of `flat` into `shard` (padded_numel floats) and
// zeros into its padding.
void CopyFlatToShard(absl::Span<const float> flat, absl::Span<const OwnedRange> ranges,
                     const std::vector<ModelTensor>& tensors, absl::Span<float> shard);

// Writes the owned elements of `shard` into `flat`; the rest of `flat` is
// left as it was.
void CopyShardToFlat(absl::Span<const float> shard, absl::Span<const OwnedRange> ranges,
                     const std::vector<ModelTensor>& tensors, absl::Span<float> flat);

}  // namespace strata

#endif  // STRATA_EXAMPLES_PARTITION_COPY_H_
