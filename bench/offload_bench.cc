#include "bench/offload_bench.h"

#include <unistd.h>


#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/daemon_launcher.h"
#include "bench/offload_parts.h"
#include "bench/sample_stats.h"
#include "client/strata_client.h"
#include "core/byte_size.h"
#include "core/command_line.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

constexpr uint64_t kAlignElements = 2048;             // ZeRO partition alignment (4 KiB / 2 bytes)
constexpr double kInfinityTarget = 1.10;              // step <= 1.1 x max(parts) (issue 10)
constexpr uint64_t kTargetParams = 200000000;
constexpr double kLr = 0.001, kWeightDecay = 0.01;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

struct Flags {
  std::string socket;
  std::string json_path;
  std::vector<uint64_t> sizes = {kTargetParams};  // --params, one run each
  uint64_t params = kTargetParams;                // the size being run
  uint64_t pinned_budget = 0;                     // infinity: the job's window (0: the daemon's default)
  std::vector<JobMode> modes = {JobMode::kInfinity};
  uint32_t steps = 3;
  std::string nvme_path;
  uint32_t threads = 2;
  uint64_t tensor_elements = 10000000;
  uint64_t sub_group = 0;  // 0: params / 8
  std::string fsync_policy = "every_commit";
  // The job's gradient_clipping (0: none). With clipping an Infinity step
  // waits for every gradient's norm, so no shard is stepped early.
  double gradient_clipping = 0;
  // The trainer's backward, in seconds per step, spread evenly before each
  // gradient (a sleep: the GPU computes, the trainer's CPU waits). 0: every
  // gradient is sent at once, the daemon's worst case.
  double backward_s = 0;
};

const char* ModeName(JobMode m) { return m == JobMode::kInfinity ? "infinity" : "offload"; }

struct ModeResult {
  JobMode mode = JobMode::kInfinity;
  uint64_t params = 0;
  uint32_t shards = 0;
  double register_s = 0, init_s = 0, warmup_s = 0;
  std::vector<double> step_s, optimizer_s, io_s, inspect_s;
  std::vector<double> exposed_s;  // the step after the last gradient's GradReady
  uint64_t io_read_bytes = 0, io_written_bytes = 0;
  std::string io_engine;
  uint64_t pinned_budget = 0;
  uint64_t daemon_peak_rss = 0;  // VmHWM of the private daemon over this size's run (0: not ours)
  uint64_t window_peak = 0;      // largest resident bytes of the exchange region seen (sampled)
  // The same over the measured steps only (after InitParams and the warm-up
  // step).
  uint64_t window_step_peak = 0;
  uint64_t staging = 0;          // the daemon's NVMe staging for this job (3 sets x streams x tile)
  // The daemon's own breakdown of each measured step (GetStats' last_step,
  // read after the round's step).
  std::vector<StepBreakdown> daemon_steps;
  // The median of each field over the rounds.
  double DaemonMedian(double StepBreakdown::*field) const {
    std::vector<double> v;
    for (const StepBreakdown& b : daemon_steps) v.push_back(b.*field);
    return v.empty() ? 0 : Median(v);
  }
  double EarlyShards() const { return DaemonCount(&StepBreakdown::shards_early); }
  double DaemonCount(uint64_t StepBreakdown::*field) const {
    std::vector<double> v;
    for (const StepBreakdown& b : daemon_steps) v.push_back(static_cast<double>(b.*field));
    return v.empty() ? 0 : Median(v);
  }
  // The gradient bytes the window's budget sent to NVMe and back in a step
  // (median): NVMe traffic the io part does not have.
  double SpillBytes() const {
    return DaemonCount(&StepBreakdown::grad_bytes_spilled) + DaemonCount(&StepBreakdown::grad_bytes_read_back);
  }
  double step() const { return Median(step_s); }
  double optimizer() const { return Median(optimizer_s); }
  double io() const { return Median(io_s); }
  double slowest_part() const { return std::max(optimizer(), io()); }
  double efficiency() const { return step() > 0 ? slowest_part() / step() : 0; }
};

// Fills fp16 params (values around 0.01..0.02); the gradients (around 2^-7,
// mixed signs: finite, so no step is skipped for overflow) are copied into
// each grad slot before its GradReady, every step, as a trainer does: the
// infinity window frees a gradient's slot once the step used it.
absl::Status FillParams(ShardView& shard) {
  uint16_t* p = reinterpret_cast<uint16_t*>(shard.param);
  for (uint64_t i = 0; i < shard.padded_numel; ++i) p[i] = static_cast<uint16_t>(0x2000 + ((i * 7) & 0x3ff));
  return absl::OkStatus();
}

std::vector<uint16_t> GradPattern(uint64_t numel) {
  std::vector<uint16_t> g(numel);
  for (uint64_t i = 0; i < numel; ++i) g[i] = static_cast<uint16_t>(((i & 1) << 15) | (0x2000 + ((i * 13) & 0x3ff)));
  return g;
}

