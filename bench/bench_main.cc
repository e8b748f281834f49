// `strata-bench`: every benchmark behind one binary; `strata bench <name>`
// runs it. Kept out of the shipped `strata` and `stratad` binaries.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/adam_bench.h"
#include "bench/io_bench.h"
#include "bench/offload_bench.h"
#include "bench/plot_runner.h"
#include "bench/prefetch_bench.h"
#include "bench/rpc_bench.h"
#include "bench/tiers_bench.h"
#include "bench/train_bench.h"

namespace {

struct NamedBench {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

const std::vector<NamedBench>& Benches() {
  static const std::vector<NamedBench> benches = {
      {"adam", strata::RunAdamBench,
       "CPU optimizer step vs memory bandwidth and torch AdamW (strata bench adam --help)"},
      {"io", strata::RunIoBench, "NVMe engines vs fio, ExtentStore swap path, --tune (strata bench io --help)"},
      {"prefetch", strata::RunPrefetchBench,
       "trace replay: LRU vs predictor vs Belady MIN, --real (strata bench prefetch --help)"},
      {"rpc", strata::RunRpcBench,
       "stratad call latency, concurrent clients, gradient hand-off vs memcpy (strata bench rpc --help)"},
      {"offload", strata::RunOffloadBench,
       "daemon optimizer step vs optimizer and NVMe alone: overlap (strata bench offload --help)"},
      {"tiers", strata::RunTiersBench,
       "pinned <-> device <-> NVMe bandwidth vs cudaMemcpy and the raw engine (strata bench tiers --help)"},
      {"train", strata::RunTrainBench,
       "a ~100M GPT: torch AdamW, DeepSpeed offload/Infinity, strata offload (strata bench train --help)"},
  };
  return benches;
}

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: strata bench <name> [flags]\n\nbenchmarks:\n");
  for (const NamedBench& b : Benches()) std::fprintf(out, "  %-9s %s\n", b.name, b.help);
  std::fprintf(out, "\nadam, io, prefetch and rpc also take --plot FILE.png (drawn by bench/plot.py from their "
                    "--json)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "strata bench: name a benchmark; run 'strata bench help' for the list\n");
    return 2;
  }
  if (std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    PrintUsage(stdout);
    return 0;
  }
  for (const NamedBench& b : Benches()) {
    if (std::strcmp(argv[1], b.name) != 0) continue;
    // --plot FILE.png (adam, io, prefetch, rpc): run with --json, then draw it.
    std::vector<std::string> args(argv + 1, argv + argc);
    absl::StatusOr<std::optional<strata::PlotRequest>> plot = strata::TakePlotFlag(&args);
    if (!plot.ok()) {
      std::fprintf(stderr, "strata bench %s: %s\n", b.name, std::string(plot.status().message()).c_str());
      return 2;
    }
    if (!plot->has_value()) return b.run(argc - 1, argv + 1);
    if (std::strcmp(b.name, "offload") == 0 || std::strcmp(b.name, "train") == 0) {
      std::fprintf(stderr, "strata bench %s: --plot is for adam, io, prefetch and rpc\n", b.name);
      return 2;
    }
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    const int rc = b.run(static_cast<int>(args.size()), cargs.data());
    if (rc != 0) return rc;
    const absl::Status drawn = strata::DrawPlot(b.name, **plot);
    if (!drawn.ok()) {
      std::fprintf(stderr, "strata bench %s: %s\n", b.name, std::string(drawn.message()).c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "strata bench: unknown benchmark '%s'; run 'strata bench help' for the list\n",
               argv[1]);
  return 2;
}
