#include "daemon/daemon_server.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/byte_size.h"
#include "daemon/daemon_stats.h"
#include "daemon/job_recovery.h"
#include "daemon/strata_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_posix.h"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"

namespace strata {
namespace {

// The largest control message a client may send: tensor lists of big models
// run to a few hundred KiB; anything larger is refused.
constexpr int kMaxMessageBytes = 4 << 20;

// The CPUs this process may run on, in order: the optimizer's workers are
// pinned round-robin over them (pin_optimizer_threads), so a daemon started
// under taskset or a cgroup cpuset keeps to its set.
absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("pin_optimizer_threads: sched_getaffinity failed: ", strerror(errno)));
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  if (cpus.empty()) return absl::InternalError("pin_optimizer_threads: the affinity set is empty");
  return cpus;
}

}  // namespace

DaemonServer::DaemonServer(const DaemonSettings& settings, Logger log)
    : settings_(settings), log_(std::move(log)) {}

absl::StatusOr<std::unique_ptr<DaemonServer>> DaemonServer::Create(const DaemonSettings& settings,
                                                                   const strata::v1::DaemonConfig& config,
                                                                   Logger log,
                                                                   const IoEngineDecorator* io_decorator) {
  std::unique_ptr<DaemonServer> server(new DaemonServer(settings, std::move(log)));
  CpuOptimizerOptions opt;
  opt.num_threads = static_cast<int>(settings.optimizer_threads);
  std::string pinning;
  if (settings.pin_optimizer_threads) {
    auto cpus = AllowedCpus();
    if (!cpus.ok()) return cpus.status();
    opt.pin_cpus = std::move(*cpus);
    pinning = absl::StrCat(", workers pinned to CPUs ", absl::StrJoin(opt.pin_cpus, ","));
  }
  auto optimizer = CpuOptimizer::Create(opt);
  if (!optimizer.ok()) return optimizer.status();
  server->optimizer_ = std::move(*optimizer);
  server->choices_.push_back(absl::StrCat("cpu optimizer: ", settings.optimizer_threads, " threads", pinning,
                                          ", kernels ", CpuOptimizer::KernelTarget()));
  auto device = DeviceArena::Create(settings.device, settings.device_capacity_bytes, &server->choices_);
  if (!device.ok()) return device.status();
  server->device_ = std::move(*device);
  if (!settings.nvme_paths.empty()) {
    auto nvme = OpenNvmeTier(settings, io_decorator, &server->choices_);
    if (!nvme.ok()) return nvme.status();
    server->nvme_parts_ = std::move(*nvme);
    server->nvme_ = server->nvme_parts_.store.get();
  } else {
    server->choices_.push_back("nvme tier: off (no --nvme_path); MODE_INFINITY jobs are refused");
  }
  if (!settings.allowed_group.empty()) {
    group* g = getgrnam(settings.allowed_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("allowed_group '", settings.allowed_group, "' does not exist"));
    }
    server->allowed_gid_ = g->gr_gid;
  }
  gid_t admin_gid = static_cast<gid_t>(-1);
  if (!settings.admin_group.empty()) {
    group* g = getgrnam(settings.admin_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("admin_group '", settings.admin_group, "' does not exist"));
    }
    admin_gid = g->gr_gid;
  }
  server->admins_ = std::make_unique<AdminPolicy>(geteuid(), admin_gid);
  std::optional<TcpToken> tcp_token;
  if (!settings.tcp_address.empty()) {
    // ResolveDaemonSettings refused TCP without a token file; here the file
    // itself must be private.
    auto token = LoadTcpToken(settings.tcp_token_file);
    if (!token.ok()) return token.status();
    tcp_token = std::move(*token);
    server->choices_.push_back(absl::StrCat("tcp: ", settings.tcp_address, " (token of ", settings.tcp_token_file,
                                            ", callers act as uid ", tcp_token->owner, ")"));
  }
  server->callers_ = std::make_unique<CallerResolver>(&server->peers_, std::move(tcp_token), server->admins_.get());
  server->pinned_ = std::make_unique<PinnedBudget>(settings.pinned_capacity_bytes);
  auto job_workers = ThreadPoolExecutor::Create(static_cast<int>(settings.job_worker_threads));
  if (!job_workers.ok()) return job_workers.status();
  server->job_workers_ = std::move(*job_workers);
  server->choices_.push_back(
      absl::StrCat("job workers: ", settings.job_worker_threads, " threads, shared by every job"));
  auto doorbells = DoorbellHub::Create();
  if (!doorbells.ok()) return doorbells.status();
  server->doorbells_ = std::move(*doorbells);
  server->choices_.push_back(
      "per-bucket signals: doorbell (shared-memory ring + eventfd, one poller thread); gRPC for control and "
      "as fallback");
  JobServices services;
  services.workers = server->job_workers_.get();
  services.optimizer = server->optimizer_.get();
  services.nvme = server->nvme_;
  services.limits = &server->settings_.limits;
  services.pinned = server->pinned_.get();
  services.doorbells = server->doorbells_.get();
  services.device = server->device_ != nullptr ? server->device_->tier() : nullptr;
  if (server->nvme_ != nullptr) {
    // Every Infinity job's params: one TieredStore over the device tier (when
    // the daemon has one), the jobs' windows and the NVMe homes.
    ParamStoreOptions param_options;
    param_options.pinned_capacity_bytes = settings.pinned_capacity_bytes;
    auto params = ParamStore::Create(server->nvme_, services.device, param_options);
    if (!params.ok()) return params.status();
    server->params_ = std::move(*params);
    services.params = server->params_.get();
    server->choices_.push_back(absl::StrCat("params (infinity): one tiered store for every job, tiers ",
                                            services.device != nullptr ? "device | " : "",
                                            "pinned windows | nvme, ", param_options.io_threads, " transfer threads"));
  }
  server->registry_ = std::make_unique<JobRegistry>(services, &server->clock_, settings.lease_timeout,
                                                    settings.reattach_timeout, settings.limits.max_jobs_per_uid);
  server->fd_socket_path_ = settings.socket_path + ".fd";
  ServiceContext ctx;
  ctx.registry = server->registry_.get();
  ctx.services = services;
  ctx.effective_config = config;
  ctx.startup_choices = server->choices_;
  ctx.fd_socket_path = server->fd_socket_path_;
  ctx.lease_timeout = settings.lease_timeout;
  ctx.callers = server->callers_.get();
  ctx.limits = settings.limits;
  ctx.checkpoint_root = settings.checkpoint_root;
  server->checkpoint_quota_ = std::make_unique<CheckpointQuota>(settings.checkpoint_quota_bytes);
  ctx.checkpoint_quota = server->checkpoint_quota_.get();
  ctx.daemon_uid = geteuid();
  DaemonServer* self = server.get();
  ctx.drain = [self] {
    self->registry_->StartDraining();
    self->drain_requested_ = true;
  };
  ctx.tier_stats = [self] { return CollectTierStats(self->nvme_, *self->pinned_, self->device_.get()); };
  ctx.device = server->device_.get();
  server->service_ = std::make_unique<StrataService>(std::move(ctx));
  server->fd_handoff_ = std::make_unique<FdHandoffServer>(
      server->registry_.get(), server->admins_.get(), [self](int fd) { return self->PeerAllowed(fd); },
      server->log_, server->device_.get());
  if (server->nvme_ != nullptr) {
    // ZeRO-Infinity jobs of an earlier run: their records are on NVMe.
    std::vector<std::string> recovery;
    absl::Status recovered = RecoverJobs(server->nvme_, services, server->registry_.get(), &recovery);
    server->choices_.insert(server->choices_.end(), recovery.begin(), recovery.end());
    if (!recovered.ok()) return recovered;
  }
  return server;
}