// The peak resident set of process `pid` (VmHWM), 0 when unreadable.
uint64_t PeakRss(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    uint64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(absl::StripAsciiWhitespace(line.substr(6)), "kB")), &kib)) {
      return kib * 1024;
    }
  }
  return 0;
}

class OffloadBench {
 public:
  explicit OffloadBench(Flags flags) : f_(std::move(flags)), pid_(getpid()) {}
  // Run() plus, on failure, the tail of the private daemon's log.
  absl::Status Run();

 private:
  bool wants_infinity() const {
    return std::find(f_.modes.begin(), f_.modes.end(), JobMode::kInfinity) != f_.modes.end();
  }
  // NVMe bytes to preallocate for `params` of states and params: the step
  // rewrites everything copy-on-write, and old extents are reused only after
  // a sync, so a few versions must fit.
  uint64_t StoreCapacity() const;
  absl::Status RunMeasurements();
  absl::Status Prepare();
  absl::StatusOr<ModeResult> RunMode(JobMode mode);
  // Returns the step's seconds, first gradient to WaitStep's return;
  // `exposed` (when set) gets those after the last gradient's GradReady.
  absl::StatusOr<double> DaemonStep(RankSession& rank, uint64_t step, double* exposed = nullptr);
  // The daemon's word on job `name` (ListJobs).
  absl::StatusOr<JobSummary> FindJob(const std::string& name);
  // One --params size: a fresh private daemon (so its peak RSS is this size's), each mode, then it stops.
  absl::Status RunSize(uint64_t params);
  void Report() const;
  absl::Status WriteJson() const;

  Flags f_;
  const pid_t pid_;
  std::unique_ptr<BenchScratchDir> scratch_;
  std::unique_ptr<BenchDaemon> daemon_;
  std::unique_ptr<StrataClient> client_;
  std::string io_dir_;
  std::vector<uint16_t> grad_pattern_;
  std::atomic<uint64_t> window_peak_{0};
  std::atomic<uint64_t> window_step_peak_{0};
  std::atomic<bool> in_steps_{false};
  std::vector<ModeResult> results_;
  std::string load_start_, load_end_;
};

uint64_t OffloadBench::StoreCapacity() const {
  const uint64_t per_version = f_.params * 12 + f_.params * 2 + (64ull << 20);
  double versions = 2.5;
  if (f_.fsync_policy == "batched") versions = std::min<uint32_t>(16, 3 + f_.steps) + 1.5;
  return RoundUp(static_cast<uint64_t>(versions * static_cast<double>(per_version)) + (256ull << 20), 1 << 20);
}

absl::Status OffloadBench::Prepare() {
  STRATA_ASSIGN_OR_RETURN(BenchScratchDir dir, BenchScratchDir::Create(f_.nvme_path));
  scratch_ = std::make_unique<BenchScratchDir>(std::move(dir));
  const bool launch = f_.socket.empty();
  if (wants_infinity()) {
    const uint64_t need = StoreCapacity() * (launch ? 2 : 1) + (1ull << 30);
    STRATA_ASSIGN_OR_RETURN(uint64_t free_bytes, scratch_->FreeBytes());
    if (free_bytes < need) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "need ", FormatBytes(need), " free at ", scratch_->path(), " (", launch ? "the daemon's NVMe tier and " : "",
          "the benchmark's own store), ", FormatBytes(free_bytes), " free; pass --nvme_path on a larger disk or "
          "fewer --params"));
    }
    io_dir_ = scratch_->path() + "/bench-io";
    std::filesystem::create_directories(io_dir_);
  }
  std::string socket = f_.socket;
  if (launch) {
    BenchDaemonOptions options;
    options.work_dir = scratch_->path();
    options.optimizer_threads = f_.threads;
    options.fsync_policy = f_.fsync_policy;
    if (wants_infinity()) {
      options.nvme_path = scratch_->path() + "/daemon-nvme";
      options.nvme_capacity_bytes = StoreCapacity();
      std::filesystem::create_directories(options.nvme_path);
    }
    STRATA_ASSIGN_OR_RETURN(daemon_, BenchDaemon::Start(options));
    socket = daemon_->socket_path();
    std::printf("daemon: private %s, %u optimizer threads, fsync %s%s (log %s)\n", daemon_->binary().c_str(),
                f_.threads, f_.fsync_policy.c_str(),
                wants_infinity() ? absl::StrCat(", NVMe ", options.nvme_path, " (",
                                                FormatBytes(options.nvme_capacity_bytes), ")").c_str()
                                 : "",
                daemon_->log_path().c_str());
  } else {
    std::printf("daemon: the running one on %s (its thread count and NVMe settings are its own; the parts below "
                "use --threads %u and fsync %s)\n",
                socket.c_str(), f_.threads, f_.fsync_policy.c_str());
  }
  ClientOptions options;
  options.socket_path = socket;
  options.step_timeout = absl::Minutes(10);
  options.rpc_timeout = absl::Minutes(5);  // RegisterTensors writes every initial state to NVMe
  STRATA_ASSIGN_OR_RETURN(client_, StrataClient::Connect(options));
  return absl::OkStatus();
}

