// Load harness (issue 11): many client processes, each with two jobs, step
// against one stratad whose pinned capacity is as tight as the jobs allow,
// for a fixed time. It checks that
//   - nothing deadlocks: every client finishes within its time plus a grace
//     period, every RPC within its deadline, and the daemon then answers and
//     stops cleanly (SIGTERM, exit 0);
//   - nothing leaks: the daemon's threads, open fds, mlocked bytes (VmLck),
//     pinned reservations and shared regions (memfd mappings and fds)
//     counted before the clients start and after they are gone are equal;
//   - the pinned capacity is really the limit: with every job registered, one
//     more job's registration is refused with ResourceExhausted;
// and reports p50/p99 latencies of each RPC and of whole steps as a table
// (and with --json FILE).
//
//   strata-load-harness --stratad PATH --dir DIR [--clients 16] [--seconds 15 | --long]
//                       [--job_worker_threads 4] [--json FILE]
//
// Each client process (this binary, re-run with --client) runs a
// ZeRO-Infinity job whose param cache budget is 50% of its params (so params
// page to NVMe and back every step) and a ZeRO-Offload job, 2 ranks each.
// The daemon refuses to overcommit pinned memory, so --pinned_capacity is
// the tightest that admits every job: a calibration daemon measures one
// client's reservation first. --long runs 60 s.
#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/strata_client.h"

namespace strata {
namespace {

// The model each job registers: 8 tensors of 8192 fp32 elements (256 KiB of
// params per job). Stage 3 cuts each tensor in half per rank: 16 KiB param
// slots, 8 per rank.
constexpr uint32_t kTensors = 8;
constexpr uint64_t kTensorElements = 8192;
constexpr uint64_t kParamBytes = kTensors * kTensorElements * 4;

std::vector<TensorDesc> Model() {
  std::vector<TensorDesc> model;
  for (uint32_t t = 0; t < kTensors; ++t) model.push_back({absl::StrCat("w", t), kTensorElements});
  return model;
}

JobSpec InfinitySpec(const std::string& name) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 2;
  spec.mode = JobMode::kInfinity;
  spec.deepspeed_config_json =
      R"({"gradient_clipping": 0, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"},
          "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}}})";
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  spec.pinned_budget_bytes = kParamBytes / 2;  // the budget at 50%: params page every step
  return spec;
}

JobSpec OffloadSpec(const std::string& name) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 2;
  spec.mode = JobMode::kOffload;
  spec.deepspeed_config_json =
      R"({"zero_optimization": {"stage": 2, "sub_group_size": 8192},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}}})";
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  return spec;
}

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// ---------------------------------------------------------------- client --

// Latency samples (microseconds) per operation.
using Samples = std::map<std::string, std::vector<double>>;

class ClientRun {
 public:
  ClientRun(std::string socket, int index) : socket_(std::move(socket)), index_(index) {}

  // "" on success.
  // Sets up, prints "ready", and steps from the harness's "go END" line
  // (on stdin) until END (seconds since the epoch).
  std::string Run(const std::string& out) {
    ClientOptions o;
    o.socket_path = socket_;
    o.rpc_timeout = absl::Seconds(30);
    o.step_timeout = absl::Seconds(60);
    auto connected = StrataClient::Connect(o);
    if (!connected.ok()) return absl::StrCat("connect: ", connected.status().message());
    client_ = std::move(*connected);
    std::vector<Job> jobs(2);
    jobs[0].name = absl::StrCat("c", index_, "-infinity");
    jobs[0].infinity = true;
    jobs[1].name = absl::StrCat("c", index_, "-offload");
    for (Job& job : jobs) {
      if (std::string e = SetUp(job); !e.empty()) return e;
    }
    // Ready: the harness checks the pinned capacity is full now.
    std::printf("ready\n");
    std::fflush(stdout);
    char line[64];
    double end_at = 0;
    if (std::fgets(line, sizeof line, stdin) == nullptr || std::sscanf(line, "go %lf", &end_at) != 1) {
      return "the harness did not say go";
    }
    uint64_t steps = 0;
    while (NowSeconds() < end_at) {
      for (Job& job : jobs) {
        if (std::string e = Step(job); !e.empty()) return e;
        ++steps;
      }
    }
    for (Job& job : jobs) {
      job.ranks.clear();  // sessions end before the job is deleted
      if (absl::Status s = Timed("DeleteJob", [&] { return client_->DeleteJob(job.name); }); !s.ok()) {
        return absl::StrCat(job.name, ": DeleteJob: ", s.message());
      }
    }
    client_.reset();
    std::ofstream file(out);
    for (const auto& [op, values] : samples_) {
      for (double v : values) file << op << " " << v << "\n";
    }
    file << "steps " << steps << "\n";
    return file ? "" : absl::StrCat("cannot write ", out);
  }

