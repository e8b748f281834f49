// Crash harness (issue 11): rounds of kill -9 of stratad while two or more
// ZeRO-Infinity jobs step, save checkpoints, and are deleted and re-created
// under the same name; after each restart every job must equal a reference
// run (the CPU optimizer stepped locally) at its restored step, bit for bit
// -- fp32 masters, both Adam moments and the params the trainer sees -- and
// within the steps the harness saw acknowledged and sent; deleted jobs must
// stay deleted; every checkpoint directory that exists must be whole and
// equal its reference; NVMe use must be exactly what the live jobs need.
//
//   strata-crash-harness --stratad PATH --dir DIR [--rounds N] [--long] [--jobs N] [--seed S]
//                        [--max_kill_ms MS]
//
// The kill comes 20..MS ms (default 2500) after the jobs start; jobs live on
// across rounds, so later rounds kill them mid-step. --long runs 500 rounds. Exit 0 when every round passed; otherwise the
// first failure is printed with the round's seed and the daemon log's path.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/strata_client.h"
#include "tests/infinity_job.h"
#include "tests/reference_model.h"
#include "optimizer_cpu/cpu_optimizer.h"

namespace strata {
namespace {

constexpr uint64_t kUnit = 64 << 10;  // the extent store's allocation unit
// Per job: 2 ranks x 3 shards x (master, exp_avg, exp_avg_sq, param home)
// extents, plus the job record; every piece of this model fits one unit.
constexpr uint64_t kJobNvmeBytes = (2 * 3 * 4 + 1) * kUnit;

using namespace ::strata::reference;  // the model, its reference and the checkpoint check

// The optimizer the reference steps with (one per process: a test binary).
CpuOptimizer* ReferenceOptimizer() {
  static std::unique_ptr<CpuOptimizer> opt = *CpuOptimizer::Create({});
  return opt.get();
}

// What the harness knows about one job name across rounds.
struct Track {
  std::string name;
  uint64_t seed = 0;
  bool durable = false;      // both ranks' InitParams acknowledged: must exist after a restart
  bool maybe = false;        // creation or init sent, not acknowledged: may exist
  bool delete_sent = false;  // delete sent, not acknowledged: may be gone
  int64_t acked = -1;        // highest step whose WaitStep returned OK
  int64_t sent = -1;         // highest step whose gradients were all sent
};

class Harness {
 public:
  Harness(std::string stratad, std::string dir, int jobs, uint64_t seed, int max_kill_ms)
      : stratad_(std::move(stratad)), dir_(std::move(dir)), rng_(seed), max_kill_ms_(max_kill_ms) {
    for (int i = 0; i < jobs; ++i) {
      Track t;
      t.name = absl::StrCat("job", i);
      tracks_.push_back(t);
    }
  }

  // Runs one round; "" when it passed.
  std::string Round(int round) {
    round_ = round;
    if (std::string e = StartDaemon(); !e.empty()) return e;
    std::string error = VerifyAfterRestart();
    if (error.empty()) error = Workload();
    KillDaemon();
    return error;
  }

  int checkpoints_verified() const { return checkpoints_verified_; }
  int jobs_verified() const { return jobs_verified_; }
  int deletes() const { return deletes_; }
  std::string log() const { return dir_ + "/stratad.log"; }

 private:
  std::string socket() const { return dir_ + "/s.sock"; }

  std::string StartDaemon() {
    std::filesystem::create_directories(dir_ + "/nvme");
    std::filesystem::create_directories(dir_ + "/ckpt");
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = freopen(log().c_str(), "a", stderr);
      (void)out;
      execl(stratad_.c_str(), stratad_.c_str(), "--socket", socket().c_str(), "--nvme_path",
            (dir_ + "/nvme").c_str(), "--nvme_capacity", "128MiB", "--pinned_capacity", "64MiB", "--device",
            "emulated", "--optimizer_threads", "1", "--checkpoint_root", (dir_ + "/ckpt").c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 400; ++i) {
      ClientOptions o;
      o.socket_path = socket();
      o.rpc_timeout = absl::Seconds(2);
      if (StrataClient::Connect(o).ok()) return "";
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::StrCat("stratad exited at startup; see ", log());
      }
      absl::SleepFor(absl::Milliseconds(25));
    }
    return absl::StrCat("stratad did not answer; see ", log());
  }