// Trainer-side step time: from the start of the step's backward (--backward_s; none: the first
// gradient) to WaitStep's return.
absl::StatusOr<double> OffloadBench::DaemonStep(RankSession& rank, uint64_t step, double* exposed) {
  const int64_t start = MonotonicNanos();
  const auto backward_per_shard = std::chrono::duration<double>(
      rank.shards().empty() ? 0.0 : f_.backward_s / static_cast<double>(rank.shards().size()));
  int64_t last_grad = start;
  for (const ShardView& shard : rank.shards()) {
    if (f_.backward_s > 0) std::this_thread::sleep_for(backward_per_shard);
    // As a trainer does: WriteGrad waits for room in the gradient window
    // (the job's pinned budget), then copies the fastest way into the slot.
    STRATA_RETURN_IF_ERROR(rank.WriteGrad(shard.index, grad_pattern_.data(), shard.padded_numel * 2));
    STRATA_RETURN_IF_ERROR(rank.GradReady(shard.index, step));
    last_grad = MonotonicNanos();
  }
  STRATA_ASSIGN_OR_RETURN(StepResult result, rank.WaitStep(step));
  const int64_t end = MonotonicNanos();
  const double seconds = static_cast<double>(end - start) / 1e9;
  if (exposed != nullptr) *exposed = static_cast<double>(end - last_grad) / 1e9;
  if (result.skipped) return absl::InternalError(absl::StrCat("step ", step, " was skipped (gradient overflow)"));
  return seconds;
}

absl::StatusOr<JobSummary> OffloadBench::FindJob(const std::string& name) {
  STRATA_ASSIGN_OR_RETURN(std::vector<JobSummary> jobs, client_->ListJobs());
  for (JobSummary& j : jobs) {
    if (j.name == name) return std::move(j);
  }
  return absl::NotFoundError(absl::StrCat("job '", name, "' is not in the daemon's list"));
}

