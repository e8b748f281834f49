// Generated access traces for the prefetch benchmark: what a ZeRO-3 trainer
// asks the store for, shard by shard, iteration after iteration.
//
//  transformer   L layers: forward reads param_i in order; backward, in
//                reverse, reads param_i and writes grad_i; the optimizer step
//                reads grad_i and writes the optimizer state and param_i.
//  checkpointed  the same with activation checkpointing: backward recomputes
//                each segment's forward (reading its params again) first.
//  moe           mixture of experts: per layer an attention shard and E
//                experts of which top_k are routed to each iteration, drawn
//                from a skewed (Zipf) per-layer popularity, so no two
//                iterations are alike; backward and step touch the same
//                experts as that iteration's forward.
//  shifting      the transformer with a different random quarter of the
//                layers dropped every `change_every` iterations (progressive
//                layer dropping / freezing): the shape changes for good.
#ifndef STRATA_BENCH_PREFETCH_TRACES_H_
#define STRATA_BENCH_PREFETCH_TRACES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/shard_key.h"

namespace strata {

struct TraceAccess {
  ShardKey key;
  bool write = false;
};

struct GeneratedTrace {
  std::string name;
  std::vector<TraceAccess> accesses;
  // Index of the first access of each iteration (ascending, starts with 0).
  std::vector<size_t> iteration_starts;
  // Every shard the trace touches, sorted.
  std::vector<ShardKey> shards;
  // Iterations at which the shape changed (shifting only).
  std::vector<size_t> changes;
};

struct TraceOptions {
  uint32_t layers = 24;
  uint32_t iterations = 12;
  uint32_t checkpoint_segment = 4;  // checkpointed
  uint32_t experts = 8;             // moe
  uint32_t top_k = 2;               // moe
  uint32_t change_every = 5;        // shifting
  uint64_t seed = 301;
};

// `name` is one of "transformer", "checkpointed", "moe", "shifting".
absl::StatusOr<GeneratedTrace> GenerateTrace(absl::string_view name, const TraceOptions& options);

}  // namespace strata

#endif  // STRATA_BENCH_PREFETCH_TRACES_H_
