// DaemonServer: the composition root of stratad. From DaemonSettings it
// builds the CPU optimizer pool, the I/O engine (io_uring -> libaio -> psync,
// probed once) and the NVMe extent store, the job registry and the gRPC
// service, and serves two Unix sockets:
//   <socket>     gRPC control plane; each accepted connection's peer uid is
//                checked (SO_PEERCRED) before gRPC sees it;
//   <socket>.fd  shared-memory hand-off: a rank sends its one-time token and
//                receives its exchange region's memfd (SCM_RIGHTS), and with
//                "<token> doorbell" also its doorbell page and eventfd.
// It logs nothing itself: startup_choices() says what it chose, and Run's
// caller logs.
#ifndef STRATA_DAEMON_DAEMON_SERVER_H_
#define STRATA_DAEMON_DAEMON_SERVER_H_

#include <atomic>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/unix_socket.h"
#include "daemon/caller.h"
#include "daemon/checkpoint_quota.h"
#include "daemon/daemon_config.h"
#include "daemon/device_arena.h"
#include "daemon/fd_handoff.h"
#include "daemon/job_registry.h"
#include "daemon/metrics_server.h"
#include "daemon/nvme_tier_setup.h"
#include "daemon/param_store.h"
#include "daemon/pinned_budget.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "tiers/transfer_executor.h"

namespace grpc {
class Server;
}

namespace strata {

class IoEngine;
class ExtentStore;
class StrataService;

class DaemonServer {
 public:
  using Logger = std::function<void(const std::string&)>;
  // `io_decorator` (borrowed, may be null; must outlive the server): see
  // IoEngineDecorator.
  static absl::StatusOr<std::unique_ptr<DaemonServer>> Create(const DaemonSettings& settings,
                                                              const strata::v1::DaemonConfig& config,
                                                              Logger log,
                                                              const IoEngineDecorator* io_decorator = nullptr);
  ~DaemonServer();

  const std::vector<std::string>& startup_choices() const { return choices_; }
  // Starts serving; returns once the sockets accept connections.
  absl::Status Start();
  // Graceful stop: refuse new jobs and attaches, finish steps whose
  // gradients are in, commit the NVMe manifest, close the sockets.
  void Stop();
  // Set by the Drain RPC; the main thread polls it.
  bool drain_requested() const { return drain_requested_.load(); }

 private:
  DaemonServer(const DaemonSettings& settings, Logger log);
  // Accepts gRPC connections on the Unix socket after checking the peer.
  void AcceptLoop();
  // The peer's credentials when it may use the daemon; nullopt (logged) if not.
  std::optional<PeerCredentials> PeerAllowed(int fd);
  void ExpiryLoop();

  const DaemonSettings settings_;
  Logger log_;
  std::vector<std::string> choices_;
  RealClock clock_;
  std::unique_ptr<CpuOptimizer> optimizer_;
  NvmeTierParts nvme_parts_;      // empty without --nvme_path
  ExtentStore* nvme_ = nullptr;  // nvme_parts_.store, or null
  // Hardening (docs/SECURITY.md): who calls, and the pinned memory budget.
  // Declared before the registry: jobs give their pinned reservation back
  // when destroyed, so the budget must outlive them.
  PeerTable peers_;
  std::unique_ptr<AdminPolicy> admins_;
  std::unique_ptr<CheckpointQuota> checkpoint_quota_;
  std::unique_ptr<CallerResolver> callers_;
  std::unique_ptr<PinnedBudget> pinned_;
  // The device tier (nullptr with --device none); before the registry, as
  // jobs hold slots in it.
  std::unique_ptr<DeviceArena> device_;
  // Runs every job's steps; declared before the registry, so the jobs (whose
  // Stop waits for their last turn) are gone before the pool joins.
  std::unique_ptr<ThreadPoolExecutor> job_workers_;
  // Per-bucket signals (daemon/doorbell.h): before the registry, since jobs
  // leave the hub when they are destroyed.
  std::unique_ptr<DoorbellHub> doorbells_;
  // The one tiered store of every Infinity job's params (daemon/param_store.h):
  // before the registry, since jobs take their shards out of it when destroyed.
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<StrataService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<MetricsServer> metrics_;
  // The <socket>.fd hand-offs; declared after the registry it borrows.
  std::unique_ptr<FdHandoffServer> fd_handoff_;
  UniqueFd grpc_listener_;
  std::string fd_socket_path_;
  gid_t allowed_gid_ = static_cast<gid_t>(-1);
  std::atomic<bool> stopping_{false};
  std::atomic<bool> drain_requested_{false};
  std::vector<std::thread> threads_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_DAEMON_SERVER_H_