absl::StatusOr<ModeResult> OffloadBench::RunMode(JobMode mode) {
  ModeResult r;
  r.mode = mode;
  r.params = f_.params;
  std::vector<TensorDesc> tensors;
  for (uint64_t left = f_.params; left > 0;) {
    const uint64_t n = std::min(left, f_.tensor_elements);
    tensors.push_back(TensorDesc{absl::StrCat("layer", tensors.size()), n});
    left -= n;
  }
  const uint64_t sub_group =
      f_.sub_group != 0 ? f_.sub_group : RoundUp(std::max<uint64_t>(1, (f_.params + 7) / 8), kAlignElements);
  JobSpec spec;
  spec.name = absl::StrCat("strata-bench-offload-", pid_, "-", ModeName(mode));
  spec.world_size = 1;
  spec.mode = mode;
  spec.deepspeed_config_json = absl::StrCat(
      R"({"gradient_clipping": )", f_.gradient_clipping, R"(, "zero_optimization": {"stage": )",
      mode == JobMode::kInfinity ? 3 : 2,
      mode == JobMode::kOffload ? absl::StrCat(R"(, "sub_group_size": )", sub_group) : "",
      R"(}, "optimizer": {"type": "AdamW", "params": {"lr": )", kLr, R"(, "weight_decay": )", kWeightDecay,
      R"(}}, "fp16": {"enabled": true}})");
  spec.param_dtype = DType::kFp16;
  spec.grad_dtype = DType::kFp16;
  if (mode == JobMode::kInfinity) spec.pinned_budget_bytes = f_.pinned_budget;
  r.pinned_budget = mode == JobMode::kInfinity ? f_.pinned_budget : 0;
  if (f_.gradient_clipping > 0) {
    std::printf("\n%s: gradient_clipping %g -- every step waits for all gradients' norms\n", ModeName(mode),
                f_.gradient_clipping);
  }
  std::printf("\n%s: %s params as %zu tensors, %s; setting up the job...\n", ModeName(mode),
              FormatCount(f_.params).c_str(), tensors.size(),
              mode == JobMode::kOffload ? absl::StrCat("stage 2, sub-groups of ", FormatCount(sub_group)).c_str()
                                        : "stage 3, states and params on NVMe");
  std::fflush(stdout);
  STRATA_RETURN_IF_ERROR(client_->CreateJob(spec).status());
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RankSession> rank, client_->Attach(spec.name, 0));
  int64_t t = MonotonicNanos();
  STRATA_RETURN_IF_ERROR(rank->RegisterTensors(tensors));
  r.register_s = static_cast<double>(MonotonicNanos() - t) / 1e9;
  uint64_t largest = 0;
  for (const ShardView& shard : rank->shards()) largest = std::max(largest, shard.padded_numel);
  grad_pattern_ = GradPattern(largest);
  // Sample the region's resident bytes while the job runs (infinity: the window).
  window_peak_ = 0;
  window_step_peak_ = 0;
  in_steps_ = false;
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling.load()) {
      const uint64_t now = rank->ResidentRegionBytes().value_or(0);
      if (now > window_peak_.load()) window_peak_ = now;
      if (in_steps_.load() && now > window_step_peak_.load()) window_step_peak_ = now;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  struct Joiner {
    std::atomic<bool>& flag;
    std::thread& t;
    ~Joiner() {
      flag = false;
      if (t.joinable()) t.join();
    }
  } joiner{sampling, sampler};
  t = MonotonicNanos();
  // In the batches the daemon asks for (its window's room), as strata.torch does.
  STRATA_RETURN_IF_ERROR(rank->InitParamsInBatches(FillParams));
  r.init_s = static_cast<double>(MonotonicNanos() - t) / 1e9;
  // The layout is the daemon's: its shards (the session's view) and, in
  // infinity mode, the NVMe staging tile and the staging it holds, as the
  // job reports them (JobInfo), not re-derived here.
  STRATA_ASSIGN_OR_RETURN(const JobSummary job, FindJob(spec.name));
  StepShape shape;
  for (const ShardView& shard : rank->shards()) shape.shard_elements.push_back(shard.padded_numel);
  r.shards = static_cast<uint32_t>(shape.shard_elements.size());
  if (mode == JobMode::kInfinity) {
    if (job.nvme_tile_bytes < 4 || job.nvme_tile_bytes % 4 != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemon reports an NVMe tile of ", job.nvme_tile_bytes,
          " bytes for an infinity job; a stratad that exports its staging layout is needed"));
    }
    shape.tile_elements = job.nvme_tile_bytes / 4;  // fp32 states
    r.staging = job.nvme_staging_bytes;
  }

  STRATA_ASSIGN_OR_RETURN(r.warmup_s, DaemonStep(*rank, 0));
  // The gradient scale the daemon applied: 1 / loss scale (no clipping here).
  STRATA_ASSIGN_OR_RETURN(const JobSummary stepped, FindJob(spec.name));
  const double loss_scale = stepped.loss_scale;
  std::printf("  register %.2f s, init params %.2f s, warm-up step %.2f s; preparing the parts...\n", r.register_s,
              r.init_s, r.warmup_s);
  std::fflush(stdout);
  OptimizerHyperparams hp;
  hp.kind = OptimizerKind::kAdamW;
  hp.lr = kLr;
  hp.weight_decay = kWeightDecay;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerPart> optimizer,
                          OptimizerPart::Create(shape, static_cast<int>(f_.threads), hp,
                                                static_cast<float>(1.0 / loss_scale)));
  STRATA_RETURN_IF_ERROR(optimizer->Step().status());  // warm-up: thread pool, caches
  std::unique_ptr<NvmeIoPart> io;
  if (mode == JobMode::kInfinity) {
    NvmeIoPartOptions options;
    options.dir = io_dir_ + "/" + ModeName(mode);
    std::filesystem::create_directories(options.dir);
    options.capacity_bytes = StoreCapacity();
    STRATA_ASSIGN_OR_RETURN(SyncPolicy policy, ParseSyncPolicy(f_.fsync_policy));
    options.sync_policy = policy;
    STRATA_ASSIGN_OR_RETURN(io, NvmeIoPart::Create(shape, options));  // writes the initial states
    r.io_engine = io->Describe();
    r.io_read_bytes = io->bytes_read_per_step();
    r.io_written_bytes = io->bytes_written_per_step();
  }
  in_steps_ = true;
  // Each round measures the daemon's step and each part once, rotating which
  // goes first so slow drift on this shared machine hits all of them.
  for (uint32_t rep = 0; rep < f_.steps; ++rep) {
    for (int k = 0; k < 3; ++k) {
      switch ((rep + k) % 3) {
        case 0: {
          double exposed = 0;
          STRATA_ASSIGN_OR_RETURN(double s, DaemonStep(*rank, rep + 1, &exposed));
          r.step_s.push_back(s);
          r.exposed_s.push_back(exposed);
          STRATA_ASSIGN_OR_RETURN(StepBreakdown b, client_->LastStep(spec.name));
          r.daemon_steps.push_back(b);
          break;
        }
        case 1: {
          STRATA_ASSIGN_OR_RETURN(double s, optimizer->Step());
          r.optimizer_s.push_back(s);
          STRATA_ASSIGN_OR_RETURN(double i, optimizer->Inspect());
          r.inspect_s.push_back(i);
          break;
        }
        default:
          if (io != nullptr) {
            STRATA_ASSIGN_OR_RETURN(double s, io->Step());
            r.io_s.push_back(s);
          }
          break;
      }
    }
    std::printf("  round %u: step %.3f s, optimizer %.3f s, io %s\n", rep + 1, r.step_s.back(),
                r.optimizer_s.back(), io != nullptr ? absl::StrFormat("%.3f s", r.io_s.back()).c_str() : "-");
    std::fflush(stdout);
  }
  io.reset();
  optimizer.reset();
  sampling = false;
  sampler.join();
  r.window_peak = window_peak_.load();
  r.window_step_peak = window_step_peak_.load();
  rank.reset();
  STRATA_RETURN_IF_ERROR(client_->DeleteJob(spec.name));
  return r;
}

