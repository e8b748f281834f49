#include "daemon/fd_handoff.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/job.h"

namespace strata {
namespace {

constexpr int kMaxHandoffsInFlight = 64;
// "<token>" asks for the exchange region; "<token> doorbell" (clients that
// saw RegisterTensorsResponse.doorbell_bytes) for the doorbell too.
constexpr absl::string_view kDoorbellSuffix = " doorbell";
// "... device": also the emulated device arena (jobs with a device budget).
constexpr absl::string_view kDeviceSuffix = " device";

}  // namespace

FdHandoffServer::FdHandoffServer(JobRegistry* registry, AdminPolicy* admins, Admit admit, Logger log,
                                 const DeviceArena* device)
    : registry_(registry), admins_(admins), device_(device), admit_(std::move(admit)), log_(std::move(log)) {}

FdHandoffServer::~FdHandoffServer() { Stop(); }

absl::Status FdHandoffServer::Start(const std::string& path, mode_t mode, gid_t group) {
  auto listener = ListenUnix(path, mode, group);
  if (!listener.ok()) return listener.status();
  path_ = path;
  listener_ = std::move(*listener);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void FdHandoffServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    // Hand-offs finish within their 5 s receive timeout.
    absl::MutexLock lock(&in_flight_->mu);
    in_flight_->mu.Await(absl::Condition(+[](int* count) { return *count == 0; }, &in_flight_->count));
  }
  if (!path_.empty()) unlink(path_.c_str());
}

void FdHandoffServer::AcceptLoop() {
  while (!stopping_) {
    pollfd pfd{listener_.get(), POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    UniqueFd connection(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    std::optional<PeerCredentials> peer = admit_(connection.get());
    if (!peer.has_value()) continue;  // closing is the refusal
    StartHandoff(std::move(connection), *peer);
  }
}

void FdHandoffServer::StartHandoff(UniqueFd connection, PeerCredentials peer) {
  {
    absl::MutexLock lock(&in_flight_->mu);
    if (in_flight_->count >= kMaxHandoffsInFlight) {
      log_(absl::StrCat("fd socket: ", kMaxHandoffsInFlight, " hand-offs already in flight; refusing a connection"));
      return;  // closing is the refusal
    }
    ++in_flight_->count;
  }
  std::thread([this, state = in_flight_, c = std::move(connection), peer]() mutable {
    Serve(std::move(c), peer);
    absl::MutexLock lock(&state->mu);
    --state->count;
  }).detach();
}

void FdHandoffServer::Serve(UniqueFd connection, const PeerCredentials& peer) {
  // One exchange: the token in, the fds (or an error line) out.
  auto message = ReceiveWithFds(connection.get(), 256, absl::Seconds(5));
  if (!message.ok()) {
    log_(absl::StrCat("fd socket: ", message.status().message()));
    return;
  }
  if (!message->fds.empty()) {
    (void)SendWithFds(connection.get(), "ERR file descriptors are not accepted here", {});
    return;
  }
  std::string token = message->bytes;
  const bool wants_device = absl::EndsWith(token, kDeviceSuffix);
  if (wants_device) token.resize(token.size() - kDeviceSuffix.size());
  const bool wants_doorbell = absl::EndsWith(token, kDoorbellSuffix);
  if (wants_doorbell) token.resize(token.size() - kDoorbellSuffix.size());
  auto session = registry_->RedeemToken(token, Caller{peer.uid, admins_->IsAdmin(peer.uid)});
  if (!session.ok()) {
    (void)SendWithFds(connection.get(), absl::StrCat("ERR ", session.status().message()), {});
    return;
  }
  if (!session->job->registered()) {
    (void)SendWithFds(connection.get(), "ERR register tensors before mapping shared memory", {});
    return;
  }
  const int fd = session->job->ExchangeFdOf(session->rank);
  std::string reply = absl::StrCat("OK ", session->job->ExchangeBytesOf(session->rank));
  std::vector<int> fds = {fd};
  if (wants_doorbell) {
    // Without a doorbell the client keeps to gRPC: the reply says so by
    // carrying the region alone.
    auto bell = session->job->OpenDoorbell(session->rank);
    if (bell.ok()) {
      absl::StrAppend(&reply, " ", bell->bytes);
      fds.push_back(bell->memfd);
      fds.push_back(bell->eventfd);
    } else {
      log_(absl::StrCat("job ", session->job->id(), " rank ", session->rank, ": no doorbell: ",
                        bell.status().message()));
    }
  }
  // The job's own device arena, when asked for: its descriptor lives until
  // the reply is sent.
  std::optional<JobArenaShare> device_share;
  if (wants_device) {
    // Only a job that holds a device budget sees the arena.
    if (session->job->settings().device_budget_bytes == 0) {
      (void)SendWithFds(connection.get(), "ERR the job has no device budget: no device arena to map", {});
      return;
    }
    // The job's own arena, never the daemon's whole device memory.
    absl::StatusOr<JobArenaShare> share = absl::FailedPreconditionError("this daemon has no device tier");
    if (device_ != nullptr) share = device_->tier()->Share(JobId(session->job->id()));
    if (!share.ok() || !share->read_only_fd.valid()) {
      (void)SendWithFds(connection.get(),
                        absl::StrCat("ERR the job's device arena is not shared over the fd socket (",
                                     share.ok() ? std::string("CUDA IPC: see AttachRankResponse.device")
                                                : std::string(share.status().message()),
                                     ")"),
                        {});
      return;
    }
    device_share = std::move(*share);
    absl::StrAppend(&reply, " device ", device_share->bytes);
    fds.push_back(device_share->read_only_fd.get());
  }
  (void)SendWithFds(connection.get(), reply, fds);
}

}  // namespace strata
