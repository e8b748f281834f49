#include "daemon/job_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/random_id.h"
#include "daemon/job_recovery.h"
#include "tiers/tier.h"

namespace strata {
namespace {

absl::Status NotYours(const Job& job, const Caller& caller, absl::string_view what) {
  return absl::PermissionDeniedError(absl::StrCat(
      "job '", job.settings().name, "' belongs to uid ", job.settings().owner_uid, "; uid ", caller.uid,
      " may not ", what, " it (only its owner, root, the daemon's user or the admin group may)"));
}

}  // namespace

bool MayManage(const Caller& caller, const Job& job) {
  return caller.admin || caller.uid == job.settings().owner_uid;
}

JobRegistry::JobRegistry(JobServices services, Clock* clock, absl::Duration lease_timeout,
                         absl::Duration reattach_timeout, uint32_t max_jobs_per_uid)
    : services_(services),
      clock_(clock),
      lease_timeout_(lease_timeout),
      reattach_timeout_(reattach_timeout),
      max_jobs_per_uid_(max_jobs_per_uid) {}

absl::StatusOr<uint64_t> JobRegistry::NextJobIdLocked() {
  while (true) {
    auto id = RandomId64();
    if (!id.ok()) return id.status();
    if (used_job_ids_.insert(*id).second) return *id;
  }
}

absl::StatusOr<uint64_t> JobRegistry::NextJobId() {
  absl::MutexLock lock(&mu_);
  return NextJobIdLocked();
}

void JobRegistry::ReserveJobId(uint64_t id) {
  absl::MutexLock lock(&mu_);
  used_job_ids_.insert(id);
}

absl::Status JobRegistry::CheckJobCapLocked(uid_t owner) const {
  uint32_t owned = 0;
  for (const auto& [name, job] : jobs_) owned += job->settings().owner_uid == owner ? 1 : 0;
  if (owned >= max_jobs_per_uid_) {
    return absl::ResourceExhaustedError(absl::StrCat("uid ", owner, " already has ", owned,
                                                     " jobs; max_jobs_per_uid is ", max_jobs_per_uid_,
                                                     ": delete one first"));
  }
  return absl::OkStatus();
}

uint64_t JobRegistry::DeviceBudgetsLocked() const {
  uint64_t sum = 0;
  // Each budget was admitted below the capacity, so the sum cannot wrap.
  for (const auto& [name, job] : jobs_) sum += job->settings().device_budget_bytes;
  return sum;
}

uint64_t JobRegistry::DeviceBudgetsBytes() const {
  absl::MutexLock lock(&mu_);
  return DeviceBudgetsLocked();
}

absl::Status JobRegistry::CheckDeviceBudgetLocked(const JobSettings& settings) const {
  const uint64_t want = settings.device_budget_bytes;
  if (want == 0) return absl::OkStatus();
  if (services_.device == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", settings.name, "' asks for a device budget of ", FormatBytes(want),
        " but this daemon has no device tier (started with --device none); start stratad with --device "
        "auto|cuda|emulated and --device_capacity, or create the job with device_budget_bytes 0"));
  }
  const uint64_t capacity = services_.device->capacity_bytes();
  const uint64_t promised = DeviceBudgetsLocked();
  const uint64_t free = capacity - std::min(capacity, promised);
  if (want > free) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", settings.name, "': device budget of ", FormatBytes(want), " (", want, " bytes) requested, ",
        FormatBytes(free), " (", free, " bytes) free of the device tier's --device_capacity ", FormatBytes(capacity),
        " (", capacity, " bytes; ", FormatBytes(promised), " promised to live jobs)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::shared_ptr<Job>, bool>> JobRegistry::CreateJob(JobSettings settings,
                                                                            bool attach_if_exists,
                                                                            const Caller& caller) {
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("the daemon is draining and accepts no new jobs");
    auto it = jobs_.find(settings.name);
    if (it != jobs_.end()) {
      const JobSettings& have = it->second->settings();
      if (attach_if_exists && have.world_size == settings.world_size && have.mode == settings.mode) {
        if (!MayManage(caller, *it->second)) return NotYours(*it->second, caller, "attach to");
        return std::make_pair(it->second, true);
      }
      return absl::AlreadyExistsError(absl::StrCat(
          "job '", settings.name, "' already exists (world size ", have.world_size,
          "); choose another name, delete it, or pass attach_if_exists with the same shape"));
    }
    if (absl::Status s = CheckJobCapLocked(settings.owner_uid); !s.ok()) return s;
    if (absl::Status s = CheckDeviceBudgetLocked(settings); !s.ok()) return s;
    auto next = NextJobIdLocked();
    if (!next.ok()) return next.status();
    id = *next;
  }
  auto job = Job::Create(id, std::move(settings), services_);
  if (!job.ok()) return job.status();
  std::shared_ptr<Job> shared = std::move(*job);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckJobCapLocked(shared->settings().owner_uid); !s.ok()) return s;
  // Again: another job may have taken the room while this one was built.
  if (absl::Status s = CheckDeviceBudgetLocked(shared->settings()); !s.ok()) return s;
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
  if (absl::Status s = CheckJobCapLocked(job->settings().owner_uid); !s.ok()) return s;
  if (absl::Status s = CheckDeviceBudgetLocked(job->settings()); !s.ok()) return s;
  used_job_ids_.insert(job->id());
  job_last_attached_[job->id()] = clock_->Now();
  jobs_.emplace(name, std::move(job));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::FindJob(const std::string& name, const Caller& caller) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job named '", name, "'; `strata jobs` lists them"));
  }
  if (!MayManage(caller, *it->second)) return NotYours(*it->second, caller, "use");
  return it->second;
}

