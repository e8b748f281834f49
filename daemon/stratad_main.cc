// stratad: the per-node strata daemon.
//
// Reads its configuration (--config FILE, then flags override single fields),
// logs the settings it resolved, and serves until SIGTERM or SIGINT, when it
// stops cleanly.
#include <signal.h>

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/daemon_config.h"
#include "daemon/daemon_server.h"
#include "glog/logging.h"
#ifdef STRATA_FAULT_INJECTION
// The test-only build, stratad-faults (tests/faults/CMakeLists.txt): the
// production binary has neither this flag nor the code behind it.
#include "swap/testing/fault_plan.h"
#endif

ABSL_FLAG(std::string, config, "", "config file (protobuf text format or JSON, schema strata.v1.DaemonConfig)");
ABSL_FLAG(std::string, socket, "", "Unix socket of the control plane (overrides socket_path)");
ABSL_FLAG(std::string, nvme_path, "", "comma-separated NVMe directories (overrides nvme_paths)");
ABSL_FLAG(std::string, nvme_capacity, "", "space to preallocate per NVMe path, e.g. 64GiB");
ABSL_FLAG(std::string, device, "", "device tier: auto (cuda if a GPU is found, else emulated), cuda, emulated or none");
ABSL_FLAG(std::string, device_capacity, "", "device arena size, the sum of the jobs' device budgets, e.g. 8GiB (default 1GiB)");
ABSL_FLAG(std::string, pinned_capacity, "", "pinned host tier capacity, e.g. 32GiB");
ABSL_FLAG(std::string, io_engine, "", "auto, io_uring, libaio or psync");
ABSL_FLAG(std::string, io_block_size, "", "I/O block size, e.g. 1MiB");
ABSL_FLAG(std::string, io_queue_depth, "", "I/O queue depth");
ABSL_FLAG(std::string, fsync_policy, "", "every_commit, batched or never");
ABSL_FLAG(std::string, optimizer_threads, "", "CPU optimizer threads (0 = one per core)");
ABSL_FLAG(bool, pin_optimizer_threads, false,
          "pin each CPU optimizer worker to one CPU of the daemon's affinity set (overrides the config when set)");
ABSL_FLAG(std::string, job_worker_threads, "",
          "threads of the worker pool shared by all jobs' steps (0 = one per core, 2..64)");
ABSL_FLAG(std::string, tcp_address, "", "also listen on this loopback TCP address");
ABSL_FLAG(std::string, metrics_port, "", "serve Prometheus metrics on 127.0.0.1:PORT");
// Hardening (docs/SECURITY.md).
ABSL_FLAG(std::string, allowed_group, "", "group (by name) whose members may use the daemon");
ABSL_FLAG(std::string, admin_group, "", "group (by name) whose members manage every job");
ABSL_FLAG(std::string, tcp_token_file, "", "token file TCP callers must present (required with --tcp_address)");
ABSL_FLAG(std::string, checkpoint_root, "", "checkpoints are saved and loaded only beneath this directory");
ABSL_FLAG(std::string, checkpoint_quota, "",
          "bytes of checkpoints each non-admin user may keep (e.g. 200GiB; default: a quarter of checkpoint_root's "
          "filesystem; none: no limit)");
ABSL_FLAG(std::string, max_jobs_per_uid, "", "live jobs one uid may own (default 64)");
ABSL_FLAG(std::string, max_tensors_per_job, "", "tensors one job may register (default 65536)");
ABSL_FLAG(std::string, max_tensor_elements, "", "elements of one tensor (default 2^36)");
ABSL_FLAG(std::string, max_job_elements, "", "elements of one job (default 2^37)");
ABSL_FLAG(std::string, max_region_bytes, "", "bytes of one rank's exchange region (default 64GiB)");
ABSL_FLAG(std::string, max_name_length, "", "bytes of a tensor name (default 1024)");
ABSL_FLAG(std::string, max_world_size, "", "ranks of one job (default 4096)");
ABSL_FLAG(std::string, max_pending_waits, "", "blocking WaitStep/Acquire calls at once (default 256)");
#ifdef STRATA_FAULT_INJECTION
ABSL_FLAG(std::string, fault_plan, "", "TEST BUILD ONLY: faults to inject into one job's NVMe I/O (swap/testing/fault_plan.h)");
#endif