  void KillDaemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::unique_ptr<StrataClient> Connect() {
    ClientOptions o;
    o.socket_path = socket();
    o.rpc_timeout = absl::Seconds(10);
    o.step_timeout = absl::Seconds(20);
    auto c = StrataClient::Connect(o);
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::string VerifyAfterRestart() {
    auto client = Connect();
    if (client == nullptr) return "cannot connect after the restart";
    auto jobs = client->ListJobs();
    if (!jobs.ok()) return absl::StrCat("ListJobs: ", jobs.status().message());
    std::map<std::string, uint64_t> present;
    for (const JobSummary& j : *jobs) present[j.name] = j.step;
    for (Track& t : tracks_) {
      auto it = present.find(t.name);
      const bool may_exist = t.durable || t.maybe;
      const bool must_exist = t.durable && !t.delete_sent;
      if (it == present.end()) {
        if (must_exist) return absl::StrCat("job ", t.name, " (initialized, not deleted) is missing after the restart");
        t = Track{t.name};
        continue;
      }
      if (!may_exist) return absl::StrCat("job ", t.name, " is back after the restart but was deleted or never made");
      const int64_t step = static_cast<int64_t>(it->second);
      if (step < t.acked + 1 || step > t.sent + 1) {
        return absl::StrCat("job ", t.name, " came back at step ", step, "; acknowledged steps end at ", t.acked,
                            " and gradients were sent up to step ", t.sent);
      }
      t.durable = true;
      t.maybe = false;
      t.delete_sent = false;
      t.acked = t.sent = step - 1;
      // Bit for bit: every state stream and the params, through a checkpoint.
      const std::string ckpt = absl::StrCat(dir_, "/ckpt/verify-", round_, "-", t.name);
      std::filesystem::remove_all(ckpt);
      if (absl::Status s = client->SaveCheckpoint(t.name, ckpt); !s.ok()) {
        return absl::StrCat("checkpoint of restored job ", t.name, ": ", s.message());
      }
      if (layouts_.empty()) return "a job exists but the harness never saw its layout";
      uint64_t at = 0;
      if (std::string e = CheckCheckpoint(ReferenceOptimizer(), ckpt, layouts_, t.seed, &at); !e.empty()) {
        return absl::StrCat("restored job ", t.name, " (seed ", t.seed, ") differs from its reference: ", e);
      }
      if (static_cast<int64_t>(at) != step) return absl::StrCat("checkpoint of ", t.name, " says step ", at);
      std::filesystem::remove_all(ckpt);
      ++jobs_verified_;
    }
    for (const auto& [name, step] : present) {
      bool known = false;
      for (const Track& t : tracks_) known = known || t.name == name;
      if (!known) return absl::StrCat("unknown job ", name, " after the restart");
    }
    // Checkpoints saved last round: whole and right, or absent.
    for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/ckpt")) {
      const std::string name = entry.path().filename();
      if (name.find(".tmp-") == std::string::npos) {
        uint64_t seed = 0, at = 0;
        std::vector<std::string> parts = absl::StrSplit(name, '-');
        if (parts.size() < 3 || !absl::SimpleAtoi(parts[1], &seed)) return absl::StrCat("odd checkpoint ", name);
        if (std::string e = CheckCheckpoint(ReferenceOptimizer(), entry.path(), layouts_, seed, &at); !e.empty()) {
          return absl::StrCat("saved checkpoint differs from its reference: ", e);
        }
        ++checkpoints_verified_;
      }
      std::filesystem::remove_all(entry.path());
    }
    // NVMe holds exactly the live jobs: nothing leaks across kill -9.
    auto stats = client->StatsText();
    if (!stats.ok()) return absl::StrCat("stats: ", stats.status().message());
    for (absl::string_view line : absl::StrSplit(*stats, '\n')) {
      std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
      uint64_t used = 0;
      if (w.size() >= 3 && w[0] == "nvme" && w[1] == "used" && absl::SimpleAtoi(w[2], &used)) {
        if (used != present.size() * kJobNvmeBytes) {
          return absl::StrCat("NVMe holds ", used, " bytes for ", present.size(), " jobs; expected ",
                              present.size() * kJobNvmeBytes);
        }
      }
    }
    return "";
  }