 private:
  struct Job {
    std::string name;
    bool infinity = false;
    std::vector<std::unique_ptr<RankSession>> ranks;
    uint64_t step = 0;
  };

  template <typename Fn>
  std::invoke_result_t<Fn> Timed(const std::string& op, Fn fn) {
    const absl::Time t0 = absl::Now();
    auto result = fn();
    samples_[op].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    return result;
  }

  std::string SetUp(Job& job) {
    const JobSpec spec = job.infinity ? InfinitySpec(job.name) : OffloadSpec(job.name);
    auto id = Timed("CreateJob", [&] { return client_->CreateJob(spec); });
    if (!id.ok()) return absl::StrCat(job.name, ": CreateJob: ", id.status().message());
    const std::vector<TensorDesc> model = Model();
    for (uint32_t r = 0; r < 2; ++r) {
      auto session = Timed("Attach", [&] { return client_->Attach(job.name, r); });
      if (!session.ok()) return absl::StrCat(job.name, ": Attach: ", session.status().message());
      job.ranks.push_back(std::move(*session));
      RankSession& rank = *job.ranks.back();
      if (absl::Status s = Timed("RegisterTensors", [&] { return rank.RegisterTensors(model); }); !s.ok()) {
        return absl::StrCat(job.name, ": RegisterTensors: ", s.message());
      }
      for (ShardView& shard : rank.shards()) {
        float* p = reinterpret_cast<float*>(shard.param);
        for (uint64_t e = 0; e < shard.padded_numel; ++e) p[e] = std::sin(0.001f * static_cast<float>(e + index_));
      }
    }
    for (auto& rank : job.ranks) {
      if (absl::Status s = Timed("InitParams", [&] { return rank->InitParams(); }); !s.ok()) {
        return absl::StrCat(job.name, ": InitParams: ", s.message());
      }
    }
    return "";
  }

  // One training step of `job`: (Infinity) fetch every param shard up and
  // release it, as a forward pass would; write and hand in every gradient;
  // wait for the step on every rank.
  std::string Step(Job& job) {
    const absl::Time t0 = absl::Now();
    for (auto& rank : job.ranks) {
      const uint32_t n = static_cast<uint32_t>(rank->shards().size());
      if (job.infinity) {
        for (uint32_t i = 0; i < n; ++i) {
          if (absl::Status s = Timed("Acquire", [&] { return rank->Acquire({i}); }); !s.ok()) {
            return absl::StrCat(job.name, ": Acquire: ", s.message());
          }
          if (absl::Status s = Timed("Release", [&] { return rank->Release({i}); }); !s.ok()) {
            return absl::StrCat(job.name, ": Release: ", s.message());
          }
        }
        if (absl::Status s = rank->IterationBoundary(); !s.ok()) {
          return absl::StrCat(job.name, ": IterationBoundary: ", s.message());
        }
      }
      for (ShardView& shard : rank->shards()) {
        float* g = reinterpret_cast<float*>(shard.grad);
        for (uint64_t e = 0; e < shard.padded_numel; ++e) {
          g[e] = 0.01f * std::cos(0.01f * static_cast<float>(e) + static_cast<float>(job.step));
        }
        if (absl::Status s = Timed("GradReady", [&] { return rank->GradReady(shard.index, job.step); }); !s.ok()) {
          return absl::StrCat(job.name, ": GradReady of step ", job.step, ": ", s.message());
        }
      }
    }
    for (auto& rank : job.ranks) {
      auto result = Timed("WaitStep", [&] { return rank->WaitStep(job.step); });
      if (!result.ok()) return absl::StrCat(job.name, ": WaitStep ", job.step, ": ", result.status().message());
      // Every step applies (no loss scaling, so none is skipped).
      if (result->skipped || result->optimizer_steps != job.step + 1) {
        return absl::StrCat(job.name, ": step ", job.step, " came back with optimizer_steps ",
                            result->optimizer_steps, result->skipped ? " (skipped)" : "");
      }
    }
    samples_[job.infinity ? "step (infinity)" : "step (offload)"].push_back(
        absl::ToDoubleMicroseconds(absl::Now() - t0));
    ++job.step;
    return "";
  }

