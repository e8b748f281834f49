#include "client/strata_client.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <atomic>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "absl/synchronization/notification.h"
#include "client/cuda_ipc.h"
#include "client/doorbell_client.h"
#include "client/slot_copy.h"
#include "core/unix_socket.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/strata.grpc.pb.h"

namespace strata {

struct StrataClient::Connection {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<strata::v1::Strata::Stub> stub;

  void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) const {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  absl::Status Convert(const grpc::Status& s, absl::string_view call) const {
    if (s.ok()) return absl::OkStatus();
    std::string message = absl::StrCat(call, ": ", s.error_message());
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      absl::StrAppend(&message, " (stratad at ", options.socket_path,
                      " unreachable: is it running, and may this uid attach?)");
    }
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), message);
  }
};

namespace {

absl::StatusOr<DType> DTypeOrError(const std::string& text) { return ParseDType(text); }

// How long WaitStep waits on the doorbell before it asks gRPC (see WaitStep).
constexpr absl::Duration kDoorbellPatience = absl::Milliseconds(200);

}  // namespace

struct RankSession::State {
  std::shared_ptr<StrataClient::Connection> connection;
  uint64_t job_id = 0;
  uint32_t rank = 0;
  uint64_t session_id = 0;
  std::string fd_token;
  std::string fd_socket_path;
  absl::Duration lease;
  bool reattached = false;
  uint64_t step = 0;
  DType param_dtype = DType::kFp32;
  DType grad_dtype = DType::kFp32;
  uint32_t stage = 0;
  uint64_t init_batch_bytes = 0;  // RegisterTensorsResponse: 0, no limit
  std::byte* region = nullptr;
  uint64_t region_bytes = 0;
  UniqueFd region_fd;  // the region's memfd, kept for WriteGrad's pwrite into discarded slots
  std::vector<ShardView> shards;
  std::unique_ptr<ClientDoorbell> doorbell;  // when the daemon offered one
  // Gradient slots WaitGradRoom let this session write and GradReady has not
  // signaled yet (counted against the rank's gradient window).
  std::vector<bool> grad_claimed;
  uint64_t grad_claimed_bytes = 0;
  // Bytes of shard `index`'s gradient slot (index < shards.size()).
  uint64_t GradSlotBytes(uint32_t index) const { return shards[index].padded_numel * DTypeSize(grad_dtype); }
  // The daemon's device arena (AttachRankResponse.device), mapped once.
  strata::v1::DeviceArenaShare device_share;
  bool device_offered = false;
  DeviceArenaView device;
  absl::Status device_error;
  std::atomic<bool> stop{false};
  absl::Notification stopped;
  std::thread heartbeat;
};

absl::StatusOr<std::unique_ptr<StrataClient>> StrataClient::Connect(const ClientOptions& options) {
  if (options.socket_path.empty()) {
    return absl::InvalidArgumentError("ClientOptions.socket_path is empty: name stratad's --socket");
  }
  auto connection = std::make_shared<Connection>();
  connection->options = options;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  args.SetMaxSendMessageSize(4 << 20);
  connection->channel = grpc::CreateCustomChannel(absl::StrCat("unix:", options.socket_path),
                                                  grpc::InsecureChannelCredentials(), args);
  connection->stub = strata::v1::Strata::NewStub(connection->channel);
  grpc::ClientContext context;
  connection->SetDeadline(&context, std::min(options.rpc_timeout, absl::Seconds(10)));
  context.set_wait_for_ready(false);
  strata::v1::GetStatusRequest request;
  strata::v1::GetStatusResponse response;
  absl::Status s = connection->Convert(connection->stub->GetStatus(&context, request, &response), "connect");
  if (!s.ok()) return s;
  return std::unique_ptr<StrataClient>(new StrataClient(std::move(connection)));
}

StrataClient::StrataClient(std::shared_ptr<Connection> connection) : connection_(std::move(connection)) {}
StrataClient::~StrataClient() = default;

absl::StatusOr<uint64_t> StrataClient::CreateJob(const JobSpec& spec) {
  strata::v1::CreateJobRequest request;
  request.set_name(spec.name);
  request.set_world_size(spec.world_size);
  request.set_mode(spec.mode == JobMode::kInfinity ? strata::v1::MODE_INFINITY : strata::v1::MODE_OFFLOAD);
  request.set_deepspeed_config_json(spec.deepspeed_config_json);
  if (!spec.optimizer.type.empty()) {
    auto* o = request.mutable_optimizer();
    o->set_type(spec.optimizer.type);
    o->set_lr(spec.optimizer.lr);
    o->set_beta1(spec.optimizer.beta1);
    o->set_beta2(spec.optimizer.beta2);
    o->set_eps(spec.optimizer.eps);
    o->set_weight_decay(spec.optimizer.weight_decay);
    o->set_amsgrad(spec.optimizer.amsgrad);
  }
  request.set_param_dtype(std::string(DTypeName(spec.param_dtype)));
  request.set_grad_dtype(std::string(DTypeName(spec.grad_dtype)));
  request.set_pinned_budget_bytes(spec.pinned_budget_bytes);
  request.set_device_budget_bytes(spec.device_budget_bytes);
  request.set_attach_if_exists(spec.attach_if_exists);
  request.mutable_local_ranks()->Add(spec.local_ranks.begin(), spec.local_ranks.end());
  request.set_external_step_agreement(spec.external_step_agreement);
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::CreateJobResponse response;
  absl::Status s = connection_->Convert(connection_->stub->CreateJob(&context, request, &response), "CreateJob");
  if (!s.ok()) return s;
  return response.job_id();
}

