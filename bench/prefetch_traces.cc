#include "bench/prefetch_traces.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

ShardKey Key(uint32_t layer, TensorKind kind, uint32_t index = 0) {
  return ShardKey{JobId(1), Rank(0), TensorId(layer), kind, index};
}

class Builder {
 public:
  explicit Builder(GeneratedTrace* trace) : trace_(trace) {}
  void BeginIteration() { trace_->iteration_starts.push_back(trace_->accesses.size()); }
  void Read(const ShardKey& key) { trace_->accesses.push_back({key, false}); }
  void Write(const ShardKey& key) { trace_->accesses.push_back({key, true}); }

 private:
  GeneratedTrace* trace_;
};

// One dense iteration over `layers` (the layers that take part, in order).
void DenseIteration(Builder& b, const std::vector<uint32_t>& layers, uint32_t segment) {
  b.BeginIteration();
  for (uint32_t l : layers) b.Read(Key(l, TensorKind::kParam16));
  const size_t n = layers.size();
  if (segment == 0) {
    for (size_t i = n; i-- > 0;) {
      b.Read(Key(layers[i], TensorKind::kParam16));
      b.Write(Key(layers[i], TensorKind::kGrad));
    }
  } else {
    // Segments from the last; each recomputes its forward, then runs backward.
    const size_t segments = (n + segment - 1) / segment;
    for (size_t s = segments; s-- > 0;) {
      const size_t lo = s * segment;
      const size_t hi = std::min(n, lo + segment);
      for (size_t i = lo; i < hi; ++i) b.Read(Key(layers[i], TensorKind::kParam16));
      for (size_t i = hi; i-- > lo;) {
        b.Read(Key(layers[i], TensorKind::kParam16));
        b.Write(Key(layers[i], TensorKind::kGrad));
      }
    }
  }
  for (uint32_t l : layers) {
    b.Read(Key(l, TensorKind::kGrad));
    b.Write(Key(l, TensorKind::kExpAvg));  // optimizer state (m, v, master) of the layer
    b.Write(Key(l, TensorKind::kParam16));
  }
}

void MoeIteration(Builder& b, uint32_t layers, const std::vector<std::vector<uint32_t>>& chosen) {
  b.BeginIteration();
  for (uint32_t l = 0; l < layers; ++l) {
    b.Read(Key(l, TensorKind::kParam16));
    for (uint32_t e : chosen[l]) b.Read(Key(l, TensorKind::kParam16, e + 1));
  }
  for (uint32_t l = layers; l-- > 0;) {
    b.Read(Key(l, TensorKind::kParam16));
    b.Write(Key(l, TensorKind::kGrad));
    for (auto it = chosen[l].rbegin(); it != chosen[l].rend(); ++it) {
      b.Read(Key(l, TensorKind::kParam16, *it + 1));
      b.Write(Key(l, TensorKind::kGrad, *it + 1));
    }
  }
  for (uint32_t l = 0; l < layers; ++l) {
    std::vector<uint32_t> indexes = {0};
    for (uint32_t e : chosen[l]) indexes.push_back(e + 1);
    for (uint32_t index : indexes) {
      b.Read(Key(l, TensorKind::kGrad, index));
      b.Write(Key(l, TensorKind::kExpAvg, index));
      b.Write(Key(l, TensorKind::kParam16, index));
    }
  }
}

}  // namespace

absl::StatusOr<GeneratedTrace> GenerateTrace(absl::string_view name, const TraceOptions& o) {
  if (o.layers == 0 || o.iterations == 0) {
    return absl::InvalidArgumentError("trace: layers and iterations must be > 0");
  }
  GeneratedTrace trace;
  trace.name = std::string(name);
  Builder b(&trace);
  std::mt19937_64 rng(o.seed);
  std::vector<uint32_t> all(o.layers);
  std::iota(all.begin(), all.end(), 0);
  if (name == "transformer" || name == "checkpointed") {
    const uint32_t segment = name == "checkpointed" ? std::max<uint32_t>(o.checkpoint_segment, 1) : 0;
    for (uint32_t it = 0; it < o.iterations; ++it) DenseIteration(b, all, segment);
  } else if (name == "moe") {
    if (o.top_k == 0 || o.top_k > o.experts) {
      return absl::InvalidArgumentError("trace moe: need 0 < top_k <= experts");
    }
    // Per layer: a random ranking of experts with Zipf(1) popularity.
    std::vector<std::vector<double>> weight(o.layers, std::vector<double>(o.experts));
    for (uint32_t l = 0; l < o.layers; ++l) {
      std::vector<uint32_t> rank(o.experts);
      std::iota(rank.begin(), rank.end(), 0);
      std::shuffle(rank.begin(), rank.end(), rng);
      for (uint32_t e = 0; e < o.experts; ++e) weight[l][e] = 1.0 / (1.0 + rank[e]);
    }
    for (uint32_t it = 0; it < o.iterations; ++it) {
      std::vector<std::vector<uint32_t>> chosen(o.layers);
      for (uint32_t l = 0; l < o.layers; ++l) {
        std::vector<double> w = weight[l];
        std::set<uint32_t> picked;
        while (picked.size() < o.top_k) {
          std::discrete_distribution<uint32_t> pick(w.begin(), w.end());
          const uint32_t e = pick(rng);
          picked.insert(e);
          w[e] = 0;
        }
        chosen[l].assign(picked.begin(), picked.end());
      }
      MoeIteration(b, o.layers, chosen);
    }
  } else if (name == "shifting") {
    const uint32_t every = std::max<uint32_t>(o.change_every, 1);
    std::vector<uint32_t> active;
    for (uint32_t it = 0; it < o.iterations; ++it) {
      if (it % every == 0) {
        std::vector<uint32_t> shuffled = all;
        std::shuffle(shuffled.begin(), shuffled.end(), rng);
        std::set<uint32_t> dropped(shuffled.begin(), shuffled.begin() + o.layers / 4);
        active.clear();
        for (uint32_t l : all) {
          if (!dropped.contains(l)) active.push_back(l);
        }
        if (it > 0) trace.changes.push_back(it);
      }
      DenseIteration(b, active, 0);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown trace '", name, "'; one of transformer, checkpointed, moe, shifting"));
  }
  std::set<ShardKey> shards;
  for (const TraceAccess& a : trace.accesses) shards.insert(a.key);
  trace.shards.assign(shards.begin(), shards.end());
  return trace;
}

}  // namespace strata
