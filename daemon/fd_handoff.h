// FdHandoffServer: the daemon's second Unix socket (<socket>.fd), through
// which a rank receives its shared memory. A rank sends the one-time token
// its attach returned; the reply is "OK <region bytes>" with the exchange
// region's memfd (SCM_RIGHTS), or, for "<token> doorbell", "OK <region
// bytes> <page bytes>" with the region, the doorbell page and its eventfd;
// or "ERR <why>". A rank of a job with a device budget on a daemon with an
// emulated device tier may add " device" (after " doorbell", if any): the
// reply then ends in " device <arena bytes>" and carries, last, a read-only
// descriptor of the job's own device arena memfd (daemon/job_device_tier.h;
// never another job's). Each connection is served on its own short-lived thread,
// so a client that connects and says nothing (each waits at most 5 s)
// cannot hold up other ranks; at most 64 at once, more are refused.
//
// Thread-safe: Start once, Stop once (the destructor stops).
#ifndef STRATA_DAEMON_FD_HANDOFF_H_
#define STRATA_DAEMON_FD_HANDOFF_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/unix_socket.h"
#include "daemon/caller.h"
#include "daemon/device_arena.h"
#include "daemon/job_registry.h"

namespace strata {

class FdHandoffServer {
 public:
  // The peer's credentials when it may use the daemon; nullopt (the caller
  // logged why) when not: the connection is closed unanswered.
  using Admit = std::function<std::optional<PeerCredentials>(int fd)>;
  using Logger = std::function<void(const std::string&)>;

  // Borrowed: `registry`, `admins` and `device` (null: no device tier)
  // outlive the server.
  FdHandoffServer(JobRegistry* registry, AdminPolicy* admins, Admit admit, Logger log,
                  const DeviceArena* device = nullptr);
  ~FdHandoffServer();

  // Listens on `path` (created with `mode`, group `group` when not -1) and
  // serves until Stop.
  absl::Status Start(const std::string& path, mode_t mode, gid_t group);
  // Stops accepting, waits for hand-offs in flight, removes the socket file.
  void Stop();

 private:
  void AcceptLoop();
  void StartHandoff(UniqueFd connection, PeerCredentials peer);
  void Serve(UniqueFd connection, const PeerCredentials& peer);

  JobRegistry* const registry_;
  AdminPolicy* const admins_;
  const DeviceArena* const device_;
  const Admit admit_;
  const Logger log_;
  std::string path_;
  UniqueFd listener_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  // Hand-offs in flight; shared with their threads, so a thread's last
  // unlock never touches a destroyed mutex.
  struct InFlight {
    absl::Mutex mu;
    int count ABSL_GUARDED_BY(mu) = 0;
  };
  std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
};

}  // namespace strata

#endif  // STRATA_DAEMON_FD_HANDOFF_H_