absl::StatusOr<std::vector<JobSummary>> StrataClient::ListJobs() {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::ListJobsResponse response;
  absl::Status s = connection_->Convert(
      connection_->stub->ListJobs(&context, strata::v1::ListJobsRequest(), &response), "ListJobs");
  if (!s.ok()) return s;
  std::vector<JobSummary> out;
  for (const auto& j : response.jobs()) {
    out.push_back(JobSummary{j.job_id(), j.name(), j.world_size(), j.attached_ranks(), j.step(), j.loss_scale(),
                             j.nvme_tile_bytes(), j.nvme_staging_bytes(), j.shards_stepped_early()});
  }
  return out;
}

absl::Status StrataClient::DeleteJob(const std::string& job) {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::DeleteJobRequest request;
  request.set_job(job);
  strata::v1::DeleteJobResponse response;
  return connection_->Convert(connection_->stub->DeleteJob(&context, request, &response), "DeleteJob");
}

absl::Status StrataClient::Noop() {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::NoopResponse response;
  return connection_->Convert(connection_->stub->Noop(&context, strata::v1::NoopRequest(), &response), "Noop");
}

absl::Status StrataClient::Drain() {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::DrainResponse response;
  return connection_->Convert(connection_->stub->Drain(&context, strata::v1::DrainRequest(), &response), "Drain");
}

namespace {

template <typename Response>
absl::StatusOr<ParkResult> ToParkResult(const Response& response) {
  ParkResult out;
  switch (response.tier()) {
    case strata::v1::TIER_DEVICE: out.tier = TierKind::kDevice; break;
    case strata::v1::TIER_PINNED_HOST: out.tier = TierKind::kPinnedHost; break;
    case strata::v1::TIER_NVME: out.tier = TierKind::kNvme; break;
    default: return absl::InternalError(absl::StrCat("the daemon reported tier ", response.tier()));
  }
  out.shards = response.shards();
  out.bytes = response.bytes();
  out.seconds = response.seconds();
  return out;
}

}  // namespace

absl::StatusOr<ParkResult> StrataClient::ParkJob(const std::string& job, TierKind tier) {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.step_timeout);
  strata::v1::ParkJobRequest request;
  request.set_job(job);
  switch (tier) {
    case TierKind::kDevice: request.set_tier(strata::v1::TIER_DEVICE); break;
    case TierKind::kPinnedHost: request.set_tier(strata::v1::TIER_PINNED_HOST); break;
    case TierKind::kNvme: request.set_tier(strata::v1::TIER_NVME); break;
  }
  strata::v1::ParkJobResponse response;
  STRATA_RETURN_IF_ERROR(connection_->Convert(connection_->stub->ParkJob(&context, request, &response), "ParkJob"));
  return ToParkResult(response);
}

absl::StatusOr<ParkResult> StrataClient::ResumeJob(const std::string& job) {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.step_timeout);
  strata::v1::ResumeJobRequest request;
  request.set_job(job);
  strata::v1::ResumeJobResponse response;
  STRATA_RETURN_IF_ERROR(
      connection_->Convert(connection_->stub->ResumeJob(&context, request, &response), "ResumeJob"));
  return ToParkResult(response);
}

absl::Status StrataClient::SaveCheckpoint(const std::string& job, const std::string& directory) {
  return SaveCheckpointPath(job, directory).status();
}

absl::StatusOr<std::string> StrataClient::SaveCheckpointPath(const std::string& job, const std::string& directory) {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.step_timeout);
  strata::v1::SaveCheckpointRequest request;
  request.set_job(job);
  request.set_directory(directory);
  strata::v1::SaveCheckpointResponse response;
  absl::Status s =
      connection_->Convert(connection_->stub->SaveCheckpoint(&context, request, &response), "SaveCheckpoint");
  if (!s.ok()) return s;
  return response.path();
}

absl::StatusOr<std::string> StrataClient::CheckpointHome() {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.step_timeout);
  strata::v1::GetStatusResponse response;
  absl::Status s =
      connection_->Convert(connection_->stub->GetStatus(&context, strata::v1::GetStatusRequest(), &response), "GetStatus");
  if (!s.ok()) return s;
  if (response.checkpoint_home().empty()) {
    return absl::FailedPreconditionError(
        "checkpoints are off: stratad has no checkpoint_root (start it with --checkpoint_root DIR, or --nvme_path, "
        "whose checkpoints/ folder is the default)");
  }
  return response.checkpoint_home();
}

absl::StatusOr<uint64_t> StrataClient::LoadCheckpoint(const std::string& directory, const std::string& new_job_name) {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.step_timeout);
  strata::v1::LoadCheckpointRequest request;
  request.set_directory(directory);
  request.set_job_name(new_job_name);
  strata::v1::LoadCheckpointResponse response;
  absl::Status s = connection_->Convert(connection_->stub->LoadCheckpoint(&context, request, &response), "LoadCheckpoint");
  if (!s.ok()) return s;
  return response.job_id();
}

