// `strata`: plan memory for a model, benchmark the tiers, inspect a daemon.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/cli_commands.h"

namespace {

using Command = int (*)(int, char**);

struct NamedCommand {
  const char* name;
  Command run;
  const char* help;
};

// `strata bench <name> ...` runs `strata-bench <name> ...`, the benchmark
// binary installed beside this one: the shipped CLI links no benchmark code,
// and a build with -DSTRATA_BUILD_BENCH=OFF has a working `strata` without it.
std::string BenchBinaryPath() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "strata-bench";
  self[n] = '\0';
  std::string path(self);
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "strata-bench" : path.substr(0, slash + 1) + "strata-bench";
}

int RunBench(int argc, char** argv) {
  std::string binary = BenchBinaryPath();
  std::vector<char*> args;
  args.push_back(binary.data());
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(binary.c_str(), args.data());
  std::fprintf(stderr,
               "strata bench: cannot run %s (%s); benchmarks are built with -DSTRATA_BUILD_BENCH=ON\n",
               binary.c_str(), std::strerror(errno));
  return 2;
}

const std::vector<NamedCommand>& TopCommands() {
  static const std::vector<NamedCommand> commands = {
      {"plan", strata::RunPlanCommand,
       "which ZeRO strategy fits a model on given hardware (strata plan --help)"},
      {"status", strata::RunStatusCommand, "is stratad running (--socket PATH)"},
      {"jobs", strata::RunJobsCommand, "the daemon's jobs"},
      {"stats", strata::RunStatsCommand, "per-tier and per-job metrics"},
      {"drain", strata::RunDrainCommand, "stop accepting jobs, finish steps, then stop the daemon"},
      {"park", strata::RunParkCommand, "JOB --tier nvme|pinned_host: push a job's shards down, free its upper tiers"},
      {"resume", strata::RunResumeCommand, "JOB: bring a parked job's shards back"},
      {"checkpoint", strata::RunCheckpointCommand, "export DIR --to FILE.pt: a checkpoint as one torch state dict"},
  };
  return commands;
}

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: strata <command> [flags]\n\ncommands:\n");
  for (const NamedCommand& c : TopCommands()) std::fprintf(out, "  %-10s %s\n", c.name, c.help);
  std::fprintf(out, "  %-10s run a benchmark (adam, io, prefetch, rpc, offload, tiers, train; strata bench help)\n",
               "bench");
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
  if (std::strcmp(argv[1], "bench") == 0) return RunBench(argc - 2, argv + 2);
  return Dispatch(TopCommands(), argc - 1, argv + 1, "command");
}
