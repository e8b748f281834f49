// Who is calling: every RPC is made on behalf of a uid, and every job and
// session records the uid that made it (docs/SECURITY.md).
//
// Unix socket: the daemon accepts each connection itself, reads the peer's
// SO_PEERCRED and records it in the PeerTable under the connection's fd
// before handing the fd to gRPC, whose peer string for such a channel is
// "fd:<n>". TCP: the caller presents the token of --tcp_token_file as
// "authorization: Bearer <token>" metadata and acts as that file's owner.
// Anything else is Unauthenticated.
#ifndef STRATA_DAEMON_CALLER_H_
#define STRATA_DAEMON_CALLER_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/unix_socket.h"

namespace grpc {
class ServerContext;
}

namespace strata {

struct Caller {
  uid_t uid = 0;
  // Root, the daemon's own uid, or a member of the admin group: manages
  // every job (and alone may Drain).
  bool admin = false;
};

// Root, the daemon's uid and members of admin_group are admins; group
// membership (primary or supplementary) is looked up once a minute per uid.
class AdminPolicy {
 public:
  // `admin_gid` = -1: no admin group.
  AdminPolicy(uid_t daemon_uid, gid_t admin_gid) : daemon_uid_(daemon_uid), admin_gid_(admin_gid) {}
  bool IsAdmin(uid_t uid);

 private:
  const uid_t daemon_uid_;
  const gid_t admin_gid_;
  absl::Mutex mu_;
  absl::flat_hash_map<uid_t, std::pair<bool, absl::Time>> cache_ ABSL_GUARDED_BY(mu_);
};

// Whether `uid` is in group `gid` (its primary group or a supplementary one).
bool UidInGroup(uid_t uid, gid_t gid);

// Connection fd -> the peer credentials read when it was accepted.
class PeerTable {
 public:
  void Set(int fd, const PeerCredentials& peer);
  std::optional<PeerCredentials> Get(int fd) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, PeerCredentials> peers_ ABSL_GUARDED_BY(mu_);
};

struct TcpToken {
  std::string secret;
  uid_t owner = 0;
};

// Reads a token file: a regular file (not a symlink), not writable by group
// or others and not readable by others, holding one line of at least 16
// characters. FailedPrecondition naming the problem otherwise.
absl::StatusOr<TcpToken> LoadTcpToken(const std::string& path);

class CallerResolver {
 public:
  CallerResolver(const PeerTable* peers, std::optional<TcpToken> tcp_token, AdminPolicy* admins)
      : peers_(peers), tcp_token_(std::move(tcp_token)), admins_(admins) {}
  // Unauthenticated (saying why) when the caller cannot be identified.
  absl::StatusOr<Caller> Resolve(const grpc::ServerContext& context) const;

 private:
  const PeerTable* peers_;
  const std::optional<TcpToken> tcp_token_;
  AdminPolicy* admins_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_CALLER_H_