absl::StatusOr<std::vector<TierUsage>> StrataClient::Tiers() {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::GetStatsResponse response;
  STRATA_RETURN_IF_ERROR(connection_->Convert(
      connection_->stub->GetStats(&context, strata::v1::GetStatsRequest(), &response), "GetStats"));
  std::vector<TierUsage> out;
  for (const auto& t : response.tiers()) out.push_back({t.tier(), t.capacity_bytes(), t.used_bytes()});
  return out;
}

namespace {

StepBreakdown FromProto(const strata::v1::StepTimes& p) {
  StepBreakdown b;
  b.gradients_in_s = p.gradients_in_s();
  b.stream_s = p.stream_s();
  b.load_wait_s = p.load_wait_s();
  b.save_wait_s = p.save_wait_s();
  b.optimizer_s = p.optimizer_s();
  b.grads_back_s = p.grads_back_s();
  b.params_home_s = p.params_home_s();
  b.end_s = p.end_s();
  b.commit_s = p.commit_s();
  b.shards_early = p.shards_early();
  b.early_passes = p.early_passes();
  b.early_stream_s = p.early_stream_s();
  b.early_load_wait_s = p.early_load_wait_s();
  b.early_params_home_s = p.early_params_home_s();
  b.grad_bytes_spilled = p.grad_bytes_spilled();
  b.grad_bytes_read_back = p.grad_bytes_read_back();
  return b;
}

}  // namespace

absl::StatusOr<StepBreakdown> StrataClient::LastStep(const std::string& job) {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::GetStatsResponse response;
  STRATA_RETURN_IF_ERROR(connection_->Convert(
      connection_->stub->GetStats(&context, strata::v1::GetStatsRequest(), &response), "GetStats"));
  for (const auto& j : response.jobs()) {
    if (j.job().name() == job) return FromProto(j.last_step());
  }
  return absl::NotFoundError(absl::StrCat("job '", job, "' is not in the daemon's stats (or not yours)"));
}

