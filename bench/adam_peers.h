// The peers of `strata bench adam`, measured in the same run on the same
// machine: torch's fused AdamW (torch 2.x from the project's venv),
// DeepSpeedCPUAdam (and its Adagrad and Lion, JIT-built for the CPU), and
// Debian's torch 1.13 foreach. Each runs bench/adam_peers.py in its own
// process, one process per peer and thread count, doing every variant its
// best way (a 16-bit gradient and param copy as upcast, step, downcast: none
// of them fuses those). See docs/OPTIMIZER.md, "Peers".
#ifndef STRATA_BENCH_ADAM_PEERS_H_
#define STRATA_BENCH_ADAM_PEERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata {

// The peers in the order they are reported.
inline constexpr const char* kAdamPeerNames[] = {"torch_fused", "deepspeed", "torch_foreach"};

struct AdamPeerOptions {
  // Python of the venv (torch 2.x, DeepSpeed); empty: torch_fused and
  // deepspeed are reported as not measured, with `venv_missing` as the reason.
  std::string venv_python;
  std::string venv_missing;
  std::string debian_python = "/usr/bin/python3";  // torch_foreach
  std::string script;                               // bench/adam_peers.py
  std::vector<std::string> peers = {"torch_fused", "deepspeed", "torch_foreach"};
  uint64_t size = 0;
  int warmup = 2;
  int steps = 5;
  bool build_deepspeed_ops = true;  // false: ops not yet JIT-built are reported, not built
};

struct AdamPeerResult {
  std::string peer;
  std::string variant;  // "adamw:fp16:fp16": algorithm, gradient dtype, param copy dtype or none
  int threads = 0;
  double elements_per_s = 0;  // 0: not measured, see `note`
  double best_step_s = 0;
  double cpu_share = 0;
  std::string version;
  std::string note;  // why not measured (unsupported, no venv, failed)
};

// Variant key as adam_peers.py reads it.
std::string AdamPeerVariantKey(absl::string_view algo, absl::string_view grad, absl::string_view out);

// Runs every peer for every thread count over `variants`, printing one line
// per measurement as it goes. Never fails: a peer that is missing or breaks
// yields results with a note, and the bench goes on with the others.
std::vector<AdamPeerResult> MeasureAdamPeers(const AdamPeerOptions& options,
                                             const std::vector<std::string>& variants,
                                             const std::vector<int>& threads);

// Our measured row, to set against the peers.
struct AdamOurRow {
  std::string label;    // "adamw fp16->fp16"
  std::string variant;  // AdamPeerVariantKey
  int threads = 0;
  double elements_per_s = 0;
};

// Prints ours against every peer and the best one, and the targets
// (at 2 threads: >= 1.3x the best peer for AdamW fp32, >= 1.5x for AdamW
// fp16 grad + fp16 copy). Returns the targets as JSON for --json.
nlohmann::json PrintAdamPeerTable(const std::vector<AdamOurRow>& ours, const std::vector<AdamPeerResult>& peers);

// Every peer measurement (with versions, cpu share and why not measured) for --json.
nlohmann::json AdamPeerResultsJson(const std::vector<AdamPeerResult>& peers);

// {"torch_fused": x, "deepspeed": y, "torch_foreach": z} in elements/s, null
// where not measured.
nlohmann::json AdamPeersJson(const std::vector<AdamPeerResult>& results, const std::string& variant,
                             int threads);

// The fastest peer for the variant and thread count (elements/s; 0 if none),
// its name in `which`.
double BestAdamPeer(const std::vector<AdamPeerResult>& results, const std::string& variant, int threads,
                    std::string* which);

}  // namespace strata

#endif  // STRATA_BENCH_ADAM_PEERS_H_