namespace strata {
namespace {

absl::Status ApplyUint(const std::string& text, const char* flag,
                       void (strata::v1::DaemonConfig::*set)(uint32_t), strata::v1::DaemonConfig* c) {
  if (text.empty()) return absl::OkStatus();
  uint32_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", text, ": expected a whole number"));
  }
  (c->*set)(value);
  return absl::OkStatus();
}

absl::Status ApplyUint64(const std::string& text, const char* flag,
                         void (strata::v1::DaemonConfig::*set)(uint64_t), strata::v1::DaemonConfig* c) {
  if (text.empty()) return absl::OkStatus();
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", text, ": expected a whole number"));
  }
  (c->*set)(value);
  return absl::OkStatus();
}

absl::Status ApplyHardeningFlags(strata::v1::DaemonConfig* c) {
  using C = strata::v1::DaemonConfig;
  if (auto v = absl::GetFlag(FLAGS_allowed_group); !v.empty()) c->set_allowed_group(v);
  if (auto v = absl::GetFlag(FLAGS_admin_group); !v.empty()) c->set_admin_group(v);
  if (auto v = absl::GetFlag(FLAGS_tcp_token_file); !v.empty()) c->set_tcp_token_file(v);
  if (auto v = absl::GetFlag(FLAGS_checkpoint_root); !v.empty()) c->set_checkpoint_root(v);
  if (auto v = absl::GetFlag(FLAGS_checkpoint_quota); !v.empty()) c->set_checkpoint_quota(v);
  if (auto v = absl::GetFlag(FLAGS_max_region_bytes); !v.empty()) c->set_max_region_bytes(v);
  const struct {
    std::string value;
    const char* flag;
    void (C::*set)(uint32_t);
  } u32[] = {{absl::GetFlag(FLAGS_max_jobs_per_uid), "max_jobs_per_uid", &C::set_max_jobs_per_uid},
             {absl::GetFlag(FLAGS_max_tensors_per_job), "max_tensors_per_job", &C::set_max_tensors_per_job},
             {absl::GetFlag(FLAGS_max_name_length), "max_name_length", &C::set_max_name_length},
             {absl::GetFlag(FLAGS_max_world_size), "max_world_size", &C::set_max_world_size},
             {absl::GetFlag(FLAGS_max_pending_waits), "max_pending_waits", &C::set_max_pending_waits}};
  for (const auto& f : u32) {
    if (auto s = ApplyUint(f.value, f.flag, f.set, c); !s.ok()) return s;
  }
  if (auto s = ApplyUint64(absl::GetFlag(FLAGS_max_tensor_elements), "max_tensor_elements",
                           &C::set_max_tensor_elements, c); !s.ok()) return s;
  return ApplyUint64(absl::GetFlag(FLAGS_max_job_elements), "max_job_elements", &C::set_max_job_elements, c);
}