absl::StatusOr<std::string> StrataClient::StatsText() {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::GetStatsResponse response;
  absl::Status s = connection_->Convert(
      connection_->stub->GetStats(&context, strata::v1::GetStatsRequest(), &response), "GetStats");
  if (!s.ok()) return s;
  std::string out = "tiers:\n";
  for (const auto& t : response.tiers()) {
    absl::StrAppendFormat(&out, "  %-12s used %llu of %llu bytes\n", t.tier(),
                          static_cast<unsigned long long>(t.used_bytes()),
                          static_cast<unsigned long long>(t.capacity_bytes()));
  }
  out += "jobs:\n";
  for (const auto& j : response.jobs()) {
    absl::StrAppendFormat(&out,
                          "  %-16s step %llu  last step %.4f s  mean %.4f s  stall %.4f s  nvme read %llu B  "
                          "written %llu B  loss scale %g  skipped %llu\n",
                          j.job().name(), static_cast<unsigned long long>(j.job().step()), j.last_step_s(),
                          j.mean_step_s(), j.stall_s(), static_cast<unsigned long long>(j.nvme_read_bytes()),
                          static_cast<unsigned long long>(j.nvme_write_bytes()), j.job().loss_scale(),
                          static_cast<unsigned long long>(j.job().skipped_steps()));
    // Where the last applied step's time went (nothing before the first).
    if (const StepBreakdown b = FromProto(j.last_step()); b.total_s() > 0) {
      absl::StrAppendFormat(&out,
                            "    last step %.2f s: gradients in %.2f s, stream %.2f s (waiting for NVMe loads %.2f s, "
                            "saves %.2f s, optimizer %.2f s, gradients back %.2f s, params home %.2f s), end %.2f s, "
                            "commit %.3f s; %llu shards stepped early, in %llu passes, while gradients came in (%.2f s of "
                            "passes: waiting for NVMe loads %.2f s, params home %.2f s); gradients spilled %llu B, "
                            "read back %llu B\n",
                            b.total_s(), b.gradients_in_s, b.stream_s, b.load_wait_s, b.save_wait_s, b.optimizer_s,
                            b.grads_back_s, b.params_home_s, b.end_s, b.commit_s,
                            static_cast<unsigned long long>(b.shards_early),
                            static_cast<unsigned long long>(b.early_passes), b.early_stream_s, b.early_load_wait_s,
                            b.early_params_home_s,
                            static_cast<unsigned long long>(b.grad_bytes_spilled),
                            static_cast<unsigned long long>(b.grad_bytes_read_back));
    }
    // One row per tier: pinned (the window) and device (the job's arena)
    // show what the job holds of its budget there and its acquires into it.
    for (const auto& t : j.tiers()) {
      if (t.tier() == "nvme") {
        absl::StrAppendFormat(&out, "    nvme     read %llu B  written %llu B\n",
                              static_cast<unsigned long long>(t.bytes_read()),
                              static_cast<unsigned long long>(t.bytes_written()));
        continue;
      }
      absl::StrAppendFormat(&out,
                            "    %-8s %llu of %llu B  hits %llu  misses %llu  stall %.4f s  prefetches %llu (%llu "
                            "unused)\n",
                            t.tier(), static_cast<unsigned long long>(t.bytes()),
                            static_cast<unsigned long long>(t.budget_bytes()),
                            static_cast<unsigned long long>(t.hits()), static_cast<unsigned long long>(t.misses()),
                            t.stall_s(), static_cast<unsigned long long>(t.prefetches()),
                            static_cast<unsigned long long>(t.prefetches_unused()));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<RankSession>> StrataClient::Attach(const std::string& job, uint32_t rank) {
  grpc::ClientContext context;
  connection_->SetDeadline(&context, connection_->options.rpc_timeout);
  strata::v1::AttachRankRequest request;
  request.set_job(job);
  request.set_rank(rank);
  strata::v1::AttachRankResponse response;
  absl::Status s = connection_->Convert(connection_->stub->AttachRank(&context, request, &response), "AttachRank");
  if (!s.ok()) return s;
  auto state = std::make_unique<RankSession::State>();
  state->connection = connection_;
  state->job_id = response.job_id();
  state->rank = rank;
  state->session_id = response.session_id();
  state->fd_token = response.fd_token();
  state->fd_socket_path = response.fd_socket_path();
  state->lease = absl::Milliseconds(response.lease_timeout_ms());
  state->reattached = response.reattached();
  state->step = response.step();
  state->device_offered = response.has_device() && response.device().bytes() > 0;
  if (state->device_offered) state->device_share = response.device();
  return std::make_unique<RankSession>(std::move(state));
}

namespace {

void UnmapDeviceArena(RankSession::State& st) {
  if (st.device.kind == DeviceArenaView::Kind::kMemfd && st.device.host != nullptr) {
    munmap(const_cast<std::byte*>(st.device.host), st.device.bytes);
  }
  if (st.device.kind == DeviceArenaView::Kind::kCudaIpc && st.device.device != nullptr) {
    // The pointer is base + cuda_offset; the IPC mapping is closed by its base.
    CloseCudaIpcArena(static_cast<std::byte*>(st.device.device) - st.device_share.cuda_offset());
  }
  st.device = DeviceArenaView();
}

// Maps the arena from the hand-off's memfd (read-only: only the daemon
// writes shards), checking its size against what AttachRank said.
absl::Status MapEmulatedArena(RankSession::State& st, UniqueFd fd, uint64_t bytes) {
  if (bytes != st.device_share.bytes()) {
    return absl::InternalError("the daemon's device arena size does not match AttachRank");
  }
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of the device arena failed: errno ", errno));
  }
  st.device.kind = DeviceArenaView::Kind::kMemfd;
  st.device.bytes = bytes;
  st.device.host = static_cast<const std::byte*>(base);
  return absl::OkStatus();
}

}  // namespace

RankSession::RankSession(std::unique_ptr<State> state) : state_(std::move(state)) {
  // Keep the lease alive while the trainer computes between calls.
  State* st = state_.get();
  st->heartbeat = std::thread([st] {
    const absl::Duration every = std::max(st->lease / 3, absl::Milliseconds(100));
    while (!st->stopped.WaitForNotificationWithTimeout(every)) {
      grpc::ClientContext context;
      st->connection->SetDeadline(&context, every);
      strata::v1::HeartbeatRequest request;
      request.set_session_id(st->session_id);
      strata::v1::HeartbeatResponse response;
      (void)st->connection->stub->Heartbeat(&context, request, &response);
    }
  });
}

RankSession::~RankSession() {
  state_->stopped.Notify();
  if (state_->heartbeat.joinable()) state_->heartbeat.join();
  grpc::ClientContext context;
  state_->connection->SetDeadline(&context, absl::Seconds(5));
  strata::v1::DetachRankRequest request;
  request.set_session_id(state_->session_id);
  strata::v1::DetachRankResponse response;
  (void)state_->connection->stub->DetachRank(&context, request, &response);
  if (state_->region != nullptr) munmap(state_->region, state_->region_bytes);
  UnmapDeviceArena(*state_);
}

uint64_t RankSession::job_id() const { return state_->job_id; }
uint32_t RankSession::rank() const { return state_->rank; }
bool RankSession::reattached() const { return state_->reattached; }
uint64_t RankSession::step() const { return state_->step; }

absl::StatusOr<uint64_t> RankSession::ResidentRegionBytes() const {
  if (state_->region == nullptr) {
    return absl::FailedPreconditionError("the shared region is not mapped yet: call RegisterTensors first");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> pages((state_->region_bytes + page - 1) / page);
  if (mincore(state_->region, state_->region_bytes, pages.data()) != 0) {
    return absl::InternalError(absl::StrCat("mincore over the shared region failed: errno ", errno));
  }
  uint64_t resident = 0;
  for (unsigned char v : pages) resident += v & 1;
  return resident * page;
}
absl::Span<ShardView> RankSession::shards() { return absl::MakeSpan(state_->shards); }
DType RankSession::param_dtype() const { return state_->param_dtype; }
DType RankSession::grad_dtype() const { return state_->grad_dtype; }
uint32_t RankSession::stage() const { return state_->stage; }

absl::Status RankSession::RegisterTensors(absl::Span<const TensorDesc> tensors,
                                         absl::Span<const ShardLayoutSpec> partition) {
  State& st = *state_;
  if (st.region != nullptr) {
    return absl::FailedPreconditionError("tensors are already registered and mapped in this session");
  }
  strata::v1::RegisterTensorsRequest request;
  request.set_session_id(st.session_id);
  for (const TensorDesc& t : tensors) {
    auto* info = request.add_tensors();
    info->set_name(t.name);
    info->set_numel(t.numel);
    info->set_group(t.group);
  }
  for (const ShardLayoutSpec& shard : partition) {
    auto* out = request.add_partition();
    out->set_index(shard.index);
    out->set_padded_numel(shard.padded_numel);
    for (const OwnedRange& r : shard.ranges) {
      auto* range = out->add_ranges();
      range->set_tensor(r.tensor.value());
      range->set_tensor_offset(r.tensor_offset);
      range->set_numel(r.numel);
      range->set_shard_offset(r.shard_offset);
    }
  }
  strata::v1::RegisterTensorsResponse response;
  {
    grpc::ClientContext context;
    st.connection->SetDeadline(&context, st.connection->options.step_timeout);
    absl::Status s = st.connection->Convert(st.connection->stub->RegisterTensors(&context, request, &response),
                                            "RegisterTensors");
    if (!s.ok()) return s;
  }
  auto pdt = DTypeOrError(response.param_dtype());
  auto gdt = DTypeOrError(response.grad_dtype());
  if (!pdt.ok() || !gdt.ok()) return absl::InternalError("the daemon answered with an unknown dtype");
  st.param_dtype = *pdt;
  st.grad_dtype = *gdt;
  st.stage = response.stage();
  st.init_batch_bytes = response.init_batch_bytes();
  // Receive the exchange region's memfd and map it; with the doorbell
  // offered, also the doorbell's page and eventfd ("OK <region> <page>").
  const bool want_doorbell = st.connection->options.use_doorbell && response.doorbell_bytes() != 0;
  auto sock = ConnectUnix(st.fd_socket_path);
  if (!sock.ok()) return sock.status();
  // The emulated device arena comes in the same hand-off ("... device").
  const bool want_device = st.device_offered && st.device_share.kind() == "memfd";
  std::string ask = st.fd_token;
  if (want_doorbell) ask += " doorbell";
  if (want_device) ask += " device";
  if (absl::Status s = SendWithFds(sock->get(), ask, {}); !s.ok()) return s;
  auto reply = ReceiveWithFds(sock->get(), 1024, st.connection->options.rpc_timeout);
  if (!reply.ok()) return reply.status();
  std::vector<std::string> words = absl::StrSplit(reply->bytes, ' ');
  // "... device <bytes>" at the end, with the arena's fd last.
  std::optional<UniqueFd> device_fd;
  uint64_t device_bytes = 0;
  if (want_device && words.size() >= 4 && words[words.size() - 2] == "device" && reply->fds.size() >= 2) {
    if (!absl::SimpleAtoi(words.back(), &device_bytes)) {
      return absl::InternalError("the daemon's device arena reply is malformed");
    }
    words.resize(words.size() - 2);
    device_fd = std::move(reply->fds.back());
    reply->fds.pop_back();
  }
  const bool with_doorbell = words.size() == 3 && reply->fds.size() == 3;
  if (words.size() < 2 || words[0] != "OK" || !(with_doorbell || (words.size() == 2 && reply->fds.size() == 1))) {
    return absl::PermissionDeniedError(absl::StrCat("the daemon refused the shared memory: ", reply->bytes));
  }
  UnmapDeviceArena(st);
  st.device_error = absl::OkStatus();
  if (want_device) {
    if (!device_fd.has_value()) return absl::InternalError("the daemon offered a device arena but sent none");
    STRATA_RETURN_IF_ERROR(MapEmulatedArena(st, std::move(*device_fd), device_bytes));
  } else if (st.device_offered && st.device_share.kind() == "cuda_ipc") {
    // Opened once per session; a process that cannot open it (no GPU, a
    // client built without CUDA) trains on the pinned window instead.
    absl::StatusOr<void*> base = OpenCudaIpcArena(st.device_share.cuda_ipc_handle(), st.device_share.device_ordinal());
    if (base.ok()) {
      st.device.kind = DeviceArenaView::Kind::kCudaIpc;
      st.device.bytes = st.device_share.bytes();
      st.device.device = static_cast<std::byte*>(*base) + st.device_share.cuda_offset();
    } else {
      st.device_error = base.status();
    }
  } else if (st.device_offered) {
    st.device_error = absl::UnimplementedError(
        absl::StrCat("the daemon shares its device arena as '", st.device_share.kind(), "', unknown to this client"));
  }
  uint64_t bytes = 0;
  if (!absl::SimpleAtoi(words[1], &bytes) || bytes != response.region_bytes()) {
    return absl::InternalError("the daemon's shared region size does not match RegisterTensors");
  }
  st.doorbell.reset();
  if (with_doorbell) {
    uint64_t page = 0;
    if (!absl::SimpleAtoi(words[2], &page)) return absl::InternalError("the daemon's doorbell reply is malformed");
    // A doorbell this client cannot use (another version) leaves it on gRPC.
    auto bell = ClientDoorbell::Map(std::move(reply->fds[1]), std::move(reply->fds[2]), page);
    if (bell.ok()) st.doorbell = std::move(*bell);
  }
  // Not MAP_POPULATE: a ZeRO-Infinity region is a window whose memory exists
  // only for the slots in use (tiers/pinned_arena.h); populating it here would
  // allocate every slot of the rank. An offload region's pages already exist
  // (the daemon populated them), so its first touches are minor faults.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fds[0].get(), 0);
  if (base == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap of the shared region failed: errno ", errno));
  // Huge pages where shmem THP allows them (the daemon advises its own
  // mapping too): a 64 MiB bucket copied through 4 KiB pages pays a TLB walk
  // per page. Advice only: refused or ignored, nothing changes.
  (void)madvise(base, bytes, MADV_HUGEPAGE);
  st.region = static_cast<std::byte*>(base);
  st.region_bytes = bytes;
  st.region_fd = std::move(reply->fds[0]);
  st.shards.clear();
  for (const auto& s : response.shards()) {
    ShardView view;
    view.index = s.index();
    view.padded_numel = s.padded_numel();
    for (const auto& r : s.ranges()) {
      view.ranges.push_back(OwnedRange{TensorId(r.tensor()), r.tensor_offset(), r.numel(), r.shard_offset()});
    }
    if (s.grad_offset() + s.padded_numel() * DTypeSize(st.grad_dtype) > bytes ||
        s.param_offset() + s.padded_numel() * DTypeSize(st.param_dtype) > bytes) {
      return absl::InternalError("a shard slot lies outside the shared region");
    }
    view.grad = st.region + s.grad_offset();
    view.param = st.region + s.param_offset();
    st.shards.push_back(std::move(view));
  }
  st.grad_claimed.assign(st.shards.size(), false);
  st.grad_claimed_bytes = 0;
  return absl::OkStatus();
}

namespace {

// One session-scoped unary call with a deadline.
template <typename Request, typename Response>
absl::Status SessionCall(RankSession::State& st,
                         grpc::Status (strata::v1::Strata::Stub::*method)(grpc::ClientContext*, const Request&,
                                                                          Response*),
                         absl::string_view name, Request& request, Response* response, absl::Duration timeout) {
  request.set_session_id(st.session_id);
  grpc::ClientContext context;
  st.connection->SetDeadline(&context, timeout);
  return st.connection->Convert((st.connection->stub.get()->*method)(&context, request, response), name);
}

}  // namespace

absl::Status RankSession::InitParams(absl::Span<const uint32_t> indices) {
  strata::v1::InitParamsRequest request;
  for (const uint32_t index : indices) request.add_shard_indices(index);
  strata::v1::InitParamsResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::InitParams, "InitParams", request, &response,
                     state_->connection->options.step_timeout);
}

uint64_t RankSession::init_batch_bytes() const { return state_->init_batch_bytes; }

absl::Status RankSession::InitParamsInBatches(const std::function<absl::Status(ShardView&)>& write) {
  State& st = *state_;
  const uint64_t limit = st.init_batch_bytes;
  const size_t param_bytes = DTypeSize(st.param_dtype);
  std::vector<uint32_t> batch;
  uint64_t batch_bytes = 0;
  for (ShardView& shard : st.shards) {
    const uint64_t bytes = shard.padded_numel * param_bytes;
    // A batch holds at least one shard, whatever its size.
    if (limit != 0 && !batch.empty() && batch_bytes + bytes > limit) {
      STRATA_RETURN_IF_ERROR(InitParams(batch));
      batch.clear();
      batch_bytes = 0;
    }
    STRATA_RETURN_IF_ERROR(write(shard));
    batch.push_back(shard.index);
    batch_bytes += bytes;
  }
  // The last batch (empty only for a rank without shards: "all", none).
  return InitParams(batch);
}

absl::Status RankSession::BeginStep(uint64_t step, absl::Span<const GroupHyperparams> groups) {
  strata::v1::BeginStepRequest request;
  request.set_step(step);
  for (const GroupHyperparams& g : groups) {
    auto* out = request.add_groups();
    out->set_lr(g.lr);
    out->set_beta1(g.beta1);
    out->set_beta2(g.beta2);
    out->set_eps(g.eps);
    out->set_weight_decay(g.weight_decay);
    out->set_lr_decay(g.lr_decay);
  }
  strata::v1::BeginStepResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::BeginStep, "BeginStep", request, &response,
                     state_->connection->options.rpc_timeout);
}

absl::Status RankSession::WaitGradRoom(uint32_t index) {
  State& st = *state_;
  if (index >= st.shards.size()) {
    return absl::OutOfRangeError(absl::StrCat("WaitGradRoom: shard index ", index,
                                              " is out of range: this rank has ", st.shards.size(), " shards"));
  }
  if (st.grad_claimed[index]) return absl::OkStatus();  // counted already, until its GradReady
  const uint64_t bytes = st.GradSlotBytes(index);
  if (st.doorbell != nullptr) {
    STRATA_RETURN_IF_ERROR(
        st.doorbell->WaitGradRoom(bytes, st.grad_claimed_bytes, st.connection->options.step_timeout));
  }
  st.grad_claimed[index] = true;
  st.grad_claimed_bytes += bytes;
  return absl::OkStatus();
}

absl::Status RankSession::GradReady(uint32_t index, uint64_t step) {
  State& st = *state_;
  if (index < st.grad_claimed.size() && st.grad_claimed[index]) {
    st.grad_claimed[index] = false;
    st.grad_claimed_bytes -= st.GradSlotBytes(index);
  }
  if (st.doorbell != nullptr && st.doorbell->CanSignal(index, step, st.shards.size())) {
    return st.doorbell->Signal(index, step, st.GradSlotBytes(index), st.connection->options.rpc_timeout);
  }
  strata::v1::GradReadyRequest request;
  request.set_index(index);
  request.set_step(step);
  strata::v1::GradReadyResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::GradReady, "GradReady", request, &response,
                     state_->connection->options.rpc_timeout);
}

absl::StatusOr<LocalStepStats> RankSession::PrepareStep(uint64_t step) {
  strata::v1::PrepareStepRequest request;
  request.set_step(step);
  strata::v1::PrepareStepResponse response;
  absl::Status s = SessionCall(*state_, &strata::v1::Strata::Stub::PrepareStep, "PrepareStep", request, &response,
                               state_->connection->options.step_timeout);
  if (!s.ok()) return s;
  return LocalStepStats{response.overflow(), response.squared_norm()};
}

absl::Status RankSession::CommitStep(uint64_t step, bool overflow, double squared_norm) {
  strata::v1::CommitStepRequest request;
  request.set_step(step);
  request.set_overflow(overflow);
  request.set_squared_norm(squared_norm);
  strata::v1::CommitStepResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::CommitStep, "CommitStep", request, &response,
                     state_->connection->options.rpc_timeout);
}