  // Every job steps (and saves, deletes, re-creates) on its own thread until
  // the daemon is killed at a random moment.
  std::string Workload() {
    std::atomic<bool> dead{false};
    std::mutex mu;
    std::string error;
    std::vector<std::thread> threads;
    std::vector<uint64_t> seeds;
    for (size_t i = 0; i < tracks_.size(); ++i) seeds.push_back(rng_());
    for (size_t i = 0; i < tracks_.size(); ++i) {
      threads.emplace_back([&, i] {
        std::string e = RunJob(tracks_[i], seeds[i], dead);
        std::lock_guard<std::mutex> lock(mu);
        if (!e.empty() && error.empty()) error = e;
      });
    }
    std::uniform_int_distribution<int> delay(20, max_kill_ms_);
    const int ms = delay(rng_);
    absl::SleepFor(absl::Milliseconds(ms));
    dead = true;
    KillDaemon();
    for (std::thread& t : threads) t.join();
    std::string line = absl::StrCat("round ", round_, ": kill -9 after ", ms, " ms;");
    for (const Track& t : tracks_) {
      absl::StrAppend(&line, " ", t.name, t.durable ? "" : " (not initialized)", " acked step ", t.acked, " sent ",
                      t.sent, ";");
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    return error;
  }

  // Returns "" when the job ran until the daemon died (its RPCs then fail);
  // a failure while the daemon was alive is an error.
  std::string RunJob(Track& t, uint64_t seed, const std::atomic<bool>& dead) {
    std::mt19937_64 rng(seed);
    auto fail = [&](absl::string_view what, const absl::Status& s) -> std::string {
      if (verbose_) std::fprintf(stderr, "  %s: %.*s after the kill: %s\n", t.name.c_str(), static_cast<int>(what.size()), what.data(), std::string(s.message()).c_str());
      if (dead) return "";
      return absl::StrCat(t.name, ": ", what, ": ", s.message());
    };
    auto client = Connect();
    if (client == nullptr) return dead ? "" : absl::StrCat(t.name, ": cannot connect");
    while (!dead) {
      const bool fresh = !t.durable;
      if (fresh) {
        t = Track{t.name};
        t.seed = seed++;
        t.maybe = true;
        if (absl::StatusOr<uint64_t> id = client->CreateJob(SmallInfinitySpec(t.name)); !id.ok()) return fail("CreateJob", id.status());
      }
      std::vector<std::unique_ptr<RankSession>> ranks;
      for (uint32_t r = 0; r < 2; ++r) {
        auto s = client->Attach(t.name, r);
        if (!s.ok()) return fail("Attach", s.status());
        ranks.push_back(std::move(*s));
        if (absl::Status st = ranks[r]->RegisterTensors(Model()); !st.ok()) return fail("RegisterTensors", st);
        if (fresh) {
          for (ShardView& shard : ranks[r]->shards()) {
            FillOwned(shard, shard.param, [&](uint32_t tt, uint64_t e) { return InitialParam(tt, e, t.seed); });
          }
        }
      }
      {
        std::lock_guard<std::mutex> lock(layouts_mu_);
        if (layouts_.empty()) {
          for (uint32_t r = 0; r < 2; ++r) {
            std::vector<ShardView> shards(ranks[r]->shards().begin(), ranks[r]->shards().end());
            for (ShardView& v : shards) v.grad = v.param = nullptr;
            layouts_.push_back(std::move(shards));
          }
        }
      }
      if (fresh) {
        for (uint32_t r = 0; r < 2; ++r) {
          if (absl::Status st = ranks[r]->InitParams(); !st.ok()) return fail("InitParams", st);
        }
        t.durable = true;
        t.maybe = false;
      }
      // Steps until the daemon dies, or this incarnation is deleted.
      while (!dead) {
        const int64_t step = t.sent + 1;
        for (uint32_t r = 0; r < 2; ++r) {
          const uint32_t n = static_cast<uint32_t>(ranks[r]->shards().size());
          for (uint32_t i = 0; i < n; ++i) {
            if (absl::Status st = ranks[r]->Acquire({i}); !st.ok()) return fail("Acquire", st);
            if (absl::Status st = ranks[r]->Release({i}); !st.ok()) return fail("Release", st);
          }
          if (absl::Status st = ranks[r]->IterationBoundary(); !st.ok()) return fail("IterationBoundary", st);
          for (ShardView& shard : ranks[r]->shards()) {
            FillOwned(shard, shard.grad, [&](uint32_t tt, uint64_t e) { return Grad(tt, e, step, t.seed); });
            if (absl::Status st = ranks[r]->GradReady(shard.index, static_cast<uint64_t>(step)); !st.ok()) {
              return fail("GradReady", st);
            }
          }
        }
        t.sent = step;
        for (uint32_t r = 0; r < 2; ++r) {
          if (auto res = ranks[r]->WaitStep(static_cast<uint64_t>(step)); !res.ok()) return fail("WaitStep", res.status());
        }
        t.acked = step;
        const int dice = static_cast<int>(rng() % 10);
        if (dice < 3) {
          // A checkpoint save that a kill may cut short.
          const std::string ckpt = absl::StrCat(dir_, "/ckpt/c-", t.seed, "-", step);
          if (absl::Status st = client->SaveCheckpoint(t.name, ckpt); !st.ok()) return fail("SaveCheckpoint", st);
        } else if (dice == 3) {
          // Delete, then the next loop re-creates the same name.
          t.delete_sent = true;
          ranks.clear();
          if (absl::Status st = client->DeleteJob(t.name); !st.ok()) return fail("DeleteJob", st);
          ++deletes_;
          t = Track{t.name};
          break;
        }
      }
    }
    return "";
  }

  const std::string stratad_;
  const std::string dir_;
  std::mt19937_64 rng_;
  const int max_kill_ms_;
  const bool verbose_ = std::getenv("STRATA_CRASH_VERBOSE") != nullptr;
  std::vector<Track> tracks_;
  std::mutex layouts_mu_;
  Layouts layouts_;  // written once, by the first job to register
  pid_t pid_ = -1;
  int round_ = 0;
  int checkpoints_verified_ = 0;
  int jobs_verified_ = 0;
  std::atomic<int> deletes_{0};
};

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  std::string stratad, dir;
  int rounds = 20, jobs = 2, max_kill_ms = 2500;
  uint64_t seed = static_cast<uint64_t>(time(nullptr));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--stratad") stratad = next();
    else if (a == "--dir") dir = next();
    else if (a == "--rounds") rounds = std::atoi(next().c_str());
    else if (a == "--long") rounds = 500;
    else if (a == "--jobs") jobs = std::atoi(next().c_str());
    else if (a == "--max_kill_ms") max_kill_ms = std::atoi(next().c_str());
    else if (a == "--seed") seed = std::strtoull(next().c_str(), nullptr, 10);
    else {
      std::fprintf(stderr, "usage: strata-crash-harness --stratad PATH --dir DIR [--rounds N] [--long] [--jobs N] [--seed S] [--max_kill_ms MS]\n");
      return 2;
    }
  }
  if (stratad.empty() || dir.empty() || rounds < 1 || jobs < 2 || max_kill_ms < 20) {
    std::fprintf(stderr, "strata-crash-harness: --stratad and --dir are required; --rounds >= 1, --jobs >= 2\n");
    return 2;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::printf("crash harness: %d rounds, %d concurrent Infinity jobs, seed %llu\n", rounds, jobs,
              static_cast<unsigned long long>(seed));
  strata::Harness harness(stratad, dir, jobs, seed, max_kill_ms);
  const absl::Time start = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    std::string error = harness.Round(r);
    if (!error.empty()) {
      std::printf("FAILED in round %d (seed %llu): %s\ndaemon log: %s\n", r, static_cast<unsigned long long>(seed),
                  error.c_str(), harness.log().c_str());
      return 1;
    }
  }
  if (harness.jobs_verified() == 0) {
    std::printf("FAILED: no job lived through a kill to be verified; the daemon is too slow for --max_kill_ms %d "
                "(see %s)\n", max_kill_ms, harness.log().c_str());
    return 1;
  }
  std::printf("| rounds (kill -9) survived | jobs verified bit for bit | checkpoints verified | deletes | seconds |\n");
  std::printf("|---|---|---|---|---|\n");
  std::printf("| %d | %d | %d | %d | %.1f |\n", rounds, harness.jobs_verified(), harness.checkpoints_verified(),
              harness.deletes(), absl::ToDoubleSeconds(absl::Now() - start));
  std::filesystem::remove_all(dir);
  return 0;
}
