// `strata status|jobs|stats|drain`: talk to a running stratad.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/strata_client.h"
#include "core/command_line.h"
#include "cli/cli_commands.h"

namespace strata {
namespace {

std::string DefaultSocket() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  return runtime != nullptr && *runtime != '\0' ? absl::StrCat(runtime, "/strata/stratad.sock")
                                                : "/run/strata/stratad.sock";
}

// Parses --socket, connects; prints one line and returns 2 or 1 on failure.
int WithClient(const char* command, int argc, char** argv,
               int (*run)(StrataClient& client, const CommandLine& flags)) {
  std::string socket = DefaultSocket();
  CommandLine flags(absl::StrCat("strata ", command));
  flags.AddString("socket", &socket, "stratad's Unix socket (default $XDG_RUNTIME_DIR/strata/stratad.sock)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "strata %s: %s\n", command, std::string(s.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  ClientOptions options;
  options.socket_path = socket;
  options.rpc_timeout = absl::Seconds(10);
  auto client = StrataClient::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "strata %s: %s\n", command, std::string(client.status().message()).c_str());
    return 1;
  }
  return run(**client, flags);
}

}  // namespace

int RunJobsCommand(int argc, char** argv) {
  return WithClient("jobs", argc, argv, [](StrataClient& client, const CommandLine&) {
    auto jobs = client.ListJobs();
    if (!jobs.ok()) {
      std::fprintf(stderr, "strata jobs: %s\n", std::string(jobs.status().message()).c_str());
      return 1;
    }
    std::printf("%-6s %-20s %6s %9s %8s %12s\n", "id", "name", "world", "attached", "step", "loss_scale");
    for (const JobSummary& j : *jobs) {
      std::printf("%-6llu %-20s %6u %9u %8llu %12g\n", static_cast<unsigned long long>(j.job_id), j.name.c_str(),
                  j.world_size, j.attached_ranks, static_cast<unsigned long long>(j.step), j.loss_scale);
    }
    return 0;
  });
}

int RunStatsCommand(int argc, char** argv) {
  return WithClient("stats", argc, argv, [](StrataClient& client, const CommandLine&) {
    auto text = client.StatsText();
    if (!text.ok()) {
      std::fprintf(stderr, "strata stats: %s\n", std::string(text.status().message()).c_str());
      return 1;
    }
    std::printf("%s", text->c_str());
    return 0;
  });
}

int RunStatusCommand(int argc, char** argv) {
  return WithClient("status", argc, argv, [](StrataClient& client, const CommandLine&) {
    auto jobs = client.ListJobs();
    if (!jobs.ok()) {
      std::fprintf(stderr, "strata status: %s\n", std::string(jobs.status().message()).c_str());
      return 1;
    }
    std::printf("stratad is running; %zu job(s)\n", jobs->size());
    return 0;
  });
}

int RunDrainCommand(int argc, char** argv) {
  return WithClient("drain", argc, argv, [](StrataClient& client, const CommandLine&) {
    absl::Status s = client.Drain();
    if (!s.ok()) {
      std::fprintf(stderr, "strata drain: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::printf("stratad is draining: no new jobs or attaches; it stops after in-flight steps\n");
    return 0;
  });
}

}  // namespace strata