absl::Status JobRegistry::DeleteJob(const std::string& name, const Caller& caller) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(name);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
    if (!MayManage(caller, *it->second)) return NotYours(*it->second, caller, "delete");
    job = it->second;
    std::vector<uint64_t> ended;
    for (const auto& [sid, s] : sessions_) {
      if (s.job_id == job->id()) ended.push_back(sid);
    }
    for (uint64_t sid : ended) EndSessionLocked(sid);
    jobs_.erase(it);
  }
  job->Stop();
  // Durably: a deleted job must not come back after a restart.
  if (absl::Status s = job->Retire(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("job '", name, "' is deleted, but removing its state from NVMe failed: ",
                                               s.message(), "; it may reappear after a restart"));
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<Job>> JobRegistry::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& [name, job] : jobs_) out.push_back(job);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->settings().name < b->settings().name; });
  return out;
}

std::vector<std::shared_ptr<Job>> JobRegistry::JobsOf(const Caller& caller) const {
  std::vector<std::shared_ptr<Job>> out = Jobs();
  out.erase(std::remove_if(out.begin(), out.end(), [&](const auto& job) { return !MayManage(caller, *job); }),
            out.end());
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

absl::Status JobRegistry::ReloadFailedJob(const std::string& name, const std::shared_ptr<Job>& failed) {
  absl::MutexLock reload_lock(&reload_mu_);
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(name);
    if (it == jobs_.end() || it->second != failed) return absl::OkStatus();  // reloaded or deleted meanwhile
    // The failed job's sessions end first: their calls now fail with "attach again".
    std::vector<uint64_t> ended;
    for (const auto& [sid, s] : sessions_) {
      if (s.job_id == failed->id()) ended.push_back(sid);
    }
    for (uint64_t sid : ended) EndSessionLocked(sid);
  }
  failed->Supersede();
  absl::StatusOr<std::unique_ptr<Job>> restored = RestoreCommittedJob(services_.nvme, failed->id(), services_);
  if (!restored.ok()) {
    return absl::Status(restored.status().code(),
                        absl::StrCat("job '", name, "' failed on NVMe and reloading its last committed step failed "
                                     "too: ", restored.status().message(), "; attach again to retry, or restore "
                                     "it from a checkpoint (LoadCheckpoint)"));
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(name);
  if (it != jobs_.end() && it->second == failed) it->second = std::move(*restored);
  return absl::OkStatus();
}

absl::StatusOr<AttachResult> JobRegistry::Attach(const std::string& job_name, uint32_t rank, const Caller& caller) {
  {
    std::shared_ptr<Job> failed;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_name);
      if (it != jobs_.end() && MayManage(caller, *it->second) && services_.nvme != nullptr &&
          it->second->NeedsReload()) {
        failed = it->second;
      }
    }
    if (failed != nullptr) {
      if (absl::Status s = ReloadFailedJob(job_name, failed); !s.ok()) return s;
    }
  }
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the daemon is draining and accepts no new attaches");
  auto it = jobs_.find(job_name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job named '", job_name, "'; create it first"));
  }
  std::shared_ptr<Job> job = it->second;
  if (!MayManage(caller, *job)) return NotYours(*job, caller, "attach to");
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
  uint64_t session_id = 0;
  while (session_id == 0 || sessions_.contains(session_id)) {
    auto id = RandomId64();
    if (!id.ok()) return id.status();
    session_id = *id;
  }
  auto token = RandomHexToken(16);
  if (!token.ok()) return token.status();
  // A new session of a rank replaces the old one: the usual reason is that
  // the trainer process died and was restarted.
  if (auto rs = rank_sessions_.find({job->id(), rank}); rs != rank_sessions_.end()) {
    EndSessionLocked(rs->second);
  }
  result.reattached = job->registered();
  result.session_id = session_id;
  sessions_[result.session_id] = Session{job->id(), rank, clock_->Now(), caller.uid};
  rank_sessions_[{job->id(), rank}] = result.session_id;
  result.fd_token = *token;
  tokens_[result.fd_token] = Token{result.session_id, clock_->Now() + lease_timeout_};
  return result;
}

absl::StatusOr<SessionRef> JobRegistry::Touch(uint64_t session_id, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  // A session of another uid is reported exactly like an unknown one: ids are
  // random, and the answer must not confirm a guess.
  if (it == sessions_.end() || (it->second.uid != caller.uid && !caller.admin)) {
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

absl::Status JobRegistry::Detach(uint64_t session_id, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || (it->second.uid != caller.uid && !caller.admin)) {
    return absl::NotFoundError(absl::StrCat("session ", session_id, " is not attached"));
  }
  EndSessionLocked(session_id);
  return absl::OkStatus();
}

absl::StatusOr<SessionRef> JobRegistry::RedeemToken(const std::string& token, const Caller& peer) {
  uint64_t session_id;
  {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) return absl::PermissionDeniedError("unknown or already used fd token");
    const bool expired = clock_->Now() > it->second.expires;
    session_id = it->second.session_id;
    tokens_.erase(it);
    if (expired) return absl::PermissionDeniedError("the fd token expired; attach again");
    auto s = sessions_.find(session_id);
    if (s != sessions_.end() && s->second.uid != peer.uid && !peer.admin) {
      return absl::PermissionDeniedError(absl::StrCat("the fd token was issued to uid ", s->second.uid,
                                                      ", not to uid ", peer.uid));
    }
  }
  return Touch(session_id, peer);
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
  for (auto& job : abandoned) {
    job->Stop();
    if (absl::Status s = job->Retire(); !s.ok()) {
      log.push_back(absl::StrCat("job '", job->settings().name, "': removing its state from NVMe failed: ",
                                 s.message()));
    }
  }
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