absl::Status RankSession::Flush() {
  State& st = *state_;
  if (st.doorbell == nullptr) return absl::OkStatus();
  absl::Status s = st.doorbell->Flush(st.connection->options.rpc_timeout);
  if (s.code() != absl::StatusCode::kUnavailable) return s;
  // The page closed or the job failed: gRPC says why.
  strata::v1::WaitStepRequest request;
  request.set_step(st.doorbell->done_steps());
  strata::v1::WaitStepResponse response;
  absl::Status why = SessionCall(st, &strata::v1::Strata::Stub::WaitStep, "Flush", request, &response,
                                 absl::Seconds(2));
  return why.ok() ? s : why;
}

bool RankSession::doorbell_active() const { return state_->doorbell != nullptr; }

absl::Status RankSession::WriteGrad(uint32_t index, const void* src, uint64_t bytes, uint64_t offset) {
  State& st = *state_;
  if (index >= st.shards.size()) {
    return absl::OutOfRangeError(absl::StrCat("WriteGrad: shard index ", index, " is out of range: this rank has ",
                                              st.shards.size(), " shards"));
  }
  const ShardView& shard = st.shards[index];
  const uint64_t slot_bytes = st.GradSlotBytes(index);
  if (offset > slot_bytes || bytes > slot_bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("WriteGrad: ", bytes, " bytes at offset ", offset,
                                              " do not fit shard ", index, "'s grad slot of ", slot_bytes, " bytes"));
  }
  STRATA_RETURN_IF_ERROR(WaitGradRoom(index));
  std::byte* dst = shard.grad + offset;
  return CopyIntoRegion(st.region_fd.get(), dst, static_cast<uint64_t>(dst - st.region), src, bytes);
}

