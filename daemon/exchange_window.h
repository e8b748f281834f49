// ExchangeWindow: one rank's exchange window -- the slots it shares with the
// daemon (a gradient slot and a param slot per shard, page-aligned) and the
// region (PinnedArena, a memfd the trainer maps) they sit in. ExchangeRegions
// is where every built rank's region is, for the code that reaches the slots
// without the job's lock (the step's workers, the ParamCache).
//
// The layout is pure arithmetic on the partition and is checked (sizes may
// come from a trainer); mapping the region is a separate step, so the job can
// reserve the pinned memory in between.
#ifndef STRATA_DAEMON_EXCHANGE_WINDOW_H_
#define STRATA_DAEMON_EXCHANGE_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/dtype.h"
#include "core/zero_partition.h"
#include "tiers/pinned_arena.h"

namespace strata {

// A run of shard elements whose tensors belong to one param group. A slot's
// runs cover [0, padded_numel) in order; padding belongs to the group before
// it (the first group when the shard starts with padding).
struct GroupRun {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint32_t group = 0;
};

// One shard a rank exchanges with the daemon, and where its slots are in the
// rank's exchange region.
struct ExchangeSlot {
  ShardLayout layout;  // index, padded size, owned tensor ranges
  uint64_t grad_offset = 0;
  uint64_t param_offset = 0;
  std::vector<GroupRun> group_runs;
};

// The dtypes of a job's slots, which size them.
struct SlotDTypes {
  DType param = DType::kFp16;
  DType grad = DType::kFp16;
  // Page-rounded bytes of a slot (the layout checked the products).
  uint64_t ParamSlotBytes(const ExchangeSlot& slot) const;
  uint64_t GradSlotBytes(const ExchangeSlot& slot) const;
};

// Splits a flat stage-1/2 shard into sub-groups of at most `sub_group`
// elements (a multiple of `align`), so each can be stepped as soon as its
// gradient arrives.
std::vector<ShardLayout> SplitSubGroups(const ShardLayout& flat, uint64_t sub_group, uint64_t align);

// One rank's slots, laid out but not yet mapped.
struct ExchangeLayout {
  std::vector<ExchangeSlot> slots;
  uint64_t region_bytes = 0;  // at least a page
};

// Grad slot then param slot per shard, each rounded up to a page, with every
// product and sum checked; `group_of` (param group per tensor) gives each
// slot's group_runs.
absl::StatusOr<ExchangeLayout> LayOutExchange(std::vector<ShardLayout> shards, const SlotDTypes& dtypes,
                                              const std::vector<uint32_t>& group_of);

// One rank's window: its slots and the shared region that holds them.
struct ExchangeWindow {
  std::vector<ExchangeSlot> slots;
  PinnedArena exchange;
  // Maps a region for `layout` (named `name`; `populate`: fault every page in
  // now, else memory comes as slots are written) and takes its slots.
  absl::Status Map(ExchangeLayout layout, const std::string& name, bool populate);
};

// Where each built rank's slots are. A leaf lock: taken under the job's lock
// or without it, never held while taking another.
class ExchangeRegions {
 public:
  explicit ExchangeRegions(SlotDTypes dtypes) : dtypes_(dtypes) {}

  // Publishes rank `rank`'s window (once, when it is built; `ranks` is the
  // job's world size). The window must stay where it is until Clear.
  void Publish(uint32_t rank, size_t ranks, ExchangeWindow& window);
  void Clear();

  std::byte* GradSlot(uint32_t rank, const ExchangeSlot& slot) const;
  std::byte* ParamSlot(uint32_t rank, const ExchangeSlot& slot) const;
  // The param slot of shard `index` and its bytes.
  std::pair<std::byte*, uint64_t> ParamShard(uint32_t rank, uint32_t index) const;
  // The Infinity window gives the memory of a slot back.
  void DiscardParamSlot(uint32_t rank, uint32_t index) const;
  void DiscardGradSlot(uint32_t rank, const ExchangeSlot& slot) const;
  void DiscardGradSlot(uint32_t rank, uint32_t index) const;

 private:
  struct Published {
    std::byte* base = nullptr;
    std::vector<ExchangeSlot> slots;
    PinnedArena* region = nullptr;
  };
  const SlotDTypes dtypes_;
  mutable absl::Mutex mu_;
  std::vector<Published> published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_DAEMON_EXCHANGE_WINDOW_H_
