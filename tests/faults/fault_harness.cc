// Fault harness (issue 11): the fault-injecting I/O engine under a running
// daemon. For each fault kind, two ZeRO-Infinity jobs step concurrently on
// the test-only stratad-faults, with a --fault_plan that hits only the first
// job's NVMe I/O. Per case:
//   1. a clean daemon: both jobs are created, initialized and stepped
//      kWarmSteps steps; a checkpoint of each is saved; the daemon stops;
//   2. the daemon restarts with the plan (tag = the victim's job id); both
//      jobs resume and step to --steps. The victim either never notices
//      (short transfers: the engine resubmits; latency) or gets a clear
//      error -- the right gRPC code, the errno or checksum named, and what to
//      do -- and resumes by re-attaching (the daemon reloads it from its last
//      committed step) or, when its committed state itself is damaged (a
//      torn write the device acknowledged), from its checkpoint. The other
//      job must never see an error;
//   3. both jobs are checked bit for bit (masters, both Adam moments, params)
//      against a local reference, through a checkpoint; the daemon must exit
//      0 on SIGTERM and its log must show that the fault fired;
//   4. a third daemon start without faults: both jobs come back at their
//      final step and again equal the reference -- nothing torn was committed.
//
//   strata-fault-harness --stratad_faults PATH --dir DIR [--steps N] [--long] [--json FILE] [--only KIND]
//
// --long repeats every kind with the fault at each of the first 12 I/O
// requests of the victim (and 16 steps). Exit 0 when every case passed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/strata_client.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "tests/infinity_job.h"
#include "tests/reference_model.h"

namespace strata::faults {
namespace {

using namespace ::strata::reference;  // the model, its reference and the checkpoint check

constexpr uint64_t kWarmSteps = 2;

// What the victim job is expected to go through.
enum class Expect {
  kTransparent,  // no error at all; the results are still bit-identical
  kReattach,     // an error; re-attaching resumes from the last committed step
  kResume,       // an error; retrying the call (Acquire) or re-attaching resumes; or,
                 // when the failed read was a prefetch, no error at all
  kCheckpoint,   // an error the committed state cannot fix; resume from the checkpoint
  kRestart,      // an error, then the daemon is restarted: the job is back at its last committed step
};

struct FaultCase {
  std::string kind;      // the table's "fault kind"
  std::string rule;      // the --fault_plan rule, without tag=
  Expect expect;
  absl::StatusCode code;  // kReattach / kCheckpoint: the error's code
  std::string must_say;   // ... and a phrase its message must hold
  std::string fired;      // the "faults fired" counter that must be > 0
  // Stop the daemon (SIGTERM) right after the victim's first error, restart
  // it without faults, and check both jobs at the steps they had reached:
  // the failed step must not have become durable with the shutdown's commit.
  bool stop_on_error = false;
};

std::vector<FaultCase> Cases(uint64_t after) {
  const std::string a = absl::StrCat(",after=", after);
  return {
      {"EIO on read", "op=read,kind=eio" + a, Expect::kResume, absl::StatusCode::kDataLoss, "EIO", "eio"},
      {"EIO on write", "op=write,kind=eio" + a, Expect::kReattach, absl::StatusCode::kDataLoss, "EIO", "eio"},
      {"EIO on write, then SIGTERM", "op=write,kind=eio" + a, Expect::kRestart, absl::StatusCode::kDataLoss, "EIO",
       "eio", true},
      {"ENOSPC on write", "op=write,kind=enospc" + a, Expect::kReattach, absl::StatusCode::kResourceExhausted,
       "ENOSPC", "enospc"},
      {"short write (kernel)", "op=write,kind=short,run=8" + a, Expect::kTransparent, absl::StatusCode::kOk, "",
       "short (applied)"},
      {"short read (kernel)", "op=read,kind=short,run=8" + a, Expect::kTransparent, absl::StatusCode::kOk, "",
       "short (applied)"},
      {"torn write (EIO)", "op=write,kind=torn,torn_bytes=4096" + a, Expect::kReattach,
       absl::StatusCode::kDataLoss, "torn after", "torn"},
      {"torn write (EIO), then SIGTERM", "op=write,kind=torn,torn_bytes=4096" + a, Expect::kRestart,
       absl::StatusCode::kDataLoss, "torn after", "torn", true},
      {"torn write (silent)", "op=write,kind=torn_silent,torn_bytes=4096,run=1000" + a, Expect::kCheckpoint,
       absl::StatusCode::kDataLoss, "checksum mismatch", "torn"},
      {"latency 30 ms", "kind=delay,delay_ms=30,run=40" + a, Expect::kTransparent, absl::StatusCode::kOk, "",
       "delay"},
  };
}

struct JobState {
  std::string name;
  uint64_t seed = 0;
  uint64_t id = 0;
  std::string checkpoint;  // saved after the warm-up
  std::unique_ptr<StrataClient> client;
  std::vector<std::unique_ptr<RankSession>> ranks;
  uint64_t next = 0;  // the step the job is at
  // What happened while faults were on.
  std::vector<absl::Status> errors;
  std::vector<std::string> resumptions;  // "re-attached at step 3", "checkpoint at step 2"
  double seconds = 0;
};

struct CaseResult {
  std::string kind, rule, victim, bystander;
  bool pass = false;
  std::string detail;
};

class Harness {
 public:
  Harness(std::string binary, std::string dir, uint64_t steps)
      : binary_(std::move(binary)), dir_(std::move(dir)), steps_(steps), opt_(*CpuOptimizer::Create({})) {}