absl::StatusOr<StepResult> RankSession::WaitStep(uint64_t step) {
  State& st = *state_;
  // The doorbell answers for the open step when the step is done within
  // kDoorbellPatience -- the waits whose latency matters. Otherwise (closed,
  // failed, a step it does not describe, a longer step) gRPC answers, with
  // the exact error: a daemon that died is noticed at once there, where
  // nothing would ever wake the futex (the crash harness's trainers waited out
  // the whole step timeout after each kill -9).
  const absl::Duration step_timeout = st.connection->options.step_timeout;
  absl::Duration grpc_timeout = step_timeout;
  if (st.doorbell != nullptr) {
    const absl::Time start = absl::Now();
    STRATA_ASSIGN_OR_RETURN(std::optional<DoorbellStepOutcome> done,
                            st.doorbell->WaitStep(step, std::min(step_timeout, kDoorbellPatience)));
    if (done.has_value()) return StepResult{done->skipped, done->loss_scale, done->grad_norm, done->optimizer_steps};
    grpc_timeout = std::max(step_timeout - (absl::Now() - start), absl::Seconds(1));
  }
  strata::v1::WaitStepRequest request;
  request.set_step(step);
  strata::v1::WaitStepResponse response;
  absl::Status s = SessionCall(*state_, &strata::v1::Strata::Stub::WaitStep, "WaitStep", request, &response,
                               grpc_timeout);
  if (!s.ok()) return s;
  return StepResult{response.skipped(), response.loss_scale(), response.grad_norm(), response.optimizer_steps()};
}

