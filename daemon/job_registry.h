// JobRegistry: the daemon's jobs and the sessions of the ranks attached to
// them. A session is one trainer process's attachment; it ends when the
// trainer detaches, when its lease runs out (no call or heartbeat within the
// lease timeout), or when a new session of the same rank replaces it (a
// restarted trainer). Ending a session drops its pins, never the job's state.
// A job with no attached rank for longer than the reattach timeout is deleted.
// Jobs with a device budget are admitted only while the budgets of all live
// jobs fit the device tier (see CheckDeviceBudgetLocked).
// Deleting a job (either way) retires it: its NVMe record and shards are
// removed in one commit, so it stays deleted after a restart.
//
// Thread-safe.
#ifndef STRATA_DAEMON_JOB_REGISTRY_H_
#define STRATA_DAEMON_JOB_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "daemon/caller.h"
#include "daemon/job.h"

namespace strata {

struct SessionRef {
  std::shared_ptr<Job> job;
  uint32_t rank = 0;
  uint64_t session_id = 0;
};

// Whether `caller` may manage `job`: its owner or an admin.
bool MayManage(const Caller& caller, const Job& job);

struct AttachResult {
  std::shared_ptr<Job> job;
  uint64_t session_id = 0;
  std::string fd_token;
  bool reattached = false;
};

class JobRegistry {
 public:
  // `max_jobs_per_uid` caps the live jobs one uid owns (admins too).
  JobRegistry(JobServices services, Clock* clock, absl::Duration lease_timeout,
              absl::Duration reattach_timeout, uint32_t max_jobs_per_uid = 64);

  // AlreadyExists when the name is taken, unless `attach_if_exists` and the
  // existing job has the same world size and mode and the caller may manage
  // it (then it is returned). Unavailable while draining; ResourceExhausted
  // past max_jobs_per_uid. The job's owner is settings.owner_uid.
  absl::StatusOr<std::pair<std::shared_ptr<Job>, bool>> CreateJob(JobSettings settings,
                                                                  bool attach_if_exists,
                                                                  const Caller& caller);
  absl::Status AddJob(std::shared_ptr<Job> job);  // loaded from a checkpoint or restored
  // NotFound, or PermissionDenied when the caller may not manage the job.
  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& name, const Caller& caller) const;
  absl::Status DeleteJob(const std::string& name, const Caller& caller);
  std::vector<std::shared_ptr<Job>> Jobs() const;
  // The jobs `caller` may manage (all of them for an admin).
  std::vector<std::shared_ptr<Job>> JobsOf(const Caller& caller) const;
  uint32_t AttachedRanks(uint64_t job_id) const;
  // The sum of the live jobs' device budgets: what they hold of the device
  // tier's capacity (--device_capacity). A deleted job's budget comes back.
  uint64_t DeviceBudgetsBytes() const;

  // A ZeRO-Infinity job whose step failed on an NVMe fault (Job::NeedsReload)
  // is first replaced by a copy restored from its last commit: its old
  // sessions end, and the trainers resume from that step as after a restart.
  absl::StatusOr<AttachResult> Attach(const std::string& job, uint32_t rank, const Caller& caller);
  // Resolves a session and renews its lease. NotFound (saying why) for an
  // unknown, expired or replaced session, and for one another uid attached.
  absl::StatusOr<SessionRef> Touch(uint64_t session_id, const Caller& caller);
  absl::Status Detach(uint64_t session_id, const Caller& caller);
  // The rank a one-time fd token was issued for; the token is spent.
  // PermissionDenied unless `peer_uid` attached the session (or is an admin).
  absl::StatusOr<SessionRef> RedeemToken(const std::string& token, const Caller& peer);

  // Ends sessions past their lease and deletes jobs abandoned past the
  // reattach timeout. Returns a line per thing it did, for the log.
  std::vector<std::string> Expire();

  void StartDraining();
  bool draining() const;
  // A fresh random job id, not used by a live job nor reserved.
  absl::StatusOr<uint64_t> NextJobId();
  // `id` is taken (a job found on NVMe at startup, restored or not).
  void ReserveJobId(uint64_t id);

 private:
  struct Session {
    uint64_t job_id = 0;
    uint32_t rank = 0;
    absl::Time last_seen;
    uid_t uid = 0;  // who attached
  };
  struct Token {
    uint64_t session_id = 0;
    absl::Time expires;
  };
  void EndSessionLocked(uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> NextJobIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckJobCapLocked(uid_t owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Device-budget admission: FailedPrecondition naming --device when the
  // daemon has no device tier, ResourceExhausted naming requested, free and
  // capacity when the live jobs' budgets plus this one exceed the tier.
  absl::Status CheckDeviceBudgetLocked(const JobSettings& settings) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t DeviceBudgetsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // See Attach. Does NVMe I/O; holds only reload_mu_ meanwhile.
  absl::Status ReloadFailedJob(const std::string& name, const std::shared_ptr<Job>& failed)
      ABSL_LOCKS_EXCLUDED(mu_);

  const JobServices services_;
  Clock* const clock_;
  const absl::Duration lease_timeout_;
  const absl::Duration reattach_timeout_;
  const uint32_t max_jobs_per_uid_;

  // One reload at a time, so two ranks attaching at once restore the job once.
  absl::Mutex reload_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  // (job id, rank) -> live session id
  absl::flat_hash_map<std::pair<uint64_t, uint32_t>, uint64_t> rank_sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Time> job_last_attached_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Token> tokens_ ABSL_GUARDED_BY(mu_);
  // Ids handed out this run or found on NVMe: never reused.
  absl::flat_hash_set<uint64_t> used_job_ids_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_REGISTRY_H_