void OffloadBench::Report() const {
  std::printf("\n%-9s %8s %6s %5s %8s %12s %11s %8s %9s %10s %8s\n", "mode", "params", "shards", "steps", "step s",
              "after grads", "optimizer s", "io s", "inspect s", "max(parts)", "overlap");
  for (const ModeResult& r : results_) {
    std::printf("%-9s %8s %6u %5zu %8.3f %12.3f %11.3f %8.3f %9.3f %10.3f %8.3f\n", ModeName(r.mode),
                FormatCount(r.params).c_str(), r.shards, r.step_s.size(), r.step(), Median(r.exposed_s),
                r.optimizer(), r.io(), Median(r.inspect_s), r.slowest_part(), r.efficiency());
  }
  if (f_.backward_s > 0) {
    std::printf("\nthe trainer's backward: %.3f s per step (--backward_s), spread evenly before the gradients and "
                "inside step s; after grads = the step's time after the last gradient's GradReady, what the "
                "trainer waits for beyond its backward\n", f_.backward_s);
  }
  std::printf("\nmedians of %u rounds; step s = trainer side, first gradient to WaitStep's return; after grads = "
              "from the last GradReady; optimizer s = "
              "CpuOptimizer::Step alone on the same elements, %u threads, fp16 grads in and fp16 params out; io s = "
              "the step's NVMe reads and writes alone, one after another; inspect s = the daemon's per-gradient "
              "inf/nan check and norm alone (inside step s, not a part); overlap = max(optimizer s, io s) / step s\n",
              f_.steps, f_.threads);
  for (const ModeResult& r : results_) {
    std::printf("  %s runs: step %s | optimizer %s | io %s\n", ModeName(r.mode), JoinSamples(r.step_s, 3).c_str(),
                JoinSamples(r.optimizer_s, 3).c_str(), r.io_s.empty() ? "-" : JoinSamples(r.io_s, 3).c_str());
    if (r.mode == JobMode::kInfinity) {
      std::printf("  %s io per step: read %s, write %s (%.2f GB/s over io s) via %s\n", ModeName(r.mode),
                  FormatBytes(r.io_read_bytes).c_str(), FormatBytes(r.io_written_bytes).c_str(),
                  static_cast<double>(r.io_read_bytes + r.io_written_bytes) / r.io() / 1e9, r.io_engine.c_str());
    }
  }
  // Where the daemon says the step went: the trainer-side step s is
  // gradients in + stream + end + commit plus the RPCs around them.
  std::printf("\ndaemon's step breakdown (medians of the rounds):\n");
  std::printf("%-9s %8s %8s %9s %7s %6s %8s %10s %11s %8s %11s %10s %11s %10s %11s %7s %8s %10s\n", "mode",
              "params", "step s", "grads in", "early", "passes", "early s", "early load", "early params", "stream", "load wait", "save wait", "optimizer", "grads back", "params home", "end",
              "commit", "spilled");
  for (const ModeResult& r : results_) {
    std::printf("%-9s %8s %8.3f %9.3f %4.0f/%-2u %6.0f %8.3f %10.3f %12.3f %8.3f %11.3f %10.3f %11.3f %10.3f %11.3f "
                "%7.3f %8.3f %10s\n",
                ModeName(r.mode), FormatCount(r.params).c_str(), r.step(),
                r.DaemonMedian(&StepBreakdown::gradients_in_s), r.EarlyShards(), r.shards,
                r.DaemonCount(&StepBreakdown::early_passes), r.DaemonMedian(&StepBreakdown::early_stream_s),
                r.DaemonMedian(&StepBreakdown::early_load_wait_s), r.DaemonMedian(&StepBreakdown::early_params_home_s),
                r.DaemonMedian(&StepBreakdown::stream_s), r.DaemonMedian(&StepBreakdown::load_wait_s),
                r.DaemonMedian(&StepBreakdown::save_wait_s), r.DaemonMedian(&StepBreakdown::optimizer_s),
                r.DaemonMedian(&StepBreakdown::grads_back_s), r.DaemonMedian(&StepBreakdown::params_home_s),
                r.DaemonMedian(&StepBreakdown::end_s), r.DaemonMedian(&StepBreakdown::commit_s),
                FormatBytes(static_cast<uint64_t>(r.DaemonCount(&StepBreakdown::grad_bytes_spilled))).c_str());
  }
  std::printf("the daemon's GetStats last_step after each round's step: grads in = first GradReady to the "
              "optimizer step's start (the gradient copies, inspections and spills; all sent at once here, so pure "
              "overhead, where training overlaps it with backward); early = shards the daemon stepped while the "
              "gradients came in (of the rank's shards; their time is inside grads in, not stream); passes = the early "
              "passes that stepped them (a pass takes the shards inspected while it runs and, once every gradient is in, "
              "the rest); early s = those passes over the states (inside grads in), of which early load = blocked on "
              "NVMe state-tile loads and early params = on the new params' writes; stream = the step's "
              "pass over the remaining shards' states, holding "
              "load wait / save wait (blocked on NVMe state tiles), optimizer, grads back (spilled gradients read) "
              "and params home (new params written); end = the pipeline's drain; commit = the step made durable; "
              "spilled = gradient bytes the window's budget wrote to NVMe in the step (each read back by it)\n");
  std::printf("\nmemory (infinity: the window bounded by the job's pinned budget):\n");
  std::printf("%-9s %8s %14s %14s %14s %14s %16s %12s\n", "mode", "params", "pinned budget", "staging",
              "window peak", "in steps", "daemon peak RSS", "allowed");
  for (const ModeResult& r : results_) {
    const uint64_t allowed = r.pinned_budget + r.staging + (256ull << 20);
    std::printf("%-9s %8s %14s %14s %14s %14s %16s %12s\n", ModeName(r.mode), FormatCount(r.params).c_str(),
                r.pinned_budget ? FormatBytes(r.pinned_budget).c_str() : "-", FormatBytes(r.staging).c_str(),
                FormatBytes(r.window_peak).c_str(), FormatBytes(r.window_step_peak).c_str(),
                r.daemon_peak_rss ? FormatBytes(r.daemon_peak_rss).c_str() : "(not ours)",
                r.pinned_budget ? FormatBytes(allowed).c_str() : "-");
  }
  std::printf("window peak = the exchange region's resident bytes, sampled every 20 ms from the trainer's side "
              "(mincore), from InitParams on (written in the daemon's batches); in steps "
              "= the same over the measured steps only; daemon peak RSS = VmHWM of a private daemon started for this size; allowed = budget + "
              "staging + 256 MiB\n");
  std::printf("\nload average at start %s, at end %s (1/5/15 min)\n", load_start_.c_str(), load_end_.c_str());
  std::printf("\ntargets:\n");
  const ModeResult* first_infinity = nullptr;
  for (const ModeResult& r : results_) {
    if (r.mode != JobMode::kInfinity) {
      std::printf("  offload: no stated target; step is %.2fx the optimizer alone\n", r.step() / r.optimizer());
      continue;
    }
    if (r.pinned_budget > 0 && r.daemon_peak_rss > 0) {
      const uint64_t allowed = r.pinned_budget + r.staging + (256ull << 20);
      std::printf("  infinity %s: daemon peak RSS %s <= budget + staging + 256 MiB = %s -> %s\n",
                  FormatCount(r.params).c_str(), FormatBytes(r.daemon_peak_rss).c_str(), FormatBytes(allowed).c_str(),
                  r.daemon_peak_rss <= allowed ? "MET" : "MISSED");
      if (first_infinity != nullptr && first_infinity->daemon_peak_rss > 0) {
        const double growth = static_cast<double>(r.daemon_peak_rss) / first_infinity->daemon_peak_rss - 1;
        std::printf("  infinity daemon peak RSS growth %s -> %s: %+.1f%% (target <= +10%%) -> %s\n",
                    FormatCount(first_infinity->params).c_str(), FormatCount(r.params).c_str(), growth * 100,
                    growth <= 0.10 ? "MET" : "MISSED");
      }
      if (first_infinity == nullptr) first_infinity = &r;
    }
    if (r.io() > 0 && r.io_read_bytes + r.io_written_bytes > 0 && r.SpillBytes() > 0) {
      // The spill is I/O the io part does not do: where the step is
      // disk-bound, no overlap brings it below this ratio.
      const double io_bytes = static_cast<double>(r.io_read_bytes + r.io_written_bytes);
      const double floor = (io_bytes + r.SpillBytes()) / io_bytes;
      std::printf("  infinity %s: the step moves %s of NVMe traffic, the io part %s (the spilled gradients out and "
                  "back): %.3fx the io part's time at its bandwidth%s\n",
                  FormatCount(r.params).c_str(), FormatBytes(static_cast<uint64_t>(io_bytes + r.SpillBytes())).c_str(),
                  FormatBytes(static_cast<uint64_t>(io_bytes)).c_str(), floor,
                  r.io() >= r.optimizer() ? ", the lowest step ratio this budget allows on a disk-bound step" : "");
    }
    if (f_.backward_s > 0) {
      std::printf("  infinity %s: with a backward of %.3f s the step ends %.3f s after the last gradient, %.3fx "
                  "max(optimizer, NVMe); the step target below is of a step without backward (--backward_s 0)\n",
                  FormatCount(r.params).c_str(), f_.backward_s, Median(r.exposed_s),
                  Median(r.exposed_s) / r.slowest_part());
      continue;
    }
    const double ratio = r.step() / r.slowest_part();
    std::printf("  infinity %s step <= %.2fx max(optimizer, NVMe) for 200M params%s: %.3fx -> %s\n", FormatCount(r.params).c_str(), kInfinityTarget,
                r.params == kTargetParams ? "" : absl::StrCat(" (this run: ", FormatCount(r.params), ")").c_str(),
                ratio,
                ratio <= kInfinityTarget
                    ? "MET"
                    : absl::StrFormat("MISSED by %.3fx: step %.2f s, %.2f s over the %.2f s allowed", ratio - kInfinityTarget,
                                      r.step(), r.step() - kInfinityTarget * r.slowest_part(),
                                      kInfinityTarget * r.slowest_part())
                          .c_str());
  }
}