absl::StatusOr<strata::v1::DaemonConfig> ConfigFromFlags() {
  strata::v1::DaemonConfig c;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    auto loaded = LoadDaemonConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    c = *loaded;
  }
  auto set_string = [](const std::string& value, auto setter) {
    if (!value.empty()) setter(value);
  };
  set_string(absl::GetFlag(FLAGS_socket), [&](const std::string& v) { c.set_socket_path(v); });
  set_string(absl::GetFlag(FLAGS_nvme_capacity), [&](const std::string& v) { c.set_nvme_capacity(v); });
  set_string(absl::GetFlag(FLAGS_device), [&](const std::string& v) { c.set_device(v); });
  set_string(absl::GetFlag(FLAGS_device_capacity), [&](const std::string& v) { c.set_device_capacity(v); });
  set_string(absl::GetFlag(FLAGS_pinned_capacity), [&](const std::string& v) { c.set_pinned_capacity(v); });
  set_string(absl::GetFlag(FLAGS_io_engine), [&](const std::string& v) { c.set_io_engine(v); });
  set_string(absl::GetFlag(FLAGS_io_block_size), [&](const std::string& v) { c.set_io_block_size(v); });
  set_string(absl::GetFlag(FLAGS_fsync_policy), [&](const std::string& v) { c.set_fsync_policy(v); });
  set_string(absl::GetFlag(FLAGS_tcp_address), [&](const std::string& v) { c.set_tcp_address(v); });
  if (const std::string paths = absl::GetFlag(FLAGS_nvme_path); !paths.empty()) {
    c.clear_nvme_paths();
    for (absl::string_view p : absl::StrSplit(paths, ',', absl::SkipEmpty())) c.add_nvme_paths(std::string(p));
  }
  if (auto s = ApplyUint(absl::GetFlag(FLAGS_io_queue_depth), "io_queue_depth",
                         &strata::v1::DaemonConfig::set_io_queue_depth, &c); !s.ok()) return s;
  if (auto s = ApplyUint(absl::GetFlag(FLAGS_optimizer_threads), "optimizer_threads",
                         &strata::v1::DaemonConfig::set_optimizer_threads, &c); !s.ok()) return s;
  if (absl::GetFlag(FLAGS_pin_optimizer_threads)) c.set_pin_optimizer_threads(true);
  if (auto s = ApplyUint(absl::GetFlag(FLAGS_job_worker_threads), "job_worker_threads",
                         &strata::v1::DaemonConfig::set_job_worker_threads, &c); !s.ok()) return s;
  if (auto s = ApplyUint(absl::GetFlag(FLAGS_metrics_port), "metrics_port",
                         &strata::v1::DaemonConfig::set_metrics_port, &c); !s.ok()) return s;
  if (auto s = ApplyHardeningFlags(&c); !s.ok()) return s;
  return c;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage("stratad: the strata per-node daemon. Flags override --config.");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Block the stop signals before any thread starts, so every thread inherits
  // the mask and only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto config = ConfigFromFlags();
  if (!config.ok()) {
    LOG(ERROR) << "stratad: " << config.status().message();
    return 2;
  }
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  auto settings = ResolveDaemonSettings(*config, runtime_dir == nullptr ? "" : runtime_dir);
  if (!settings.ok()) {
    LOG(ERROR) << "stratad: invalid configuration: " << settings.status().message();
    return 2;
  }
  LOG(INFO) << "stratad starting with configuration:\n" << DescribeDaemonSettings(*settings);
  const IoEngineDecorator* io_decorator = nullptr;
#ifdef STRATA_FAULT_INJECTION
  std::unique_ptr<FaultPlanEngines> faults;
  IoEngineDecorator fault_decorator;
  if (const std::string text = absl::GetFlag(FLAGS_fault_plan); !text.empty()) {
    auto plan = ParseFaultPlan(text);
    if (!plan.ok()) {
      LOG(ERROR) << "stratad: " << plan.status().message();
      return 2;
    }
    faults = std::make_unique<FaultPlanEngines>(*plan);
    fault_decorator.result_hook = faults->result_hook();
    fault_decorator.wrap = [&faults](std::unique_ptr<IoEngine> inner) { return faults->Wrap(std::move(inner)); };
    io_decorator = &fault_decorator;
    LOG(WARNING) << "stratad: FAULT INJECTION (test build): " << plan->description;
  }
#endif
  auto server = DaemonServer::Create(*settings, *config, [](const std::string& line) {
    LOG(INFO) << "stratad: " << line;
  }, io_decorator);
  if (!server.ok()) {
    LOG(ERROR) << "stratad: cannot start: " << server.status().message();
    return 1;
  }
  for (const std::string& choice : (*server)->startup_choices()) LOG(INFO) << "stratad: " << choice;
  if (absl::Status s = (*server)->Start(); !s.ok()) {
    LOG(ERROR) << "stratad: cannot serve: " << s.message();
    return 1;
  }
  LOG(INFO) << "stratad ready (pid " << getpid() << ") on " << settings->socket_path;

  // Wait for SIGTERM/SIGINT, or for a Drain request.
  int received = 0;
  const timespec poll_interval{0, 200 * 1000 * 1000};
  while (true) {
    siginfo_t info;
    int sig = sigtimedwait(&stop_signals, &info, &poll_interval);
    if (sig > 0) {
      received = sig;
      break;
    }
    if ((*server)->drain_requested()) break;
  }
  LOG(INFO) << "stratad: " << (received == SIGTERM ? "received SIGTERM" : received == SIGINT ? "received SIGINT" : "drain requested")
            << ", stopping: no new jobs or attaches, finishing in-flight steps, flushing NVMe";
  (*server)->Stop();
#ifdef STRATA_FAULT_INJECTION
  if (faults != nullptr) LOG(INFO) << "stratad: " << faults->Summary();
#endif
  LOG(INFO) << "stratad stopped cleanly";
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
