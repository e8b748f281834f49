#include "daemon/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"

namespace strata {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(uint16_t port, Render render) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "creating the metrics socket");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("binding metrics to 127.0.0.1:", port,
                                             " (choose a free --metrics_port, or 0 to turn metrics off)"));
  }
  if (listen(fd.get(), 16) != 0) return ErrnoToStatus(errno, "listening for metrics");
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(fd), std::move(render)));
}

MetricsServer::MetricsServer(UniqueFd listener, Render render)
    : listener_(std::move(listener)), render_(std::move(render)) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsServer::~MetricsServer() {
  stopping_ = true;
  thread_.join();
}

void MetricsServer::Loop() {
  while (!stopping_) {
    pollfd pfd{listener_.get(), POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    UniqueFd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    // Read the request head (bounded); the path does not matter.
    char buf[2048];
    pollfd in{conn.get(), POLLIN, 0};
    if (poll(&in, 1, 1000) <= 0) continue;
    if (read(conn.get(), buf, sizeof(buf)) <= 0) continue;
    const std::string body = render_();
    const std::string response =
        absl::StrCat("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ",
                     body.size(), "\r\nConnection: close\r\n\r\n", body);
    size_t sent = 0;
    while (sent < response.size()) {
      ssize_t n = send(conn.get(), response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
  }
}

}  // namespace strata