absl::Status OffloadBench::WriteJson() const {
  if (f_.json_path.empty()) return absl::OkStatus();
  std::vector<nlohmann::json> items;
  for (const ModeResult& r : results_) {
    items.push_back({{"mode", ModeName(r.mode)},
                     {"params", r.params},
                     {"step_s", r.step()},
                     {"optimizer_s", r.optimizer()},
                     {"io_s", r.io()},
                     {"overlap_efficiency", r.efficiency()},
                     {"inspect_s", Median(r.inspect_s)},
                     {"step_s_runs", r.step_s},
                     {"optimizer_s_runs", r.optimizer_s},
                     {"io_s_runs", r.io_s},
                     {"shards", r.shards},
                     {"threads", f_.threads},
                     {"gradient_clipping", f_.gradient_clipping},
                     {"backward_s", f_.backward_s},
                     {"after_grads_s", Median(r.exposed_s)},
                     {"after_grads_s_runs", r.exposed_s},
                     {"warmup_step_s", r.warmup_s},
                     {"io_read_bytes_per_step", r.io_read_bytes},
                     {"io_written_bytes_per_step", r.io_written_bytes},
                     {"io_engine", r.io_engine},
                     {"fsync_policy", f_.fsync_policy},
                     {"pinned_budget_bytes", r.pinned_budget},
                     {"daemon_peak_rss_bytes", r.daemon_peak_rss},
                     {"window_step_peak_bytes", r.window_step_peak},
                     {"window_peak_bytes", r.window_peak},
                     {"staging_bytes", r.staging},
                     {"daemon_step", {{"gradients_in_s", r.DaemonMedian(&StepBreakdown::gradients_in_s)},
                                      {"stream_s", r.DaemonMedian(&StepBreakdown::stream_s)},
                                      {"load_wait_s", r.DaemonMedian(&StepBreakdown::load_wait_s)},
                                      {"save_wait_s", r.DaemonMedian(&StepBreakdown::save_wait_s)},
                                      {"optimizer_s", r.DaemonMedian(&StepBreakdown::optimizer_s)},
                                      {"grads_back_s", r.DaemonMedian(&StepBreakdown::grads_back_s)},
                                      {"params_home_s", r.DaemonMedian(&StepBreakdown::params_home_s)},
                                      {"end_s", r.DaemonMedian(&StepBreakdown::end_s)},
                                      {"commit_s", r.DaemonMedian(&StepBreakdown::commit_s)},
                                      {"shards_early", r.EarlyShards()},
                                      {"early_passes", r.DaemonCount(&StepBreakdown::early_passes)},
                                      {"early_stream_s", r.DaemonMedian(&StepBreakdown::early_stream_s)},
                                      {"early_load_wait_s", r.DaemonMedian(&StepBreakdown::early_load_wait_s)},
                                      {"early_params_home_s", r.DaemonMedian(&StepBreakdown::early_params_home_s)},
                                      {"grad_bytes_spilled", r.DaemonCount(&StepBreakdown::grad_bytes_spilled)},
                                      {"grad_bytes_read_back", r.DaemonCount(&StepBreakdown::grad_bytes_read_back)},
                                      {"rounds", r.daemon_steps.size()}}},
                     {"load_average_start", load_start_},
                     {"load_average_end", load_end_}});
  }
  // One mode: the object itself; several: {"results": [...]}.
  nlohmann::json j = items.size() == 1 ? items[0] : nlohmann::json{{"results", items}};
  return WriteBenchJson(f_.json_path, j.dump(2));
}

