// `strata`: plan memory for a model, benchmark the tiers, inspect a daemon.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/adam_bench.h"
#include "bench/io_bench.h"
#include "bench/offload_bench.h"
#include "bench/prefetch_bench.h"
#include "bench/rpc_bench.h"
#include "daemon/cli_commands.h"

namespace {

using Command = int (*)(int, char**);

struct NamedCommand {
  const char* name;
  Command run;
  const char* help;
};

// `strata bench <name> ...`: each benchmark lives in bench/ and is linked in here.
const std::vector<NamedCommand>& BenchCommands() {
  static const std::vector<NamedCommand> commands = {
      {"adam", strata::RunAdamBench,
       "CPU optimizer step vs memory bandwidth and torch AdamW (strata bench adam --help)"},
      {"io", strata::RunIoBench, "NVMe engines vs fio, ExtentStore swap path, --tune (strata bench io --help)"},
      {"prefetch", strata::RunPrefetchBench,
       "trace replay: LRU vs predictor vs Belady MIN, --real (strata bench prefetch --help)"},
      {"rpc", strata::RunRpcBench,
       "stratad call latency, concurrent clients, gradient hand-off vs memcpy (strata bench rpc --help)"},
      {"offload", strata::RunOffloadBench,
       "daemon optimizer step vs optimizer and NVMe alone: overlap (strata bench offload --help)"},
  };
  return commands;
}

const std::vector<NamedCommand>& TopCommands() {
  static const std::vector<NamedCommand> commands = {
      {"plan", strata::RunPlanCommand,
       "which ZeRO strategy fits a model on given hardware (strata plan --help)"},
      {"status", strata::RunStatusCommand, "is stratad running (--socket PATH)"},
      {"jobs", strata::RunJobsCommand, "the daemon's jobs"},
      {"stats", strata::RunStatsCommand, "per-tier and per-job metrics"},
      {"drain", strata::RunDrainCommand, "stop accepting jobs, finish steps, then stop the daemon"},
  };
  return commands;
}

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: strata <command> [flags]\n\ncommands:\n");
  for (const NamedCommand& c : TopCommands()) std::fprintf(out, "  %-10s %s\n", c.name, c.help);
  std::fprintf(out, "  %-10s run a benchmark:\n", "bench");
  for (const NamedCommand& c : BenchCommands()) std::fprintf(out, "    %-8s %s\n", c.name, c.help);
}

int Dispatch(const std::vector<NamedCommand>& commands, int argc, char** argv,
             const char* what) {
  for (const NamedCommand& c : commands) {
    if (std::strcmp(argv[0], c.name) == 0) return c.run(argc, argv);
  }
  std::fprintf(stderr, "strata: unknown %s '%s'; run 'strata help' for the list\n", what, argv[0]);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "bench") == 0) {
    if (argc < 3) {
      std::fprintf(stderr, "strata bench: name a benchmark; run 'strata help' for the list\n");
      return 2;
    }
    return Dispatch(BenchCommands(), argc - 2, argv + 2, "benchmark");
  }
  return Dispatch(TopCommands(), argc - 1, argv + 1, "command");
}