DaemonServer::~DaemonServer() { Stop(); }

absl::Status DaemonServer::Start() {
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  if (!settings_.tcp_address.empty()) {
    // TCP has no peer credentials: it is for a trusted host's own ranks, and
    // only on loopback unless the operator names another address.
    builder.AddListeningPort(settings_.tcp_address, grpc::InsecureServerCredentials());
  }
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr) return absl::InternalError("gRPC server failed to start");
  auto grpc_fd = ListenUnix(settings_.socket_path, allowed_gid_ == static_cast<gid_t>(-1) ? 0600 : 0660, allowed_gid_);
  if (!grpc_fd.ok()) return grpc_fd.status();
  grpc_listener_ = std::move(*grpc_fd);
  if (absl::Status s = fd_handoff_->Start(fd_socket_path_, allowed_gid_ == static_cast<gid_t>(-1) ? 0600 : 0660,
                                          allowed_gid_);
      !s.ok()) {
    return s;
  }
  threads_.emplace_back([this] { AcceptLoop(); });
  threads_.emplace_back([this] { ExpiryLoop(); });
  if (settings_.metrics_port != 0) {
    auto metrics = MetricsServer::Start(static_cast<uint16_t>(settings_.metrics_port),
                                        [this] { return RenderMetrics(*registry_, nvme_, *pinned_, device_.get()); });
    if (!metrics.ok()) return metrics.status();
    metrics_ = std::move(*metrics);
  }
  return absl::OkStatus();
}