absl::Status OffloadBench::Run() { return WithDaemonLogTail(RunMeasurements(), daemon_.get()); }

absl::Status OffloadBench::RunMeasurements() {
  load_start_ = LoadAverageText();
  std::printf("machine: %ld cores, load average %s\n", sysconf(_SC_NPROCESSORS_ONLN), load_start_.c_str());
  for (uint64_t params : f_.sizes) STRATA_RETURN_IF_ERROR(RunSize(params));
  load_end_ = LoadAverageText();
  Report();
  return WriteJson();
}

absl::Status OffloadBench::RunSize(uint64_t params) {
  f_.params = params;
  STRATA_RETURN_IF_ERROR(Prepare());
  const size_t first = results_.size();
  for (JobMode mode : f_.modes) {
    STRATA_ASSIGN_OR_RETURN(ModeResult r, RunMode(mode));
    results_.push_back(std::move(r));
  }
  client_.reset();
  if (daemon_ != nullptr) {
    // The daemon's peak over this size: every mode of it ran in this daemon.
    const uint64_t peak = PeakRss(daemon_->pid());
    for (size_t i = first; i < results_.size(); ++i) results_[i].daemon_peak_rss = peak;
    STRATA_RETURN_IF_ERROR(daemon_->Stop());
    daemon_.reset();
  }
  scratch_.reset();  // the NVMe files go before the next size's are made
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseWhole(absl::string_view text, uint64_t min, uint64_t max) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a whole number in ", min, "..", max));
  }
  return v;
}

}  // namespace

