#include "core/zero_partition.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

uint64_t PaddedShardNumel(uint64_t numel, uint32_t world_size, uint64_t align) {
  uint64_t step = static_cast<uint64_t>(world_size) * align;
  uint64_t steps = (numel + step - 1) / step;
  return std::max<uint64_t>(steps, 1) * align;
}

// Appends to `shard` the parts of tensors [first, last) that fall in the flat
// element window [begin, end). `tensor_starts[i]` is tensor i's flat offset.
void CutWindow(const std::vector<TensorSpec>& tensors, const std::vector<uint64_t>& tensor_starts,
               uint64_t begin, uint64_t end, ShardLayout* shard) {
  // First tensor whose end is past `begin`.
  auto it = std::upper_bound(tensor_starts.begin(), tensor_starts.end(), begin);
  size_t i = it == tensor_starts.begin() ? 0 : static_cast<size_t>(it - tensor_starts.begin()) - 1;
  for (; i < tensors.size() && tensor_starts[i] < end; ++i) {
    uint64_t t_begin = tensor_starts[i];
    uint64_t t_end = t_begin + tensors[i].numel;
    uint64_t lo = std::max(t_begin, begin);
    uint64_t hi = std::min(t_end, end);
    if (lo >= hi) continue;
    shard->ranges.push_back(OwnedRange{tensors[i].id, lo - t_begin, hi - lo, lo - begin});
  }
}

}  // namespace

uint64_t ShardLayout::OwnedNumel() const {
  uint64_t total = 0;
  for (const OwnedRange& r : ranges) total += r.numel;
  return total;
}

uint64_t RankLayout::PaddedNumel() const {
  uint64_t total = 0;
  for (const ShardLayout& s : shards) total += s.padded_numel;
  return total;
}

uint64_t RankLayout::OwnedNumel() const {
  uint64_t total = 0;
  for (const ShardLayout& s : shards) total += s.OwnedNumel();
  return total;
}

uint64_t AlignmentElements(uint64_t alignment_bytes) { return alignment_bytes / 2; }

bool IsPartitioned(int stage, StateClass state) {
  switch (state) {
    case StateClass::kOptimizerStates: return stage >= 1;
    case StateClass::kGrads: return stage >= 2;
    case StateClass::kParams: return stage >= 3;
  }
  return false;
}

absl::Status ValidatePartitionSpec(const PartitionSpec& spec) {
  if (spec.stage < 0 || spec.stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZeRO stage ", spec.stage, " is not supported: expected 0, 1, 2 or 3"));
  }
  if (spec.world_size == 0) {
    return absl::InvalidArgumentError("world_size is 0: expected at least 1 rank");
  }
  if (spec.alignment_bytes < 2 || (spec.alignment_bytes & (spec.alignment_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alignment_bytes ", spec.alignment_bytes, " is not a power of two >= 2"));
  }
  absl::flat_hash_set<TensorId> seen;
  for (const TensorSpec& t : spec.tensors) {
    if (t.numel == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' (id ", t.id.value(), ") has no elements"));
    }
    if (!seen.insert(t.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor id ", t.id.value(), " ('", t.name, "') is registered twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RankLayout>> PartitionState(const PartitionSpec& spec,
                                                       StateClass state) {
  if (absl::Status s = ValidatePartitionSpec(spec); !s.ok()) return s;
  const uint64_t align = AlignmentElements(spec.alignment_bytes);
  const bool partitioned = IsPartitioned(spec.stage, state);
  const uint32_t ways = partitioned ? spec.world_size : 1;
  std::vector<RankLayout> layouts(spec.world_size);
  for (uint32_t r = 0; r < spec.world_size; ++r) layouts[r].rank = r;

  // The piece of a split buffer that rank r owns: shard (partitioned ? r : 0).
  auto piece_of = [&](uint32_t rank) { return partitioned ? rank : 0u; };

  if (partitioned && spec.stage == 3) {
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      const TensorSpec& t = spec.tensors[i];
      const uint64_t p = PaddedShardNumel(t.numel, ways, align);
      for (uint32_t r = 0; r < spec.world_size; ++r) {
        ShardLayout shard;
        shard.index = static_cast<uint32_t>(i);
        shard.padded_numel = p;
        uint64_t begin = std::min<uint64_t>(static_cast<uint64_t>(piece_of(r)) * p, t.numel);
        uint64_t end = std::min<uint64_t>(begin + p, t.numel);
        if (end > begin) shard.ranges.push_back(OwnedRange{t.id, begin, end - begin, 0});
        layouts[r].shards.push_back(std::move(shard));
      }
    }
    return layouts;
  }

  std::vector<uint64_t> starts;
  starts.reserve(spec.tensors.size());
  uint64_t total = 0;
  for (const TensorSpec& t : spec.tensors) {
    starts.push_back(total);
    total += t.numel;
  }
  const uint64_t p = PaddedShardNumel(total, ways, align);
  for (uint32_t r = 0; r < spec.world_size; ++r) {
    ShardLayout shard;
    shard.index = 0;
    shard.padded_numel = p;
    uint64_t begin = static_cast<uint64_t>(piece_of(r)) * p;
    CutWindow(spec.tensors, starts, begin, begin + p, &shard);
    layouts[r].shards.push_back(std::move(shard));
  }
  return layouts;
}

}  // namespace strata