std::optional<PeerCredentials> DaemonServer::PeerAllowed(int fd) {
  auto peer = GetPeerCredentials(fd);
  if (!peer.ok()) {
    log_(absl::StrCat("refusing a connection: ", peer.status().message()));
    return std::nullopt;
  }
  if (!PeerMayAttach(*peer, geteuid(), allowed_gid_)) {
    log_(absl::StrCat("refusing a connection from pid ", peer->pid, " uid ", peer->uid,
                      ": only uid ", geteuid(),
                      settings_.allowed_group.empty() ? "" : absl::StrCat(" or group ", settings_.allowed_group),
                      " may attach"));
    return std::nullopt;
  }
  return *peer;
}

void DaemonServer::AcceptLoop() {
  const int listen_fd = grpc_listener_.get();
  while (!stopping_) {
    pollfd pfd{listen_fd, POLLIN, 0};
    int rc = poll(&pfd, 1, 200);
    if (rc <= 0) continue;
    UniqueFd conn(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    const std::optional<PeerCredentials> peer = PeerAllowed(conn.get());
    if (!peer.has_value()) continue;  // closing is the refusal
    // gRPC names this connection "fd:<n>"; its handlers find the caller's
    // uid under that number (daemon/caller.h).
    peers_.Set(conn.get(), *peer);
    // gRPC's event engine expects a non-blocking socket.
    fcntl(conn.get(), F_SETFL, fcntl(conn.get(), F_GETFL) | O_NONBLOCK);
    grpc::AddInsecureChannelFromFd(grpc_server_.get(), conn.release());
  }
}

void DaemonServer::ExpiryLoop() {
  while (!stopping_) {
    for (int i = 0; i < 10 && !stopping_; ++i) usleep(100 * 1000);
    for (const std::string& line : registry_->Expire()) log_(line);
  }
}

void DaemonServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (registry_ != nullptr) registry_->StartDraining();
  metrics_.reset();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  if (fd_handoff_ != nullptr) fd_handoff_->Stop();
  // Jobs finish the step whose gradients are in, then their workers stop;
  // then the RPCs still waiting are answered and the server closes.
  if (registry_ != nullptr) {
    for (const auto& job : registry_->Jobs()) job->Stop();
  }
  if (grpc_server_ != nullptr) grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (nvme_ != nullptr) {
    // What a job wrote and did not commit (a step that failed, params not
    // yet initialized by every rank) is dropped, as a crash would: Sync
    // below must not make it durable.
    if (registry_ != nullptr) {
      for (const auto& job : registry_->Jobs()) nvme_->Rollback(job->id());
    }
    absl::Status s = nvme_->Sync();
    if (!s.ok()) log_(absl::StrCat("flushing the NVMe tier failed: ", s.message()));
  }
  unlink(settings_.socket_path.c_str());
}

}  // namespace strata
