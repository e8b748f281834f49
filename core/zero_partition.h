// ZeRO partition math: which elements of which tensor each rank owns, for the
// params, the gradients and the optimizer states, at ZeRO stage 0-3.
//
// Stage 1 partitions the optimizer states (fp32 master, moments) across the
// data-parallel ranks, stage 2 also the gradients, stage 3 also the params.
// Whatever a stage does not partition is replicated: every rank owns all of it.
//
// Layouts
//   Flat (stages 1 and 2, as DeepSpeed's stage 1/2 optimizer does): the
//   tensors are concatenated in order into one flat buffer, which is cut into
//   world_size equal shards; rank r owns shard r.
//   Per tensor (stage 3, as DeepSpeed's stage 3 does for params): every tensor
//   is cut into world_size equal shards on its own, so a rank can gather one
//   layer's params without touching the rest. Shard index i of a rank is the
//   i-th tensor.
//
// Padding rule (docs/PARTITIONING.md): every shard holds a multiple of
//   A = alignment_bytes / 2 elements (2 bytes being the smallest dtype), so a
//   shard's byte size and byte offset in any dtype -- fp16, bf16 or fp32 -- is a
//   multiple of alignment_bytes (default 4096) and can be swapped with
//   O_DIRECT. The shard size is P = ceil(n / (world_size * A)) * A elements for
//   n elements to split; the tail of the last shards is padding that no tensor
//   element maps to. All ranks' shards of one buffer have the same padded size;
//   the number of real elements they own differs only by that padding.
#ifndef STRATA_CORE_ZERO_PARTITION_H_
#define STRATA_CORE_ZERO_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ids.h"

namespace strata {

enum class StateClass : uint8_t { kParams = 0, kGrads = 1, kOptimizerStates = 2 };

struct TensorSpec {
  TensorId id;
  std::string name;
  uint64_t numel = 0;
};

struct PartitionSpec {
  int stage = 0;                      // 0..3
  uint32_t world_size = 1;            // data-parallel ranks, >= 1
  std::vector<TensorSpec> tensors;    // in the order the model registers them
  uint64_t alignment_bytes = 4096;    // power of two, >= 2
};

// A run of elements of one tensor that lies inside one shard.
struct OwnedRange {
  TensorId tensor;
  uint64_t tensor_offset = 0;  // first element, in the tensor
  uint64_t numel = 0;
  uint64_t shard_offset = 0;   // first element, in the shard
};

struct ShardLayout {
  uint32_t index = 0;              // ShardKey::index
  uint64_t padded_numel = 0;       // multiple of the alignment, >= owned elements
  std::vector<OwnedRange> ranges;  // sorted by shard_offset, non-overlapping
  uint64_t OwnedNumel() const;
};

struct RankLayout {
  uint32_t rank = 0;
  std::vector<ShardLayout> shards;
  uint64_t PaddedNumel() const;
  uint64_t OwnedNumel() const;
};

// True when `stage` partitions `state` across ranks.
bool IsPartitioned(int stage, StateClass state);

// InvalidArgument naming the field for a stage outside 0..3, world_size 0, an
// alignment that is not a power of two, duplicate tensor ids or empty tensors.
absl::Status ValidatePartitionSpec(const PartitionSpec& spec);

// The layout of `state` on every rank (index = rank). A replicated state gives
// every rank one shard holding all tensors, padded by the same rule.
absl::StatusOr<std::vector<RankLayout>> PartitionState(const PartitionSpec& spec,
                                                       StateClass state);

// Elements per shard-size step: alignment_bytes / 2.
uint64_t AlignmentElements(uint64_t alignment_bytes);

}  // namespace strata

#endif  // STRATA_CORE_ZERO_PARTITION_H_