  const std::string socket_;
  const int index_;
  std::unique_ptr<StrataClient> client_;
  Samples samples_;
};

// ------------------------------------------------------------ harness --

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What the harness counts in the daemon before and after the load.
struct Census {
  int threads = 0;
  int fds = 0;
  int memfd_fds = 0;      // shared regions held open
  int memfd_maps = 0;     // shared regions mapped (lines of /proc/PID/maps)
  uint64_t vm_lck_kb = 0; // mlocked (pinned) memory
  uint64_t pinned_used = 0;  // the daemon's pinned reservations (GetStats)
  std::map<std::string, int> thread_names;  // /proc/PID/task/*/comm
  // Threads of pools that grow lazily to a fixed bound and never shrink,
  // owned by libraries, not by stratad: the kernel's io_uring workers
  // ("iou-wrk-*", one kept per ring until it closes) and gRPC's internal
  // executors and timers. How far they grew depends on how the load
  // happened to fall, so they are counted apart (and bounded), not in
  // `threads`. gRPC's server threads ("grpcpp_sync_ser", which also names any
  // thread an RPC handler would start) and the daemon's own stay in.
  std::map<std::string, int> lazy_pools;
  int lazy_pool_threads() const {
    int n = 0;
    for (const auto& [name, k] : lazy_pools) n += k;
    return n;
  }
  bool operator==(const Census& o) const {
    return threads == o.threads && fds == o.fds && memfd_fds == o.memfd_fds && memfd_maps == o.memfd_maps &&
           vm_lck_kb == o.vm_lck_kb && pinned_used == o.pinned_used && thread_names == o.thread_names;
  }
  std::string ToString() const {
    std::string names;
    for (const auto& [name, n] : thread_names) absl::StrAppend(&names, names.empty() ? "" : " ", name, "x", n);
    std::string lazy;
    for (const auto& [name, n] : lazy_pools) absl::StrAppend(&lazy, lazy.empty() ? "" : " ", name, "x", n);
    return absl::StrCat("threads ", threads, " (", names, "; and lazily grown pools: ", lazy, ")",
                        ", fds ", fds, ", memfd fds ", memfd_fds,
                        ", memfd mappings ", memfd_maps, ", VmLck ", vm_lck_kb, " kB, pinned reserved ", pinned_used,
                        " B");
  }
};

// Parses "pinned used N of M bytes" out of StatsText.
std::optional<std::pair<uint64_t, uint64_t>> PinnedFromStats(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t used = 0, capacity = 0;
    if (w.size() >= 5 && w[0] == "pinned" && w[1] == "used" && absl::SimpleAtoi(w[2], &used) &&
        absl::SimpleAtoi(w[4], &capacity)) {
      return std::make_pair(used, capacity);
    }
  }
  return std::nullopt;
}

