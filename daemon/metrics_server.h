// MetricsServer: Prometheus text exposition on 127.0.0.1:<port>. Any GET
// gets the current metrics; the body comes from a callback so the server
// knows nothing of jobs or tiers. Loopback only: metrics name jobs.
#ifndef STRATA_DAEMON_METRICS_SERVER_H_
#define STRATA_DAEMON_METRICS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "core/unix_socket.h"

namespace strata {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // Binds 127.0.0.1:port; errors name the port (e.g. in use).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(uint16_t port, Render render);
  ~MetricsServer();

 private:
  MetricsServer(UniqueFd listener, Render render);
  void Loop();

  UniqueFd listener_;
  Render render_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_METRICS_SERVER_H_