int RunOffloadBench(int argc, char** argv) {
  Flags f;
  CommandLine cl("strata bench offload");
  cl.AddString("socket", &f.socket, "measure the stratad on this socket (default: start a private one)");
  cl.AddString("json", &f.json_path, "write results as JSON to this file");
  cl.AddParsed("params", [&](absl::string_view v) -> absl::Status {
    f.sizes.clear();
    for (absl::string_view part : absl::StrSplit(v, ',')) {
      STRATA_ASSIGN_OR_RETURN(uint64_t n, ParseCount(part));
      if (n < kAlignElements) return absl::InvalidArgumentError("--params: each size must be at least 2048");
      f.sizes.push_back(n);
    }
    return absl::OkStatus();
  }, "parameters of the model, e.g. 200M or 1.3B, or a list (200M,800M: one run each, a fresh daemon per size; "
     "default 200M)");
  cl.AddParsed("pinned_budget", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.pinned_budget, ParseByteSize(v));
    return absl::OkStatus();
  }, "infinity: the job's pinned budget (its window of params and gradients in memory), e.g. 512MiB "
     "(default: the daemon's, which keeps everything)");
  cl.AddParsed("mode", [&](absl::string_view v) -> absl::Status {
    if (v == "offload") f.modes = {JobMode::kOffload};
    else if (v == "infinity") f.modes = {JobMode::kInfinity};
    else if (v == "both") f.modes = {JobMode::kOffload, JobMode::kInfinity};
    else return absl::InvalidArgumentError(absl::StrCat("--mode '", v, "': use offload, infinity or both"));
    return absl::OkStatus();
  }, "offload (states in pinned memory), infinity (states on NVMe) or both (default infinity)");
  cl.AddParsed("gradient_clipping", [&](absl::string_view v) -> absl::Status {
    if (!absl::SimpleAtod(v, &f.gradient_clipping) || !(f.gradient_clipping >= 0) ||
        !std::isfinite(f.gradient_clipping)) {
      return absl::InvalidArgumentError(absl::StrCat("--gradient_clipping '", v, "': use a number >= 0"));
    }
    return absl::OkStatus();
  }, "the job's gradient_clipping (default 0: none). With clipping the daemon waits for every gradient's norm "
     "before stepping any shard (no early steps); the benchmark's gradients have a norm far below 1e6, so "
     "1e6 costs the wait without changing the arithmetic");
  cl.AddParsed("backward_s", [&](absl::string_view v) -> absl::Status {
    if (!absl::SimpleAtod(v, &f.backward_s) || !(f.backward_s >= 0) || !(f.backward_s <= 3600)) {
      return absl::InvalidArgumentError(absl::StrCat("--backward_s '", v, "': use seconds from 0 to 3600"));
    }
    return absl::OkStatus();
  }, "the trainer's backward per step, in seconds, spread evenly before the gradients (default 0: all sent at "
     "once). The table's 'after grads' is then what the trainer waits for beyond it: the step's exposed part");
  cl.AddParsed("steps", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t n, ParseWhole(v, 1, 1000));
    f.steps = static_cast<uint32_t>(n);
    return absl::OkStatus();
  }, "measured rounds after the warm-up step; the median is reported (default 3)");
  cl.AddString("nvme_path", &f.nvme_path,
               "directory on the NVMe for the daemon's tier and the I/O part (default /var/tmp; never tmpfs)");
  cl.AddParsed("threads", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t n, ParseWhole(v, 1, 1024));
    f.threads = static_cast<uint32_t>(n);
    return absl::OkStatus();
  }, "CPU optimizer threads, for the daemon and the optimizer part (default 2)");
  cl.AddParsed("tensor", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.tensor_elements, ParseCount(v));
    if (f.tensor_elements == 0) return absl::InvalidArgumentError("--tensor must be positive");
    return absl::OkStatus();
  }, "elements per model tensor (default 10M)");
  cl.AddParsed("sub_group", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.sub_group, ParseCount(v));
    return absl::OkStatus();
  }, "offload mode: ZeRO sub_group_size in elements (default params / 8)");
  cl.AddParsed("fsync_policy", [&](absl::string_view v) -> absl::Status {
    if (v != "every_commit" && v != "batched" && v != "never") {
      return absl::InvalidArgumentError("--fsync_policy: use every_commit, batched or never");
    }
    f.fsync_policy = std::string(v);
    return absl::OkStatus();
  }, "the daemon's and the I/O part's fsync policy (default every_commit, which also bounds the NVMe space "
     "the copy-on-write store needs to ~2.5 versions of the states)");
  if (absl::Status s = cl.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (cl.help_requested()) {
    std::printf("%s", cl.Usage().c_str());
    return 0;
  }
  OffloadBench bench(std::move(f));
  if (absl::Status s = bench.Run(); !s.ok()) {
    std::fprintf(stderr, "strata bench offload: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata
