#include "daemon/caller.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/errno_status.h"
#include "grpcpp/server_context.h"

namespace strata {
namespace {

// Compares without an early exit, so the time taken says nothing about how
// much of the token matched.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool UidInGroup(uid_t uid, gid_t gid) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return false;
  if (pw.pw_gid == gid) return true;
  int ngroups = 256;
  std::vector<gid_t> groups(ngroups);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &ngroups) < 0) {
    groups.resize(ngroups);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &ngroups) < 0) return false;
  }
  for (int i = 0; i < ngroups; ++i) {
    if (groups[i] == gid) return true;
  }
  return false;
}

bool AdminPolicy::IsAdmin(uid_t uid) {
  if (uid == 0 || uid == daemon_uid_) return true;
  if (admin_gid_ == static_cast<gid_t>(-1)) return false;
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(uid);
    if (it != cache_.end() && now - it->second.second < absl::Minutes(1)) return it->second.first;
  }
  const bool admin = UidInGroup(uid, admin_gid_);
  absl::MutexLock lock(&mu_);
  cache_[uid] = {admin, now};
  return admin;
}

void PeerTable::Set(int fd, const PeerCredentials& peer) {
  absl::MutexLock lock(&mu_);
  peers_[fd] = peer;
}

std::optional<PeerCredentials> PeerTable::Get(int fd) const {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<TcpToken> LoadTcpToken(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("tcp_token_file ", path, " cannot be opened (symlinks are refused)"));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("tcp_token_file ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("tcp_token_file ", path, " is not a regular file"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH | S_IROTH | S_IXOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tcp_token_file ", path, " has mode ", absl::StrFormat("%04o", st.st_mode & 07777),
        "; it must not be writable by group or others nor readable by others: chmod 600 or 640"));
  }
  std::string text(4096, '\0');
  ssize_t got = read(fd.get(), text.data(), text.size());
  if (got < 0) return ErrnoToStatus(errno, absl::StrCat("reading tcp_token_file ", path));
  text.resize(static_cast<size_t>(got));
  const std::string secret(absl::StripAsciiWhitespace(text));
  if (secret.size() < 16 || secret.find_first_of(" \t\r\n") != std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tcp_token_file ", path, " must hold one token of at least 16 characters without spaces"));
  }
  return TcpToken{secret, st.st_uid};
}

absl::StatusOr<Caller> CallerResolver::Resolve(const grpc::ServerContext& context) const {
  const std::string peer = context.peer();
  absl::string_view rest = peer;
  if (absl::ConsumePrefix(&rest, "fd:")) {
    int fd = -1;
    if (absl::SimpleAtoi(rest, &fd)) {
      if (auto creds = peers_->Get(fd); creds.has_value()) {
        return Caller{creds->uid, admins_->IsAdmin(creds->uid)};
      }
    }
    return absl::UnauthenticatedError(absl::StrCat("connection ", peer, " has no recorded peer credentials"));
  }
  // Any other transport (TCP) must present the token.
  if (!tcp_token_.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat("calls from ", peer, " are not authenticated; use the Unix socket"));
  }
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("TCP calls need the metadata 'authorization: Bearer <token of tcp_token_file>'");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ") || !ConstantTimeEquals(value, tcp_token_->secret)) {
    return absl::UnauthenticatedError("the TCP token is wrong");
  }
  return Caller{tcp_token_->owner, admins_->IsAdmin(tcp_token_->owner)};
}

}  // namespace strata