absl::Status RankSession::Acquire(absl::Span<const uint32_t> indices) {
  strata::v1::AcquireRequest request;
  request.mutable_indices()->Add(indices.begin(), indices.end());
  strata::v1::AcquireResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::Acquire, "Acquire", request, &response,
                     state_->connection->options.step_timeout);
}

absl::StatusOr<std::vector<ShardPlace>> RankSession::Acquire(absl::Span<const uint32_t> indices, TierKind tier) {
  strata::v1::AcquireRequest request;
  request.mutable_indices()->Add(indices.begin(), indices.end());
  switch (tier) {
    case TierKind::kDevice: request.set_tier(strata::v1::TIER_DEVICE); break;
    case TierKind::kPinnedHost: request.set_tier(strata::v1::TIER_PINNED_HOST); break;
    case TierKind::kNvme: request.set_tier(strata::v1::TIER_NVME); break;
  }
  strata::v1::AcquireResponse response;
  STRATA_RETURN_IF_ERROR(SessionCall(*state_, &strata::v1::Strata::Stub::Acquire, "Acquire", request, &response,
                                     state_->connection->options.step_timeout));
  if (response.places_size() != static_cast<int>(indices.size())) {
    return absl::InternalError(absl::StrCat("Acquire: the daemon placed ", response.places_size(), " of ",
                                            indices.size(), " shards"));
  }
  std::vector<ShardPlace> places;
  places.reserve(indices.size());
  for (const auto& p : response.places()) {
    ShardPlace place{p.index(), TierKind::kPinnedHost, p.offset(), p.bytes()};
    if (p.tier() == strata::v1::TIER_DEVICE) place.tier = TierKind::kDevice;
    else if (p.tier() != strata::v1::TIER_PINNED_HOST) {
      return absl::InternalError(absl::StrCat("Acquire: the daemon placed shard ", p.index(), " in tier ", p.tier()));
    }
    places.push_back(place);
  }
  return places;
}

