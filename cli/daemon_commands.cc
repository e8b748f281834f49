// `strata status|jobs|stats|drain|park|resume`: talk to a running stratad.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/strata_client.h"
#include "core/command_line.h"
#include "core/tier_kind.h"
#include "cli/cli_commands.h"

namespace strata {
namespace {

std::string FormatBytesText(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  if (bytes >= (1ull << 20)) return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / (1ull << 20));
  return absl::StrFormat("%llu B", static_cast<unsigned long long>(bytes));
}

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

// Connects to `socket` (a message and nullptr on failure).
std::unique_ptr<StrataClient> ConnectOrSay(const char* command, const std::string& socket, absl::Duration rpc_timeout) {
  ClientOptions options;
  options.socket_path = socket;
  options.rpc_timeout = rpc_timeout;
  options.step_timeout = absl::Minutes(30);  // a park of a large job moves all of it
  auto client = StrataClient::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "strata %s: %s\n", command, std::string(client.status().message()).c_str());
    return nullptr;
  }
  return std::move(*client);
}

void PrintParkResult(const char* what, const std::string& job, const ParkResult& r) {
  const double gb_s = r.bytes_per_second() / 1e9;
  std::printf("%s job '%s': %llu shards, %llu bytes (%s) in %.6f s = %.3f GB/s; its shards are now at most in %s\n",
              what, job.c_str(), static_cast<unsigned long long>(r.shards), static_cast<unsigned long long>(r.bytes),
              FormatBytesText(r.bytes).c_str(), r.seconds, gb_s, std::string(TierKindName(r.tier)).c_str());
}

}  // namespace

int RunParkCommand(int argc, char** argv) {
  std::string socket = DefaultSocket();
  std::string tier_text = "nvme";
  CommandLine flags("strata park JOB");
  flags.AddString("socket", &socket, "stratad's Unix socket (default $XDG_RUNTIME_DIR/strata/stratad.sock)");
  flags.AddString("tier", &tier_text, "where the job's shards go: nvme (default) or pinned_host");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "strata park: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "strata park: expected one job name (strata park JOB --tier nvme|pinned_host)\n");
    return 2;
  }
  auto tier = ParseTierKind(tier_text);
  if (!tier.ok() || *tier == TierKind::kDevice) {
    std::fprintf(stderr, "strata park: --tier '%s' is not valid; expected nvme or pinned_host\n", tier_text.c_str());
    return 2;
  }
  auto client = ConnectOrSay("park", socket, absl::Seconds(10));
  if (client == nullptr) return 1;
  const std::string job = flags.positional()[0];
  auto result = client->ParkJob(job, *tier);
  if (!result.ok()) {
    std::fprintf(stderr, "strata park: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  PrintParkResult("parked", job, *result);
  return 0;
}

int RunResumeCommand(int argc, char** argv) {
  std::string socket = DefaultSocket();
  CommandLine flags("strata resume JOB");
  flags.AddString("socket", &socket, "stratad's Unix socket (default $XDG_RUNTIME_DIR/strata/stratad.sock)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "strata resume: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "strata resume: expected one job name (strata resume JOB)\n");
    return 2;
  }
  auto client = ConnectOrSay("resume", socket, absl::Seconds(10));
  if (client == nullptr) return 1;
  const std::string job = flags.positional()[0];
  auto result = client->ResumeJob(job);
  if (!result.ok()) {
    std::fprintf(stderr, "strata resume: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  PrintParkResult("resumed", job, *result);
  return 0;
}

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
    // The tiers' capacity and use (device: the arena, --device_capacity).
    auto tiers = client.Tiers();
    if (!tiers.ok()) {
      std::fprintf(stderr, "strata status: %s\n", std::string(tiers.status().message()).c_str());
      return 1;
    }
    for (const TierUsage& t : *tiers) {
      std::printf("  %-8s used %s of %s\n", t.tier.c_str(), FormatBytesText(t.used_bytes).c_str(),
                  t.capacity_bytes == 0 ? "unlimited" : FormatBytesText(t.capacity_bytes).c_str());
    }
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