absl::StatusOr<Census> TakeCensus(pid_t pid, StrataClient& client) {
  Census c;
  const std::string proc = absl::StrCat("/proc/", pid);
  std::error_code ec;
  for (std::filesystem::directory_iterator it(proc + "/task", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name(absl::StripAsciiWhitespace(ReadFile(it->path().string() + "/comm")));
    static constexpr const char* kLazyPools[] = {"iou-wrk-",        "default-executo", "grpc_global_tim",
                                                 "event_engine",    "resolver-execut", "timer_manager"};
    bool lazy = false;
    for (const char* prefix : kLazyPools) {
      if (name.rfind(prefix, 0) == 0) {
        ++c.lazy_pools[name.rfind("iou-wrk-", 0) == 0 ? "iou-wrk" : name];
        lazy = true;
        break;
      }
    }
    if (lazy) continue;
    ++c.threads;
    ++c.thread_names[name];
  }
  for (std::filesystem::directory_iterator it(proc + "/fd", ec), end; !ec && it != end; it.increment(ec)) {
    ++c.fds;
    std::error_code lec;
    const std::string target = std::filesystem::read_symlink(it->path(), lec).string();
    if (!lec && target.rfind("/memfd:", 0) == 0) ++c.memfd_fds;
  }
  for (absl::string_view line : absl::StrSplit(ReadFile(proc + "/maps"), '\n')) {
    if (absl::StrContains(line, "/memfd:")) ++c.memfd_maps;
  }
  for (absl::string_view line : absl::StrSplit(ReadFile(proc + "/status"), '\n')) {
    if (absl::ConsumePrefix(&line, "VmLck:")) {
      line = absl::StripAsciiWhitespace(line);
      (void)absl::ConsumeSuffix(&line, " kB");
      if (!absl::SimpleAtoi(line, &c.vm_lck_kb)) return absl::InternalError("cannot read VmLck");
    }
  }
  auto stats = client.StatsText();
  if (!stats.ok()) return stats.status();
  auto pinned = PinnedFromStats(*stats);
  if (!pinned) return absl::InternalError(absl::StrCat("GetStats has no pinned tier:\n", *stats));
  c.pinned_used = pinned->first;
  return c;
}

// The daemon's CPU seconds so far (utime + stime).
double CpuSeconds(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  uint64_t utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) return 0;
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

class Daemon {
 public:
  Daemon(std::string stratad, std::string dir) : stratad_(std::move(stratad)), dir_(std::move(dir)) {}
  ~Daemon() { Kill(); }
  std::string socket() const { return dir_ + "/s.sock"; }
  std::string log() const { return dir_ + "/stratad.log"; }
  pid_t pid() const { return pid_; }

  std::string Start(const std::vector<std::string>& extra) {
    std::filesystem::create_directories(dir_ + "/nvme");
    std::vector<std::string> args = {stratad_, "--socket", socket(), "--nvme_path", dir_ + "/nvme",
                                      "--nvme_capacity", "512MiB", "--device", "emulated"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = freopen(log().c_str(), "a", stderr);
      (void)out;
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
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

  // SIGTERM; the exit status, or -1 when it did not exit within `wait`.
  int Stop(absl::Duration wait) {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + wait;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::unique_ptr<StrataClient> Connect() {
    ClientOptions o;
    o.socket_path = socket();
    o.rpc_timeout = absl::Seconds(30);
    auto c = StrataClient::Connect(o);
    return c.ok() ? std::move(*c) : nullptr;
  }

 private:
  const std::string stratad_;
  const std::string dir_;
  pid_t pid_ = -1;
};

struct Options {
  std::string stratad, dir, json, self;
  int clients = 16;
  double seconds = 15;
  int job_worker_threads = 4;
};

// A client process and the pipe its "ready" line comes on.
struct ClientProc {
  pid_t pid = -1;
  FILE* out = nullptr;  // its stdout: "ready"
  FILE* in = nullptr;   // its stdin: "go END"
  std::string samples;
  bool ready = false;
  int status = -1;
};

ClientProc SpawnClient(const Options& opt, const std::string& socket, int index) {
  ClientProc c;
  c.samples = absl::StrCat(opt.dir, "/client", index, ".samples");
  int out[2], in[2];
  if (pipe2(out, O_CLOEXEC) != 0) return c;
  if (pipe2(in, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return c;
  }
  c.pid = fork();
  if (c.pid == 0) {
    dup2(out[1], 1);
    dup2(in[0], 0);
    std::vector<std::string> args = {opt.self, "--client", "--socket", socket, "--index", absl::StrCat(index),
                                     "--out", c.samples};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(in[0]);
  c.out = fdopen(out[0], "r");
  c.in = fdopen(in[1], "w");
  return c;
}

// Waits for every client to exit; false when one is still running at
// `deadline` (a deadlock or a stuck RPC).
bool ReapClients(std::vector<ClientProc>& clients, absl::Time deadline) {
  size_t left = clients.size();
  while (left > 0) {
    for (ClientProc& c : clients) {
      if (c.pid <= 0 || c.status != -1) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (left == 0) break;
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

void KillClients(std::vector<ClientProc>& clients) {
  for (ClientProc& c : clients) {
    if (c.pid > 0 && c.status == -1) {
      kill(c.pid, SIGKILL);
      int status;
      waitpid(c.pid, &status, 0);
      c.status = 137;
    }
  }
}

std::string LscpuSummary() {
  const std::string cpuinfo = ReadFile("/proc/cpuinfo");
  std::string model = "?";
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    if (absl::ConsumePrefix(&line, "model name")) {
      model = std::string(absl::StripAsciiWhitespace(absl::StripPrefix(absl::StripAsciiWhitespace(line), ":")));
      break;
    }
  }
  const bool avx512 = absl::StrContains(cpuinfo, " avx512f");
  const bool avx2 = absl::StrContains(cpuinfo, " avx2");
  return absl::StrCat(model, ", ", sysconf(_SC_NPROCESSORS_ONLN), " cpus, ",
                      avx512 ? "AVX-512" : avx2 ? "AVX2" : "no AVX2");
}

std::string LoadAverage() {
  std::vector<std::string> f = absl::StrSplit(ReadFile("/proc/loadavg"), ' ');
  return f.size() >= 3 ? absl::StrCat(f[0], " ", f[1], " ", f[2]) : "?";
}

double Percentile(std::vector<double>& v, double p) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// One client process's pinned reservation, measured on a daemon of its own.
absl::StatusOr<uint64_t> CalibratePinned(const Options& opt) {
  Daemon daemon(opt.stratad, opt.dir + "/calibrate");
  if (std::string e = daemon.Start({"--pinned_capacity", "1GiB"}); !e.empty()) return absl::InternalError(e);
  auto client = daemon.Connect();
  if (client == nullptr) return absl::InternalError("calibration: cannot connect");
  uint64_t need = 0;
  {
    std::vector<std::unique_ptr<RankSession>> sessions;
    for (const JobSpec& spec : {InfinitySpec("calibrate-infinity"), OffloadSpec("calibrate-offload")}) {
      if (auto id = client->CreateJob(spec); !id.ok()) return id.status();
      for (uint32_t r = 0; r < 2; ++r) {
        auto s = client->Attach(spec.name, r);
        if (!s.ok()) return s.status();
        if (absl::Status st = (*s)->RegisterTensors(Model()); !st.ok()) return st;
        sessions.push_back(std::move(*s));
      }
    }
    auto stats = client->StatsText();
    if (!stats.ok()) return stats.status();
    auto pinned = PinnedFromStats(*stats);
    if (!pinned) return absl::InternalError("calibration: GetStats has no pinned tier");
    need = pinned->first;
  }
  for (const char* name : {"calibrate-infinity", "calibrate-offload"}) {
    if (absl::Status s = client->DeleteJob(name); !s.ok()) return s;
  }
  client.reset();
  if (int rc = daemon.Stop(absl::Seconds(30)); rc != 0) {
    return absl::InternalError(absl::StrCat("calibration daemon exited with ", rc, "; see ", daemon.log()));
  }
  std::filesystem::remove_all(opt.dir + "/calibrate");
  if (need == 0) return absl::InternalError("calibration: the jobs reserved no pinned memory");
  return need;
}

// With every job registered the capacity is full: one more job must be
// refused, naming pinned_capacity. "" when it is.
std::string CheckCapacityIsTight(StrataClient& client) {
  const std::string name = "one-too-many";
  if (auto id = client.CreateJob(OffloadSpec(name)); !id.ok()) {
    return absl::StrCat("CreateJob ", name, ": ", id.status().message());
  }
  std::string error;
  {
    auto s = client.Attach(name, 0);
    if (!s.ok()) {
      error = absl::StrCat("Attach ", name, ": ", s.status().message());
    } else {
      absl::Status st = (*s)->RegisterTensors(Model());
      if (st.code() != absl::StatusCode::kResourceExhausted ||
          !absl::StrContains(st.message(), "pinned_capacity")) {
        error = absl::StrCat("a job beyond the pinned capacity registered with: ", st.ToString());
      }
    }
  }
  if (absl::Status s = client.DeleteJob(name); !s.ok() && error.empty()) {
    error = absl::StrCat("DeleteJob ", name, ": ", s.message());
  }
  return error;
}

// One round: every client sets up its jobs, they step together for
// `seconds`, and delete them.
struct Round {
  std::string failure;
  Samples samples;
  uint64_t steps = 0;
  double run_s = 0;
  double cpu_pct = 0;                // stratad's, while the jobs stepped
  std::optional<Census> loaded;      // with every job registered
};

Round RunRound(const Options& opt, Daemon& daemon, StrataClient& client, double seconds) {
  Round r;
  std::vector<ClientProc> clients;
  for (int i = 0; i < opt.clients; ++i) clients.push_back(SpawnClient(opt, daemon.socket(), i));
  for (ClientProc& c : clients) {
    char line[64];
    c.ready = c.out != nullptr && std::fgets(line, sizeof line, c.out) != nullptr && std::string(line) == "ready\n";
    if (!c.ready && r.failure.empty()) r.failure = "a client failed to set up its jobs (see its stderr above)";
  }
  if (r.failure.empty()) {
    auto loaded = TakeCensus(daemon.pid(), client);
    if (loaded.ok()) r.loaded = *loaded;
    r.failure = CheckCapacityIsTight(client);
  }
  // Go (a client that failed has exited; the others stop at once).
  const double start_at = NowSeconds();
  const double end_at = start_at + (r.failure.empty() ? seconds : 0);
  for (ClientProc& c : clients) {
    if (c.in == nullptr) continue;
    std::fprintf(c.in, "go %.3f\n", end_at);
    fclose(c.in);
    c.in = nullptr;
  }
  const double cpu0 = CpuSeconds(daemon.pid());
  const double grace_s = 120;
  const bool finished = ReapClients(clients, absl::FromUnixSeconds(0) + absl::Seconds(end_at + grace_s));
  r.run_s = std::max(NowSeconds() - start_at, 1e-3);
  r.cpu_pct = 100.0 * (CpuSeconds(daemon.pid()) - cpu0) / r.run_s;
  if (!finished) {
    r.failure = absl::StrCat("deadlock? clients still running ", grace_s, " s after the end of the run:");
    for (const ClientProc& c : clients) {
      if (c.status == -1) absl::StrAppend(&r.failure, " ", c.samples);
    }
    KillClients(clients);
  }
  for (ClientProc& c : clients) {
    if (c.out != nullptr) fclose(c.out);
    if (c.status != 0 && r.failure.empty()) {
      r.failure = absl::StrCat("a client exited with ", c.status, " (its error is above)");
    }
    for (absl::string_view line : absl::StrSplit(ReadFile(c.samples), '\n', absl::SkipEmpty())) {
      const size_t space = line.rfind(' ');
      if (space == absl::string_view::npos) continue;
      const std::string op(line.substr(0, space));
      double v = 0;
      if (!absl::SimpleAtod(line.substr(space + 1), &v)) continue;
      if (op == "steps") r.steps += static_cast<uint64_t>(v);
      else r.samples[op].push_back(v);
    }
    std::filesystem::remove(c.samples);
  }
  return r;
}

// The census once what the jobs held is given back: connections close and
// idle threads end asynchronously, so it may take a moment to reach `want`.
absl::StatusOr<Census> SettledCensus(pid_t pid, StrataClient& client, const std::optional<Census>& want) {
  absl::StatusOr<Census> c;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  Census last;
  int same = 0;
  do {
    absl::SleepFor(absl::Milliseconds(100));
    c = TakeCensus(pid, client);
    if (!c.ok()) return c;
    if (want ? *c == *want : (*c == last && ++same >= 10)) break;  // no target: stable for 1 s
    if (!(*c == last)) same = 0;
    last = *c;
  } while (absl::Now() < deadline);
  return c;
}

int RunHarness(const Options& opt) {
  std::filesystem::remove_all(opt.dir);
  std::filesystem::create_directories(opt.dir);
  const std::string machine = LscpuSummary();
  const std::string load_before = LoadAverage();
  std::printf("load harness: %d client processes x 2 jobs (ZeRO-Infinity with its pinned budget at 50%% of its "
              "params, ZeRO-Offload), %.0f s, %d job worker threads\n", opt.clients, opt.seconds,
              opt.job_worker_threads);
  std::printf("machine: %s; load average %s\n", machine.c_str(), load_before.c_str());
  std::fflush(stdout);
  auto need = CalibratePinned(opt);
  if (!need.ok()) {
    std::printf("FAILED: calibration: %s\n", std::string(need.status().message()).c_str());
    return 1;
  }
  const uint64_t capacity = *need * static_cast<uint64_t>(opt.clients);
  std::printf("pinned: one client's two jobs reserve %llu bytes; --pinned_capacity %llu (the tightest that admits "
              "all %d jobs; the daemon refuses to overcommit)\n", static_cast<unsigned long long>(*need),
              static_cast<unsigned long long>(capacity), 2 * opt.clients);
  std::fflush(stdout);

  Daemon daemon(opt.stratad, opt.dir + "/daemon");
  if (std::string e = daemon.Start({"--pinned_capacity", absl::StrCat(capacity), "--optimizer_threads", "2",
                                    "--job_worker_threads", absl::StrCat(opt.job_worker_threads)});
      !e.empty()) {
    std::printf("FAILED: %s\n", e.c_str());
    return 1;
  }
  auto client = daemon.Connect();
  if (client == nullptr) {
    std::printf("FAILED: cannot connect to the daemon\n");
    return 1;
  }
  // Round 0 warms up what the process creates once, lazily, and keeps (gRPC's
  // timer and poller threads, the kernel's io_uring workers); round 1, the
  // same load again with the same job names, is measured: it must leave the
  // daemon exactly as it found it.
  std::string failure;
  Round warm = RunRound(opt, daemon, *client, std::min(2.0, opt.seconds));
  if (!warm.failure.empty()) failure = absl::StrCat("warm-up round: ", warm.failure);
  absl::StatusOr<Census> before = SettledCensus(daemon.pid(), *client, std::nullopt);
  if (failure.empty() && !before.ok()) failure = absl::StrCat("census: ", before.status().message());
  Round run;
  absl::StatusOr<Census> after = absl::UnknownError("not taken");
  if (failure.empty()) {
    std::printf("before: %s\n", before->ToString().c_str());
    std::fflush(stdout);
    run = RunRound(opt, daemon, *client, opt.seconds);
    failure = run.failure;
    if (run.loaded) {
      std::printf("loaded: %s\n", run.loaded->ToString().c_str());
      // Every job registered, none stepping: the jobs own no threads (a
      // thread per job and per param cache made this +48). gRPC may add a
      // poller or two.
      if (failure.empty() && run.loaded->threads > before->threads + 2) {
        failure = absl::StrCat(2 * opt.clients, " registered jobs took the daemon from ", before->threads, " to ",
                               run.loaded->threads, " threads");
      }
    }
    after = SettledCensus(daemon.pid(), *client, *before);
    if (!after.ok()) {
      if (failure.empty()) failure = absl::StrCat("census after: ", after.status().message());
    } else {
      std::printf("after:  %s\n", after->ToString().c_str());
      if (failure.empty() && !(*after == *before)) failure = "the daemon holds more (or less) after the load than before";
      // A few io_uring rings and gRPC pools sized by the cores: more would
      // mean rings or pools per job.
      const int max_lazy = 16 + 4 * static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
      if (failure.empty() && after->lazy_pool_threads() > max_lazy) {
        failure = absl::StrCat(after->lazy_pool_threads(), " io_uring/gRPC pool threads are left; at most ",
                               max_lazy, " were expected");
      }
    }
  }
  if (failure.empty()) {
    auto jobs = client->ListJobs();
    if (!jobs.ok()) failure = absl::StrCat("ListJobs after the load: ", jobs.status().message());
    else if (!jobs->empty()) failure = absl::StrCat(jobs->size(), " jobs are left after the load");
  }
  client.reset();
  const int rc = daemon.Stop(absl::Seconds(30));
  if (rc != 0 && failure.empty()) {
    failure = rc == -1 ? "stratad did not stop within 30 s of SIGTERM" : absl::StrCat("stratad exited with ", rc);
  }
  daemon.Kill();

  const std::string load_after = LoadAverage();
  std::printf("\n| op | count | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n");
  std::string json_ops;
  for (auto& [op, v] : run.samples) {
    if (v.empty()) continue;
    const double p50 = Percentile(v, 0.50) / 1000, p99 = Percentile(v, 0.99) / 1000, max = v.back() / 1000;
    std::printf("| %s | %zu | %.3f | %.3f | %.3f |\n", op.c_str(), v.size(), p50, p99, max);
    absl::StrAppend(&json_ops, json_ops.empty() ? "" : ",\n    ", "{\"op\": \"", op, "\", \"count\": ", v.size(),
                    ", \"p50_ms\": ", p50, ", \"p99_ms\": ", p99, ", \"max_ms\": ", max, "}");
  }
  std::printf("\n%llu steps in %.1f s (%.1f steps/s) by %d jobs; stratad cpu %.0f%%; load average %s -> %s\n",
              static_cast<unsigned long long>(run.steps), run.run_s, static_cast<double>(run.steps) / run.run_s,
              2 * opt.clients, run.cpu_pct, load_before.c_str(), load_after.c_str());
  if (!opt.json.empty()) {
    std::ofstream json(opt.json);
    json << "{\n  \"clients\": " << opt.clients << ", \"jobs\": " << 2 * opt.clients << ", \"seconds\": " << opt.seconds
         << ", \"job_worker_threads\": " << opt.job_worker_threads << ",\n  \"pinned_capacity_bytes\": " << capacity
         << ", \"steps\": " << run.steps << ", \"run_s\": " << run.run_s << ", \"stratad_cpu_pct\": " << run.cpu_pct
         << ",\n  \"machine\": \"" << machine << "\", \"load_average_before\": \"" << load_before
         << "\", \"load_average_after\": \"" << load_after << "\",\n  \"census_before\": \""
         << (before.ok() ? before->ToString() : "?") << "\",\n  \"census_loaded\": \""
         << (run.loaded ? run.loaded->ToString() : "?") << "\",\n  \"census_after\": \""
         << (after.ok() ? after->ToString() : "?") << "\",\n  \"passed\": " << (failure.empty() ? "true" : "false")
         << ",\n  \"ops\": [\n    " << json_ops << "\n  ]\n}\n";
  }
  if (!failure.empty()) {
    std::printf("FAILED: %s\ndaemon log: %s\n", failure.c_str(), daemon.log().c_str());
    return 1;
  }
  std::printf("PASSED: no deadlock; threads, fds, VmLck, pinned reservations and regions equal before and after\n");
  std::filesystem::remove_all(opt.dir);
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: strata-load-harness --stratad PATH --dir DIR [--clients N] [--seconds S | --long] "
               "[--job_worker_threads N] [--json FILE]\n");
  return 2;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::Options opt;
  bool client_mode = false;
  std::string socket, out;
  int index = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    bool ok = true;
    if (a == "--stratad") opt.stratad = next();
    else if (a == "--dir") opt.dir = next();
    else if (a == "--json") opt.json = next();
    else if (a == "--clients") ok = absl::SimpleAtoi(next(), &opt.clients);
    else if (a == "--seconds") ok = absl::SimpleAtod(next(), &opt.seconds);
    else if (a == "--long") opt.seconds = 60;
    else if (a == "--job_worker_threads") ok = absl::SimpleAtoi(next(), &opt.job_worker_threads);
    else if (a == "--client") client_mode = true;
    else if (a == "--socket") socket = next();
    else if (a == "--index") ok = absl::SimpleAtoi(next(), &index);
    else if (a == "--out") out = next();
    else return strata::Usage();
    if (!ok) return strata::Usage();
  }
  if (client_mode) {
    std::string error = strata::ClientRun(socket, index).Run(out);
    if (!error.empty()) {
      std::fprintf(stderr, "load client %d: %s\n", index, error.c_str());
      return 1;
    }
    return 0;
  }
  if (opt.stratad.empty() || opt.dir.empty() || opt.clients < 1 || opt.clients > 256 || !(opt.seconds > 0) ||
      opt.job_worker_threads < 1) {
    return strata::Usage();
  }
  signal(SIGPIPE, SIG_IGN);  // a client that died: its "go" write fails, the harness goes on
  std::error_code ec;
  opt.self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) {
    std::fprintf(stderr, "strata-load-harness: cannot find its own binary: %s\n", ec.message().c_str());
    return 1;
  }
  return strata::RunHarness(opt);
}