const DeviceArenaView& RankSession::device_arena() const { return state_->device; }
absl::Status RankSession::device_error() const { return state_->device_error; }

absl::StatusOr<absl::Span<const std::byte>> RankSession::PlacedBytes(const ShardPlace& place) const {
  const State& st = *state_;
  const std::byte* base = nullptr;
  uint64_t size = 0;
  if (place.tier == TierKind::kPinnedHost) {
    base = st.region;
    size = st.region_bytes;
  } else if (place.tier == TierKind::kDevice) {
    if (st.device.kind == DeviceArenaView::Kind::kCudaIpc) {
      return absl::FailedPreconditionError("the device arena is GPU memory: read it at device_arena().device + offset");
    }
    base = st.device.host;
    size = st.device.bytes;
  }
  if (base == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("no ", TierKindName(place.tier), " mapping in this session",
                                                      st.device_error.ok() ? "" : ": ",
                                                      st.device_error.ok() ? "" : st.device_error.message()));
  }
  if (place.offset > size || place.bytes > size - place.offset) {
    return absl::OutOfRangeError(absl::StrCat("shard ", place.index, " at ", place.offset, "+", place.bytes,
                                              " lies outside the ", size, "-byte mapping"));
  }
  return absl::Span<const std::byte>(base + place.offset, place.bytes);
}

absl::Status RankSession::ReadPlaced(const ShardPlace& place, absl::Span<std::byte> dst) const {
  if (dst.size() < place.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadPlaced: ", dst.size(), " bytes of room for shard ", place.index, "'s ", place.bytes));
  }
  const State& st = *state_;
  if (place.tier == TierKind::kDevice && st.device.kind == DeviceArenaView::Kind::kCudaIpc) {
    if (place.offset > st.device.bytes || place.bytes > st.device.bytes - place.offset) {
      return absl::OutOfRangeError(absl::StrCat("shard ", place.index, " at ", place.offset, "+", place.bytes,
                                                " lies outside the ", st.device.bytes, "-byte device arena"));
    }
    return CopyFromCudaArena(dst.data(), static_cast<const std::byte*>(st.device.device) + place.offset,
                             place.bytes);
  }
  STRATA_ASSIGN_OR_RETURN(absl::Span<const std::byte> bytes, PlacedBytes(place));
  std::copy(bytes.begin(), bytes.end(), dst.begin());
  return absl::OkStatus();
}

absl::Status RankSession::Release(absl::Span<const uint32_t> indices) {
  strata::v1::ReleaseRequest request;
  request.mutable_indices()->Add(indices.begin(), indices.end());
  strata::v1::ReleaseResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::Release, "Release", request, &response,
                     state_->connection->options.rpc_timeout);
}

absl::Status RankSession::IterationBoundary() {
  strata::v1::IterationBoundaryRequest request;
  strata::v1::IterationBoundaryResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::IterationBoundary, "IterationBoundary", request,
                     &response, state_->connection->options.rpc_timeout);
}

absl::Status RankSession::Heartbeat() {
  strata::v1::HeartbeatRequest request;
  strata::v1::HeartbeatResponse response;
  return SessionCall(*state_, &strata::v1::Strata::Stub::Heartbeat, "Heartbeat", request, &response,
                     state_->connection->options.rpc_timeout);
}

}  // namespace strata
