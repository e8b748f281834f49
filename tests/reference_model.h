// The crash and fault harnesses' model and its reference: three tensors
// stepped by the CPU optimizer locally, and the check that a checkpoint
// directory of a strata job equals that reference at its step, bit for bit.
#ifndef STRATA_TESTS_REFERENCE_MODEL_H_
#define STRATA_TESTS_REFERENCE_MODEL_H_

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/strata_client.h"
#include "optimizer_cpu/cpu_optimizer.h"

namespace strata::reference {

inline std::vector<TensorDesc> Model() { return {{"w1", 5000}, {"b1", 37}, {"w2", 12000}}; }
inline float InitialParam(uint32_t t, uint64_t e, uint64_t seed) {
  return std::sin(0.001f * (e + 1) + t + 0.1f * seed);
}
inline float Grad(uint32_t t, uint64_t e, uint64_t step, uint64_t seed) {
  return std::cos(0.01f * e + t + 0.5f * step + 0.3f * seed) * 0.1f;
}

// Whole tensors after `steps` steps of the local optimizer (SmallInfinitySpec's AdamW).
struct Reference {
  std::vector<std::vector<float>> p, m, v;
};

inline Reference LocalReference(CpuOptimizer* opt, uint64_t seed, uint64_t steps) {
  OptimizerHyperparams hp;
  hp.kind = OptimizerKind::kAdamW;
  hp.lr = 0.01;
  hp.weight_decay = 0.1;
  Reference ref;
  const std::vector<TensorDesc> model = Model();
  for (uint32_t t = 0; t < model.size(); ++t) {
    const uint64_t n = model[t].numel;
    std::vector<float> p(n), m(n, 0), v(n, 0), g(n);
    for (uint64_t e = 0; e < n; ++e) p[e] = InitialParam(t, e, seed);
    for (uint64_t step = 0; step < steps; ++step) {
      for (uint64_t e = 0; e < n; ++e) g[e] = Grad(t, e, step, seed);
      StepSpans spans;
      spans.size = n;
      spans.params = p.data();
      spans.exp_avg = m.data();
      spans.exp_avg_sq = v.data();
      spans.grad = g.data();
      if (!opt->Step(hp, static_cast<int64_t>(step + 1), spans).ok()) std::abort();
    }
    ref.p.push_back(std::move(p));
    ref.m.push_back(std::move(m));
    ref.v.push_back(std::move(v));
  }
  return ref;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The shard layouts of the model (the same for every job), per rank.
using Layouts = std::vector<std::vector<ShardView>>;

// Compares a checkpoint directory with the reference; "" when equal. The
// checkpoint's step goes to *step_out.
inline std::string CheckCheckpoint(CpuOptimizer* opt, const std::string& dir, const Layouts& layouts,
                                   uint64_t seed, uint64_t* step_out) {
  const std::string manifest = ReadWholeFile(dir + "/manifest.json");
  const size_t at = manifest.find("\"next_step\"");
  if (at == std::string::npos) return absl::StrCat(dir, ": manifest.json has no next_step");
  size_t p = manifest.find(':', at) + 1;
  while (p < manifest.size() && manifest[p] == ' ') ++p;
  size_t q = p;
  while (q < manifest.size() && std::isdigit(static_cast<unsigned char>(manifest[q]))) ++q;
  uint64_t step = 0;
  if (!absl::SimpleAtoi(manifest.substr(p, q - p), &step)) return absl::StrCat(dir, ": bad next_step");
  *step_out = step;
  const Reference ref = LocalReference(opt, seed, step);
  for (uint32_t r = 0; r < layouts.size(); ++r) {
    for (const ShardView& shard : layouts[r]) {
      const std::string file = absl::StrCat(dir, "/rank", r, "-shard", shard.index, ".bin");
      const std::string bytes = ReadWholeFile(file);
      if (bytes.size() != shard.padded_numel * 4 * 4) {
        return absl::StrCat(file, " holds ", bytes.size(), " bytes, expected ", shard.padded_numel * 16);
      }
      const float* f = reinterpret_cast<const float*>(bytes.data());
      const char* names[] = {"master", "exp_avg", "exp_avg_sq", "param"};
      for (int s = 0; s < 4; ++s) {
        const std::vector<std::vector<float>>& want = s == 1 ? ref.m : s == 2 ? ref.v : ref.p;
        for (const OwnedRange& range : shard.ranges) {
          for (uint64_t e = 0; e < range.numel; ++e) {
            const float got = f[s * shard.padded_numel + range.shard_offset + e];
            const float exp = want[range.tensor.value()][range.tensor_offset + e];
            if (std::memcmp(&got, &exp, 4) != 0) {
              return absl::StrCat(file, ": ", names[s], " of tensor ", range.tensor.value(), " element ",
                                  range.tensor_offset + e, " is ", got, ", the reference at step ", step,
                                  " has ", exp);
            }
          }
        }
      }
    }
  }
  return "";
}

}  // namespace strata::reference

#endif  // STRATA_TESTS_REFERENCE_MODEL_H_