  CaseResult Run(const FaultCase& fc, int index) {
    CaseResult res{fc.kind, fc.rule, "", "", false, ""};
    case_dir_ = absl::StrCat(dir_, "/case", index);
    std::filesystem::remove_all(case_dir_);
    std::filesystem::create_directories(case_dir_ + "/nvme");
    std::filesystem::create_directories(case_dir_ + "/ckpt");
    std::string e = RunCase(fc, &res);
    StopDaemon(nullptr);
    if (!e.empty()) {
      res.pass = false;
      res.detail = absl::StrCat(e, " (daemon log: ", log(), ")");
    } else {
      res.pass = true;
      std::filesystem::remove_all(case_dir_);
    }
    return res;
  }

 private:
  std::string socket() const { return case_dir_ + "/s.sock"; }
  std::string log() const { return case_dir_ + "/stratad.log"; }

  std::string StartDaemon(const std::string& plan) {
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = freopen(log().c_str(), "a", stderr);
      (void)out;
      std::vector<std::string> args = {binary_, "--socket", socket(), "--nvme_path", case_dir_ + "/nvme",
                                       "--nvme_capacity", "128MiB", "--pinned_capacity", "64MiB", "--device",
                                       "emulated", "--optimizer_threads", "1", "--checkpoint_root",
                                       case_dir_ + "/ckpt"};
      if (!plan.empty()) args.push_back("--fault_plan=" + plan);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary_.c_str(), argv.data());
      _exit(127);
    }
    for (int i = 0; i < 400; ++i) {
      if (Connect() != nullptr) return "";
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "stratad-faults exited at startup";
      }
      absl::SleepFor(absl::Milliseconds(25));
    }
    return "stratad-faults did not answer";
  }

  // SIGTERM; "" when it exited 0.
  std::string StopDaemon(std::string* summary) {
    if (pid_ <= 0) return "";
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (summary != nullptr) {
      const std::string text = ReadWholeFile(log());
      const size_t at = text.rfind("faults fired:");
      *summary = at == std::string::npos ? "" : text.substr(at, text.find('\n', at) - at);
    }
    if (WIFSIGNALED(status)) return absl::StrCat("the daemon died of signal ", WTERMSIG(status));
    if (WEXITSTATUS(status) != 0) return absl::StrCat("the daemon exited ", WEXITSTATUS(status));
    return "";
  }

  std::unique_ptr<StrataClient> Connect() {
    ClientOptions o;
    o.socket_path = socket();
    o.rpc_timeout = absl::Seconds(20);
    o.step_timeout = absl::Seconds(30);
    auto c = StrataClient::Connect(o);
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Attaches both ranks and registers; InitParams only for a new job.
  absl::Status Attach(JobState& j, bool fresh) {
    j.ranks.clear();
    for (uint32_t r = 0; r < 2; ++r) {
      auto s = j.client->Attach(j.name, r);
      if (!s.ok()) return s.status();
      j.ranks.push_back(std::move(*s));
      if (absl::Status st = j.ranks[r]->RegisterTensors(Model()); !st.ok()) return st;
      if (fresh) {
        for (ShardView& shard : j.ranks[r]->shards()) {
          FillOwned(shard, shard.param, [&](uint32_t t, uint64_t e) { return InitialParam(t, e, j.seed); });
        }
      }
    }
    if (layouts_.empty()) {
      for (uint32_t r = 0; r < 2; ++r) {
        std::vector<ShardView> shards(j.ranks[r]->shards().begin(), j.ranks[r]->shards().end());
        for (ShardView& v : shards) v.grad = v.param = nullptr;
        layouts_.push_back(std::move(shards));
      }
    }
    if (fresh) {
      for (uint32_t r = 0; r < 2; ++r) {
        if (absl::Status st = j.ranks[r]->InitParams(); !st.ok()) return st;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Step(JobState& j) {
    const uint64_t step = j.next;
    for (uint32_t r = 0; r < 2; ++r) {
      const uint32_t n = static_cast<uint32_t>(j.ranks[r]->shards().size());
      for (uint32_t i = 0; i < n; ++i) {
        if (absl::Status st = j.ranks[r]->Acquire({i}); !st.ok()) return st;
        if (absl::Status st = j.ranks[r]->Release({i}); !st.ok()) return st;
      }
      if (absl::Status st = j.ranks[r]->IterationBoundary(); !st.ok()) return st;
      for (ShardView& shard : j.ranks[r]->shards()) {
        FillOwned(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, step, j.seed); });
        if (absl::Status st = j.ranks[r]->GradReady(shard.index, step); !st.ok()) return st;
      }
    }
    for (uint32_t r = 0; r < 2; ++r) {
      if (auto res = j.ranks[r]->WaitStep(step); !res.ok()) return res.status();
    }
    ++j.next;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> StepOf(JobState& j) {
    auto jobs = j.client->ListJobs();
    if (!jobs.ok()) return jobs.status();
    for (const JobSummary& s : *jobs) {
      if (s.name == j.name) return s.step;
    }
    return absl::NotFoundError(absl::StrCat("job ", j.name, " is not listed"));
  }

  // Steps `j` to steps_, recovering from errors as a trainer would. The
  // bystander (recover == false) must not see any.
  // With `stop`: ends at a step boundary once *stop is set, and (the victim)
  // sets it at its first error instead of recovering.
  std::string Drive(JobState& j, bool recover, std::atomic<bool>* stop = nullptr) {
    const absl::Time start = absl::Now();
    int recoveries = 0;
    while (j.next < steps_ && !(stop != nullptr && *stop)) {
      absl::Status st = Step(j);
      if (st.ok()) continue;
      j.errors.push_back(st);
      if (!recover) return absl::StrCat(j.name, " (not faulted) failed at step ", j.next, ": ", st.ToString());
      if (stop != nullptr) {
        *stop = true;
        j.resumptions.push_back(absl::StrCat("daemon restarted: back at step ", j.next));
        break;
      }
      if (++recoveries > 4) return absl::StrCat(j.name, ": still failing after 4 recoveries: ", st.ToString());
      const uint64_t failed_at = j.next;
      const bool damaged = absl::StrContains(st.message(), "checksum mismatch");
      if (!damaged && absl::StrContains(st.message(), "Acquire again")) {
        // A failed read changed nothing: redo the step's calls on the same sessions.
        j.resumptions.push_back(absl::StrCat("retried step ", j.next));
      } else if (!damaged) {
        // Re-attach: the daemon reloads the job from its last committed step.
        if (absl::Status a = Attach(j, false); !a.ok()) {
          j.errors.push_back(a);
          continue;  // the next Step fails on the dead sessions and tries again
        }
        auto at = StepOf(j);
        if (!at.ok()) return absl::StrCat(j.name, ": ListJobs after re-attach: ", at.status().ToString());
        if (*at != failed_at) {
          // Steps before the failed one were acknowledged, so committed.
          return absl::StrCat(j.name, " failed at step ", failed_at, " but came back at step ", *at,
                              "; its last committed step ends at ", failed_at);
        }
        j.next = *at;
        j.resumptions.push_back(absl::StrCat("re-attached at step ", *at));
      } else {
        // The committed state itself is damaged: restore from the checkpoint.
        j.ranks.clear();
        if (absl::Status d = j.client->DeleteJob(j.name); !d.ok()) {
          return absl::StrCat(j.name, ": DeleteJob: ", d.ToString());
        }
        auto id = j.client->LoadCheckpoint(j.checkpoint, j.name);
        if (!id.ok()) return absl::StrCat(j.name, ": LoadCheckpoint: ", id.status().ToString());
        if (absl::Status a = Attach(j, false); !a.ok()) return absl::StrCat(j.name, ": attach: ", a.ToString());
        auto at = StepOf(j);
        if (!at.ok()) return absl::StrCat(j.name, ": ListJobs: ", at.status().ToString());
        j.next = *at;
        j.resumptions.push_back(absl::StrCat("checkpoint at step ", *at));
      }
    }
    j.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return "";
  }

  std::string Verify(JobState& j, const std::string& tag) { return Verify(j, tag, steps_); }
  std::string Verify(JobState& j, const std::string& tag, uint64_t expected_step) {
    const std::string ckpt = absl::StrCat(case_dir_, "/ckpt/verify-", tag, "-", j.name);
    if (absl::Status s = j.client->SaveCheckpoint(j.name, ckpt); !s.ok()) {
      return absl::StrCat("checkpoint of ", j.name, ": ", s.ToString());
    }
    uint64_t at = 0;
    if (std::string e = CheckCheckpoint(opt_.get(), ckpt, layouts_, j.seed, &at); !e.empty()) {
      return absl::StrCat(j.name, " differs from its reference: ", e);
    }
    if (at != expected_step) return absl::StrCat(j.name, " is at step ", at, ", expected ", expected_step);
    std::filesystem::remove_all(ckpt);
    return "";
  }

  std::string RunCase(const FaultCase& fc, CaseResult* res) {
    std::vector<JobState> jobs(2);
    jobs[0].name = "victim";
    jobs[1].name = "bystander";
    jobs[0].seed = 11;
    jobs[1].seed = 23;
    // 1. Warm-up on a clean daemon.
    if (std::string e = StartDaemon(""); !e.empty()) return e;
    for (JobState& j : jobs) {
      j.client = Connect();
      if (j.client == nullptr) return "cannot connect";
      auto id = j.client->CreateJob(SmallInfinitySpec(j.name));
      if (!id.ok()) return absl::StrCat("CreateJob: ", id.status().ToString());
      j.id = *id;
      if (absl::Status s = Attach(j, true); !s.ok()) return absl::StrCat("setup of ", j.name, ": ", s.ToString());
      for (uint64_t i = 0; i < kWarmSteps; ++i) {
        if (absl::Status s = Step(j); !s.ok()) return absl::StrCat("warm-up of ", j.name, ": ", s.ToString());
      }
      j.checkpoint = absl::StrCat(case_dir_, "/ckpt/base-", j.name);
      if (absl::Status s = j.client->SaveCheckpoint(j.name, j.checkpoint); !s.ok()) {
        return absl::StrCat("base checkpoint: ", s.ToString());
      }
      j.ranks.clear();
      j.client.reset();
    }
    if (std::string e = StopDaemon(nullptr); !e.empty()) return "clean daemon: " + e;

    // 2. Faults on the victim only.
    if (std::string e = StartDaemon(absl::StrCat("tag=", jobs[0].id, ",", fc.rule)); !e.empty()) return e;
    for (JobState& j : jobs) {
      j.client = Connect();
      if (j.client == nullptr) return "cannot connect";
      if (absl::Status s = Attach(j, false); !s.ok()) return absl::StrCat("re-attach of ", j.name, ": ", s.ToString());
      auto at = StepOf(j);
      if (!at.ok() || *at != kWarmSteps) return absl::StrCat(j.name, " did not come back at step ", kWarmSteps);
      j.next = *at;
    }
    std::string errors[2];
    std::string summary;
    {
      std::atomic<bool> stop{false};
      std::atomic<bool>* stopper = fc.stop_on_error ? &stop : nullptr;
      std::thread victim([&] { errors[0] = Drive(jobs[0], true, stopper); });
      std::thread bystander([&] { errors[1] = Drive(jobs[1], false, stopper); });
      victim.join();
      bystander.join();
    }
    JobState& v = jobs[0];
    JobState& b = jobs[1];
    if (!errors[1].empty()) return errors[1];
    if (!errors[0].empty()) return errors[0];
    if (fc.stop_on_error) {
      // 2b. SIGTERM now (the daemon commits what is pending at shutdown),
      // a clean restart: each job is at the step it had reached, whole.
      if (v.errors.empty()) return "the victim saw no error";
      // No checkpoint of the failed job: its states may be half of the
      // failed step. The refusal says why and what to do.
      const absl::Status save = v.client->SaveCheckpoint(v.name, case_dir_ + "/ckpt/of-failed");
      if (save.code() != absl::StatusCode::kFailedPrecondition || !absl::StrContains(save.message(), "attach")) {
        return absl::StrCat("SaveCheckpoint of the failed job: expected FAILED_PRECONDITION saying to attach "
                            "again, got ", save.ToString());
      }
      for (JobState& j : jobs) {
        j.ranks.clear();
        j.client.reset();
      }
      if (std::string e = StopDaemon(&summary); !e.empty()) return "faulted daemon: " + e;
      if (std::string e = StartDaemon(""); !e.empty()) return e;
      for (JobState& j : jobs) {
        j.client = Connect();
        if (j.client == nullptr) return "cannot connect";
        auto at = StepOf(j);
        if (!at.ok()) return absl::StrCat(j.name, " after the restart: ", at.status().ToString());
        if (*at != j.next) {
          return absl::StrCat(j.name, " came back at step ", *at, " after the restart; it had finished ", j.next,
                              " steps");
        }
        if (std::string e = Verify(j, "stopped", j.next); !e.empty()) return "after SIGTERM and a restart: " + e;
        if (absl::Status s = Attach(j, false); !s.ok()) return absl::StrCat("attach after restart: ", s.ToString());
      }
      std::thread victim([&] { errors[0] = Drive(jobs[0], false); });
      std::thread bystander([&] { errors[1] = Drive(jobs[1], false); });
      victim.join();
      bystander.join();
      if (!errors[0].empty()) return errors[0];
      if (!errors[1].empty()) return errors[1];
    }
    res->bystander = b.errors.empty() ? absl::StrCat("no error, ", b.next, " steps, ") : "ERRORS, ";
    for (JobState& j : jobs) {
      if (std::string e = Verify(j, "faulted"); !e.empty()) return e;
    }
    absl::StrAppend(&res->bystander, "bit-identical");
    // The victim's story, checked against what this kind must produce.
    std::string story;
    if (fc.expect == Expect::kResume && v.errors.empty()) {
      // The failed read was a prefetch: the demand read that followed
      // worked, and nobody needed to know.
      story = absl::StrContains(ReadWholeFile(log()), "); try 2 of ")
                  ? "no error (the job record's read at startup failed and was retried); bit-identical"
                  : "no error (the failed read was a prefetch, read again on demand); bit-identical";
    } else if (fc.expect == Expect::kTransparent) {
      if (!v.errors.empty()) return absl::StrCat("the victim saw an error: ", v.errors[0].ToString());
      char times[96];
      std::snprintf(times, sizeof(times), "no error (%.2f s for its steps, the other job %.2f s)", v.seconds,
                    b.seconds);
      story = absl::StrCat(times, "; bit-identical");
    } else {
      if (v.errors.empty()) return "the victim saw no error";
      const absl::Status& first = v.errors[0];
      if (first.code() != fc.code) {
        return absl::StrCat("the victim's error has code ", absl::StatusCodeToString(first.code()), ", expected ",
                            absl::StatusCodeToString(fc.code), ": ", first.message());
      }
      if (!absl::StrContains(first.message(), fc.must_say)) {
        return absl::StrCat("the victim's error does not say '", fc.must_say, "': ", first.message());
      }
      const bool advice = absl::StrContains(first.message(), "Attach") ||
                          absl::StrContains(first.message(), "LoadCheckpoint") ||
                          absl::StrContains(first.message(), "checkpoint");
      if (!advice) return absl::StrCat("the victim's error does not say what to do: ", first.message());
      if (fc.expect == Expect::kCheckpoint &&
          (v.resumptions.empty() || !absl::StartsWith(v.resumptions.back(), "checkpoint"))) {
        return "the victim was expected to need its checkpoint";
      }
      if (fc.expect == Expect::kReattach &&
          (v.resumptions.empty() || !absl::StartsWith(v.resumptions[0], "re-attached"))) {
        return "the victim was expected to resume by re-attaching";
      }
      if (fc.expect == Expect::kResume &&
          (v.resumptions.empty() || absl::StartsWith(v.resumptions[0], "checkpoint"))) {
        return "the victim was expected to resume by retrying or re-attaching";
      }
      story = absl::StrCat(absl::StatusCodeToString(first.code()), " '", fc.must_say, "'; ",
                           absl::StrJoin(v.resumptions, ", "), "; bit-identical");
      first_errors_.push_back(std::string(first.message()));
    }
    for (JobState& j : jobs) {
      j.ranks.clear();
      j.client.reset();
    }
    if (std::string e = StopDaemon(fc.stop_on_error ? nullptr : &summary); !e.empty()) return "daemon: " + e;
    // The fault must have fired.
    const size_t at = summary.find(fc.fired + " ");
    if (at == std::string::npos) return absl::StrCat("no fault counters in the log: '", summary, "'");
    uint64_t fired = std::strtoull(summary.c_str() + at + fc.fired.size() + 1, nullptr, 10);
    if (fired == 0) return absl::StrCat("the fault never fired: ", summary);
    absl::StrAppend(&story, " (", fired, " fired)");

    // 4. Nothing torn was committed: a clean restart has both at the end.
    if (std::string e = StartDaemon(""); !e.empty()) return e;
    for (JobState& j : jobs) {
      j.client = Connect();
      if (j.client == nullptr) return "cannot connect";
      if (std::string e = Verify(j, "restarted"); !e.empty()) return "after a clean restart: " + e;
      j.client.reset();
    }
    if (std::string e = StopDaemon(nullptr); !e.empty()) return "clean restart: " + e;
    res->victim = story;
    return "";
  }

  const std::string binary_;
  const std::string dir_;
  const uint64_t steps_;
  std::unique_ptr<CpuOptimizer> opt_;
  std::string case_dir_;
  Layouts layouts_;
  pid_t pid_ = -1;

 public:
  std::vector<std::string> first_errors_;
};

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace
}  // namespace strata::faults

int main(int argc, char** argv) {
  using namespace strata::faults;
  std::string binary, dir, json, only;
  uint64_t steps = 8;
  bool long_mode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--stratad_faults") binary = next();
    else if (a == "--dir") dir = next();
    else if (a == "--steps") steps = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--long") long_mode = true;
    else if (a == "--json") json = next();
    else if (a == "--only") only = next();
    else {
      std::fprintf(stderr, "usage: strata-fault-harness --stratad_faults PATH --dir DIR [--steps N] [--long] "
                           "[--json FILE] [--only KIND-SUBSTRING]\n");
      return 2;
    }
  }
  if (long_mode) steps = 16;
  if (binary.empty() || dir.empty() || steps < kWarmSteps + 3) {
    std::fprintf(stderr, "strata-fault-harness: --stratad_faults and --dir are required; --steps >= 5\n");
    return 2;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Harness harness(binary, dir, steps);
  std::vector<CaseResult> results;
  const absl::Time start = absl::Now();
  const std::vector<uint64_t> afters = long_mode ? std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
                                                 : std::vector<uint64_t>{2};
  int index = 0;
  for (uint64_t after : afters) {
    for (const FaultCase& fc : Cases(after)) {
      if (!only.empty() && fc.kind.find(only) == std::string::npos) continue;
      CaseResult r = harness.Run(fc, index++);
      std::printf("%s [%s]: %s%s\n", r.pass ? "ok  " : "FAIL", r.rule.c_str(), r.kind.c_str(),
                  r.pass ? "" : (": " + r.detail).c_str());
      std::fflush(stdout);
      results.push_back(std::move(r));
    }
  }
  int failed = 0;
  std::printf("\n| fault kind | fault plan rule | affected job outcome | other jobs |\n|---|---|---|---|\n");
  for (const CaseResult& r : results) {
    if (!r.pass) ++failed;
    std::printf("| %s | %s | %s | %s |\n", r.kind.c_str(), r.rule.c_str(),
                r.pass ? r.victim.c_str() : ("FAILED: " + r.detail).c_str(), r.bystander.c_str());
  }
  std::printf("\n%zu cases, %d failed, %.1f s, %llu steps per job\n", results.size(), failed,
              absl::ToDoubleSeconds(absl::Now() - start), static_cast<unsigned long long>(steps));
  if (!harness.first_errors_.empty()) {
    std::printf("\nfirst error the affected job got, per erroring case:\n");
    for (const std::string& e : harness.first_errors_) std::printf("  %s\n", e.c_str());
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"cases\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const CaseResult& r = results[i];
      out << (i ? ", " : "") << "{\"kind\": \"" << JsonEscape(r.kind) << "\", \"rule\": \"" << JsonEscape(r.rule)
          << "\", \"pass\": " << (r.pass ? "true" : "false") << ", \"affected_job\": \""
          << JsonEscape(r.pass ? r.victim : r.detail) << "\", \"other_jobs\": \"" << JsonEscape(r.bystander)
          << "\"}";
    }
    out << "], \"steps_per_job\": " << steps << ", \"failed\": " << failed << "}\n";
  }
  if (failed == 0) std::filesystem::remove_all(dir);
  return failed == 0 ? 0 : 1;
}
