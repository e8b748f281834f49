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
// I/O lanes of the NVMe extent store: a job's tile load and save plus its
// param reads, for a few jobs at once.
constexpr int kNvmeIoLanes = 4;

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
  server->choices_.push_back(settings.device == DeviceChoice::kCuda
                                 ? "device tier: cuda requested (trainers own the GPU copies in this version)"
                                 : "device tier: emulated (trainers own the GPU copies in this version)");
  if (!settings.nvme_paths.empty()) {
    for (const std::string& path : settings.nvme_paths) {
      std::error_code ec;
      std::filesystem::create_directories(path, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            absl::StrCat("nvme path ", path, " cannot be created: ", ec.message()));
      }
    }
    IoEngineOptions io;
    io.queue_depth = settings.io_queue_depth;
    io.block_size_bytes = settings.io_block_size;
    io.sqpoll = settings.io_sqpoll;
    if (io_decorator != nullptr) io.result_hook = io_decorator->result_hook;
    std::optional<IoEngineKind> forced;
    switch (settings.io_engine) {
      case IoEngineChoice::kUring: forced = IoEngineKind::kUring; break;
      case IoEngineChoice::kAio: forced = IoEngineKind::kAio; break;
      case IoEngineChoice::kPsync: forced = IoEngineKind::kPsync; break;
      case IoEngineChoice::kAuto: break;
    }
    std::vector<std::string> notes;
    auto engine = OpenIoEngine(io, forced, &notes);
    if (!engine.ok()) return engine.status();
    server->engine_ = std::move(*engine);
    if (io_decorator != nullptr && io_decorator->wrap) server->engine_ = io_decorator->wrap(std::move(server->engine_));
    for (const std::string& n : notes) server->choices_.push_back(absl::StrCat("io engine: ", n));
    for (const std::string& n : server->engine_->info().notes) server->choices_.push_back(absl::StrCat("io engine: ", n));
    server->choices_.push_back(absl::StrCat("io engine: ", server->engine_->info().name, " (depth ",
                                            server->engine_->info().queue_depth, ", block ",
                                            FormatBytes(server->engine_->info().block_size_bytes), ")"));
    ExtentStoreOptions store;
    store.paths = settings.nvme_paths;
    store.capacity_bytes_per_path = settings.nvme_capacity_bytes;
    store.allow_buffered_fallback = true;
    store.sync_policy = settings.fsync_policy == FsyncPolicy::kEveryCommit ? SyncPolicy::kEveryCommit
                        : settings.fsync_policy == FsyncPolicy::kBatched   ? SyncPolicy::kBatched
                                                                           : SyncPolicy::kNever;
    std::vector<IoEngine*> lanes = {server->engine_.get()};
    for (int i = 1; i < kNvmeIoLanes; ++i) {
      std::vector<std::string> ignored;  // the first engine's notes said it all
      // The same kind as the first engine, whatever chose it.
      auto kind = ParseIoEngineKind(server->engine_->info().name);
      if (!kind.ok()) return kind.status();
      auto lane = OpenIoEngine(io, *kind, &ignored);
      if (!lane.ok()) return lane.status();
      if (io_decorator != nullptr && io_decorator->wrap) *lane = io_decorator->wrap(std::move(*lane));
      lanes.push_back(lane->get());
      server->lane_engines_.push_back(std::move(*lane));
    }
    auto nvme = ExtentStore::Open(store, absl::MakeConstSpan(lanes));
    if (!nvme.ok()) {
      return absl::Status(nvme.status().code(),
                          absl::StrCat("opening the NVMe tier: ", nvme.status().message()));
    }
    server->nvme_ = std::move(*nvme);
    for (const std::string& w : server->nvme_->warnings()) server->choices_.push_back(absl::StrCat("nvme: ", w));
    server->choices_.push_back(absl::StrCat("nvme tier: ", server->nvme_->Stats().shard_count,
                                            " shards found, ", FormatBytes(server->nvme_->Stats().capacity_bytes),
                                            " capacity"));
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
  DoorbellHub::Options doorbell_options;
  doorbell_options.slice = settings.doorbell_slice;
  auto doorbells = DoorbellHub::Create(doorbell_options);
  if (!doorbells.ok()) return doorbells.status();
  server->doorbells_ = std::move(*doorbells);
  server->choices_.push_back(absl::StrCat(
      "per-bucket signals: doorbell (shared-memory ring + eventfd, one poller thread, scheduler slice ",
      settings.doorbell_slice == absl::ZeroDuration() ? "kernel default" : absl::FormatDuration(settings.doorbell_slice),
      "); gRPC for control and as fallback"));
  JobServices services;
  services.workers = server->job_workers_.get();
  services.optimizer = server->optimizer_.get();
  services.nvme = server->nvme_.get();
  services.limits = &server->settings_.limits;
  services.pinned = server->pinned_.get();
  services.doorbells = server->doorbells_.get();
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
  DaemonServer* self = server.get();
  ctx.drain = [self] {
    self->registry_->StartDraining();
    self->drain_requested_ = true;
  };
  ctx.tier_stats = [self] {
    std::vector<strata::v1::TierStats> tiers;
    if (self->nvme_ != nullptr) {
      const ExtentStoreStats s = self->nvme_->Stats();
      strata::v1::TierStats t;
      t.set_tier("nvme");
      t.set_capacity_bytes(s.capacity_bytes);
      t.set_used_bytes(s.used_bytes);
      tiers.push_back(t);
    }
    // What jobs reserved of --pinned_capacity (regions, host states, NVMe
    // staging); back to 0 when every job is gone.
    strata::v1::TierStats pinned;
    pinned.set_tier("pinned");
    pinned.set_capacity_bytes(self->pinned_->capacity());
    pinned.set_used_bytes(self->pinned_->used());
    tiers.push_back(pinned);
    return tiers;
  };
  server->service_ = std::make_unique<StrataService>(std::move(ctx));
  if (server->nvme_ != nullptr) {
    // ZeRO-Infinity jobs of an earlier run: their records are on NVMe.
    std::vector<std::string> recovery;
    absl::Status recovered = RecoverJobs(server->nvme_.get(), services, server->registry_.get(), &recovery);
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
  auto fd_fd = ListenUnix(fd_socket_path_, allowed_gid_ == static_cast<gid_t>(-1) ? 0600 : 0660, allowed_gid_);
  if (!fd_fd.ok()) return fd_fd.status();
  fd_listener_ = std::move(*fd_fd);
  threads_.emplace_back([this] { AcceptLoop(grpc_listener_.get(), true); });
  threads_.emplace_back([this] { AcceptLoop(fd_listener_.get(), false); });
  threads_.emplace_back([this] { ExpiryLoop(); });
  if (settings_.metrics_port != 0) {
    auto metrics = MetricsServer::Start(static_cast<uint16_t>(settings_.metrics_port),
                                        [this] { return RenderMetrics(); });
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

void DaemonServer::AcceptLoop(int listen_fd, bool grpc_socket) {
  while (!stopping_) {
    pollfd pfd{listen_fd, POLLIN, 0};
    int rc = poll(&pfd, 1, 200);
    if (rc <= 0) continue;
    UniqueFd conn(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    const std::optional<PeerCredentials> peer = PeerAllowed(conn.get());
    if (!peer.has_value()) continue;  // closing is the refusal
    if (grpc_socket) {
      // gRPC names this connection "fd:<n>"; its handlers find the caller's
      // uid under that number (daemon/caller.h).
      peers_.Set(conn.get(), *peer);
      // gRPC's event engine expects a non-blocking socket.
      fcntl(conn.get(), F_SETFL, fcntl(conn.get(), F_GETFL) | O_NONBLOCK);
      grpc::AddInsecureChannelFromFd(grpc_server_.get(), conn.release());
    } else {
      peers_.Set(conn.get(), *peer);
      StartFdHandoff(std::move(conn));
    }
  }
}

void DaemonServer::StartFdHandoff(UniqueFd connection) {
  constexpr int kMaxFdHandoffs = 64;
  {
    absl::MutexLock lock(&handoffs_->mu);
    if (handoffs_->in_flight >= kMaxFdHandoffs) {
      log_(absl::StrCat("fd socket: ", kMaxFdHandoffs, " hand-offs already in flight; refusing a connection"));
      return;  // closing is the refusal
    }
    ++handoffs_->in_flight;
  }
  std::thread([this, state = handoffs_, c = std::move(connection)]() mutable {
    ServeFdRequest(std::move(c));
    absl::MutexLock lock(&state->mu);
    --state->in_flight;
  }).detach();
}

void DaemonServer::ServeFdRequest(UniqueFd connection) {
  // One exchange: the token in, the region's fd (or an error line) out.
  auto message = ReceiveWithFds(connection.get(), 256, absl::Seconds(5));
  if (!message.ok()) {
    log_(absl::StrCat("fd socket: ", message.status().message()));
    return;
  }
  if (!message->fds.empty()) {
    (void)SendWithFds(connection.get(), "ERR file descriptors are not accepted here", {});
    return;
  }
  auto peer = peers_.Get(connection.get());
  if (!peer.has_value()) return;
  // "<token>" asks for the exchange region; "<token> doorbell" (clients that
  // saw RegisterTensorsResponse.doorbell_bytes) for the doorbell too.
  std::string token = message->bytes;
  constexpr absl::string_view kDoorbellSuffix = " doorbell";
  const bool wants_doorbell = absl::EndsWith(token, kDoorbellSuffix);
  if (wants_doorbell) token.resize(token.size() - kDoorbellSuffix.size());
  auto session = registry_->RedeemToken(token, Caller{peer->uid, admins_->IsAdmin(peer->uid)});
  if (!session.ok()) {
    (void)SendWithFds(connection.get(), absl::StrCat("ERR ", session.status().message()), {});
    return;
  }
  if (!session->job->registered()) {
    (void)SendWithFds(connection.get(), "ERR register tensors before mapping shared memory", {});
    return;
  }
  const int fd = session->job->ExchangeFdOf(session->rank);
  const std::string ok = absl::StrCat("OK ", session->job->ExchangeBytesOf(session->rank));
  if (wants_doorbell) {
    // Without a doorbell the client keeps to gRPC: the reply says so by
    // carrying the region alone.
    auto bell = session->job->OpenDoorbell(session->rank);
    if (bell.ok()) {
      (void)SendWithFds(connection.get(), absl::StrCat(ok, " ", bell->bytes), {fd, bell->memfd, bell->eventfd});
      return;
    }
    log_(absl::StrCat("job ", session->job->id(), " rank ", session->rank, ": no doorbell: ", bell.status().message()));
  }
  (void)SendWithFds(connection.get(), ok, {fd});
}

void DaemonServer::ExpiryLoop() {
  while (!stopping_) {
    for (int i = 0; i < 10 && !stopping_; ++i) usleep(100 * 1000);
    for (const std::string& line : registry_->Expire()) log_(line);
  }
}

std::string DaemonServer::RenderMetrics() const {
  std::string out;
  auto metric = [&out](const std::string& name, const std::string& help, const std::string& type) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  if (nvme_ != nullptr) {
    const ExtentStoreStats s = nvme_->Stats();
    metric("strata_tier_capacity_bytes", "Capacity of a tier.", "gauge");
    absl::StrAppend(&out, "strata_tier_capacity_bytes{tier=\"nvme\"} ", s.capacity_bytes, "\n");
    metric("strata_tier_used_bytes", "Bytes in use in a tier.", "gauge");
    absl::StrAppend(&out, "strata_tier_used_bytes{tier=\"nvme\"} ", s.used_bytes, "\n");
    metric("strata_tier_free_bytes", "Free bytes in a tier.", "gauge");
    absl::StrAppend(&out, "strata_tier_free_bytes{tier=\"nvme\"} ", s.free_bytes, "\n");
  }
  const auto jobs = registry_->Jobs();
  struct JobMetric {
    const char* name;
    const char* help;
    const char* type;
    std::function<double(const Job&, const JobCounters&)> value;
  };
  const JobMetric job_metrics[] = {
      {"strata_job_step", "Steps the job has completed (applied or skipped).", "counter",
       [](const Job& j, const JobCounters&) { return static_cast<double>(j.next_step()); }},
      {"strata_job_steps_skipped_total", "Steps skipped for gradient overflow.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.steps_skipped); }},
      {"strata_job_last_step_seconds", "Duration of the last optimizer step.", "gauge",
       [](const Job&, const JobCounters& c) { return c.last_step_s; }},
      {"strata_job_step_seconds_total", "Time spent in optimizer steps.", "counter",
       [](const Job&, const JobCounters& c) { return c.total_step_s; }},
      {"strata_job_loss_scale", "Current loss scale.", "gauge",
       [](const Job& j, const JobCounters&) { return j.loss_scale(); }},
      {"strata_job_param_hits_total", "Param acquires served from memory.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.hits); }},
      {"strata_job_param_misses_total", "Param acquires that waited for NVMe.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.misses + c.params.waits_in_flight); }},
      {"strata_job_stall_seconds_total", "Time acquires waited for params.", "counter",
       [](const Job&, const JobCounters& c) { return c.params.stall_s; }},
      {"strata_job_nvme_read_bytes_total", "Param bytes read from NVMe.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.bytes_read); }},
      {"strata_job_nvme_written_bytes_total", "Param bytes written to NVMe.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.bytes_written); }},
      {"strata_job_prefetches_total", "Param prefetches issued.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.prefetches); }},
      {"strata_job_prefetches_unused_total", "Prefetched params dropped unused.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.prefetches_unused); }},
  };
  std::vector<JobCounters> counters;
  for (const auto& job : jobs) counters.push_back(job->counters());
  for (const JobMetric& m : job_metrics) {
    metric(m.name, m.help, m.type);
    for (size_t i = 0; i < jobs.size(); ++i) {
      absl::StrAppend(&out, m.name, "{job=\"", jobs[i]->settings().name, "\"} ", m.value(*jobs[i], counters[i]), "\n");
    }
  }
  return out;
}

void DaemonServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (registry_ != nullptr) registry_->StartDraining();
  metrics_.reset();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  {
    // Hand-offs finish within their 5 s receive timeout.
    absl::MutexLock lock(&handoffs_->mu);
    handoffs_->mu.Await(absl::Condition(
        +[](int* in_flight) { return *in_flight == 0; }, &handoffs_->in_flight));
  }
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
  unlink(fd_socket_path_.c_str());
}

}  // namespace strata
