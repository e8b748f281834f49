#include "daemon/job_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// 128 random bits from the kernel, hex-encoded.
std::string NewToken() {
  unsigned char bytes[16] = {};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t got = read(fd, bytes, sizeof(bytes));
    (void)got;
    close(fd);
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes)));
}

}  // namespace

JobRegistry::JobRegistry(JobServices services, Clock* clock, absl::Duration lease_timeout,
                         absl::Duration reattach_timeout)
    : services_(services), clock_(clock), lease_timeout_(lease_timeout), reattach_timeout_(reattach_timeout) {}

uint64_t JobRegistry::NextJobId() {
  absl::MutexLock lock(&mu_);
  return next_job_id_++;
}

void JobRegistry::ReserveJobIdsBelow(uint64_t id) {
  absl::MutexLock lock(&mu_);
  next_job_id_ = std::max(next_job_id_, id);
}

absl::StatusOr<std::pair<std::shared_ptr<Job>, bool>> JobRegistry::CreateJob(JobSettings settings,
                                                                            bool attach_if_exists) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("the daemon is draining and accepts no new jobs");
    auto it = jobs_.find(settings.name);
    if (it != jobs_.end()) {
      const JobSettings& have = it->second->settings();
      if (attach_if_exists && have.world_size == settings.world_size && have.mode == settings.mode) {
        return std::make_pair(it->second, true);
      }
      return absl::AlreadyExistsError(absl::StrCat(
          "job '", settings.name, "' already exists (world size ", have.world_size,
          "); choose another name, delete it, or pass attach_if_exists with the same shape"));
    }
  }
  const uint64_t id = NextJobId();
  auto job = Job::Create(id, std::move(settings), services_);
  if (!job.ok()) return job.status();
  std::shared_ptr<Job> shared = std::move(*job);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = jobs_.emplace(shared->settings().name, shared);
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("job '", shared->settings().name, "' already exists"));
  }
  job_last_attached_[id] = clock_->Now();
  return std::make_pair(shared, false);
}

absl::Status JobRegistry::AddJob(std::shared_ptr<Job> job) {
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the daemon is draining and accepts no new jobs");
  const std::string name = job->settings().name;
  if (jobs_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("job '", name, "' already exists; choose another name"));
  }
  job_last_attached_[job->id()] = clock_->Now();
  jobs_.emplace(name, std::move(job));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::FindJob(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job named '", name, "'; `strata jobs` lists them"));
  }
  return it->second;
}

absl::Status JobRegistry::DeleteJob(const std::string& name) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(name);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
    job = it->second;
    std::vector<uint64_t> ended;
    for (const auto& [sid, s] : sessions_) {
      if (s.job_id == job->id()) ended.push_back(sid);
    }
    for (uint64_t sid : ended) EndSessionLocked(sid);
    jobs_.erase(it);
  }
  job->Stop();
  return absl::OkStatus();
}

std::vector<std::shared_ptr<Job>> JobRegistry::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& [name, job] : jobs_) out.push_back(job);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return out;
}

uint32_t JobRegistry::AttachedRanks(uint64_t job_id) const {
  absl::MutexLock lock(&mu_);
  uint32_t n = 0;
  for (const auto& [key, sid] : rank_sessions_) n += key.first == job_id ? 1 : 0;
  return n;
}

void JobRegistry::EndSessionLocked(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  const Session s = it->second;
  sessions_.erase(it);
  auto rs = rank_sessions_.find({s.job_id, s.rank});
  if (rs != rank_sessions_.end() && rs->second == session_id) {
    rank_sessions_.erase(rs);
    job_last_attached_[s.job_id] = clock_->Now();
  }
  for (auto& [name, job] : jobs_) {
    if (job->id() == s.job_id) job->DropPins(s.rank);
  }
}

absl::StatusOr<AttachResult> JobRegistry::Attach(const std::string& job_name, uint32_t rank) {
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the daemon is draining and accepts no new attaches");
  auto it = jobs_.find(job_name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job named '", job_name, "'; create it first"));
  }
  std::shared_ptr<Job> job = it->second;
  if (rank >= job->settings().world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is out of range for job '", job_name,
                                                   "' of world size ", job->settings().world_size));
  }
  if (!job->settings().IsLocal(rank)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of job '", job_name,
                                                   "' is served by another daemon (not in this one's local_ranks)"));
  }
  AttachResult result;
  result.job = job;
  // A new session of a rank replaces the old one: the usual reason is that
  // the trainer process died and was restarted.
  if (auto rs = rank_sessions_.find({job->id(), rank}); rs != rank_sessions_.end()) {
    EndSessionLocked(rs->second);
  }
  result.reattached = job->registered();
  result.session_id = next_session_id_++;
  sessions_[result.session_id] = Session{job->id(), rank, clock_->Now()};
  rank_sessions_[{job->id(), rank}] = result.session_id;
  result.fd_token = NewToken();
  tokens_[result.fd_token] = Token{result.session_id, clock_->Now() + lease_timeout_};
  return result;
}

absl::StatusOr<SessionRef> JobRegistry::Touch(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "session ", session_id, " is not attached (it detached, its lease expired, or a newer "
        "session of the same rank replaced it); attach again"));
  }
  it->second.last_seen = clock_->Now();
  for (const auto& [name, job] : jobs_) {
    if (job->id() == it->second.job_id) return SessionRef{job, it->second.rank, session_id};
  }
  return absl::NotFoundError("the session's job was deleted");
}

absl::Status JobRegistry::Detach(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  if (!sessions_.contains(session_id)) {
    return absl::NotFoundError(absl::StrCat("session ", session_id, " is not attached"));
  }
  EndSessionLocked(session_id);
  return absl::OkStatus();
}

absl::StatusOr<SessionRef> JobRegistry::RedeemToken(const std::string& token) {
  uint64_t session_id;
  {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) return absl::PermissionDeniedError("unknown or already used fd token");
    const bool expired = clock_->Now() > it->second.expires;
    session_id = it->second.session_id;
    tokens_.erase(it);
    if (expired) return absl::PermissionDeniedError("the fd token expired; attach again");
  }
  return Touch(session_id);
}

std::vector<std::string> JobRegistry::Expire() {
  std::vector<std::string> log;
  std::vector<std::shared_ptr<Job>> abandoned;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    std::vector<uint64_t> expired;
    for (const auto& [sid, s] : sessions_) {
      if (now - s.last_seen > lease_timeout_) expired.push_back(sid);
    }
    for (uint64_t sid : expired) {
      const Session s = sessions_[sid];
      log.push_back(absl::StrCat("session ", sid, " (job ", s.job_id, " rank ", s.rank,
                                 ") missed its lease; its pins are dropped, its state is kept"));
      EndSessionLocked(sid);
    }
    for (auto it = tokens_.begin(); it != tokens_.end();) {
      if (now > it->second.expires) tokens_.erase(it++);
      else ++it;
    }
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      const uint64_t id = it->second->id();
      bool attached = false;
      for (const auto& [key, sid] : rank_sessions_) attached = attached || key.first == id;
      if (!attached && now - job_last_attached_[id] > reattach_timeout_) {
        log.push_back(absl::StrCat("job '", it->first, "' had no rank attached for ",
                                   absl::FormatDuration(reattach_timeout_), "; deleted"));
        abandoned.push_back(it->second);
        jobs_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& job : abandoned) job->Stop();
  return log;
}

void JobRegistry::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool JobRegistry::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

}  // namespace strata
