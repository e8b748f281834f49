#include "bench/rpc_bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/daemon_launcher.h"
#include "bench/rpc_workers.h"
#include "bench/sample_stats.h"
#include "client/strata_client.h"
#include "core/byte_size.h"
#include "core/command_line.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

constexpr uint64_t kAlignElements = 2048;  // ZeRO partition alignment (4 KiB / 2 bytes)
constexpr int kWarmupCalls = 1000;
constexpr uint16_t kFp16One = 0x3C00;

struct Flags {
  std::string socket;
  std::string json_path;
  uint64_t calls = 20000;
  int clients = 8;
  uint64_t bucket_bytes = 64ull << 20;
  uint32_t handoff_reps = 15;
  absl::Duration settle = absl::Milliseconds(50);
  uint32_t daemon_threads = 0;  // 0: the daemon's default (one per core)
  uint64_t worker_calls = 0;  // internal: run as a client process
  // Elements of the job kept stepping in the background while GradReady is
  // measured (0: an idle daemon).
  uint64_t background_elements = 1ull << 20;
};

struct Latency {
  std::string call;
  std::string what;
  std::vector<double> us;
  double p50() const { return Percentile(us, 50); }
  double p99() const { return Percentile(us, 99); }
};

struct Handoff {
  std::vector<double> memcpy_s, handoff_s, ratios;  // ratio = memcpy / hand-off, per pair
  std::vector<double> slot_copy_s, grad_ready_s;     // the hand-off's two halves
  std::vector<double> flush_s;        // after the hand-off: until the daemon has taken the signal
  std::vector<double> slot_memcpy_s;  // std::memcpy into the slot instead of WriteGrad (not a hand-off)
};

// Stops the compiler from dropping a copy whose destination is never read.
void Clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

struct PrivateBuffer {
  explicit PrivateBuffer(uint64_t bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))), size(bytes) {}
  ~PrivateBuffer() { std::free(data); }
  std::byte* data;
  uint64_t size;
};

class RpcBench {
 public:
  explicit RpcBench(Flags flags) : f_(std::move(flags)), pid_(getpid()) {}
  // Run() plus, on failure, the tail of the private daemon's log.
  absl::Status Run();

 private:
  absl::Status RunMeasurements();
  absl::Status Connect();
  absl::StatusOr<std::unique_ptr<RankSession>> OpenRank(StrataClient& client, const std::string& name,
                                                        uint64_t sub_group, const std::vector<TensorDesc>& tensors,
                                                        size_t shards);
  absl::Status MeasureNoop();
  // GradReady of a re-sent shard: through the doorbell (signal + Flush, the
  // daemon has taken it; and the signal alone) and through gRPC, while a
  // background job keeps the daemon stepping.
  absl::Status MeasureGradReady();
  absl::Status MeasureGradReadyOn(StrataClient& client, const std::string& suffix, bool flush, Latency l);
  // Steps a job of background_elements in a loop on its own connection until
  // stop_background_ is set.
  absl::Status StartBackground();
  absl::Status StopBackground();
  absl::Status MeasureConcurrent();
  absl::Status MeasureHandoff();
  void Report() const;
  absl::Status WriteJson() const;

  Flags f_;
  const pid_t pid_;
  std::unique_ptr<BenchScratchDir> scratch_;
  std::unique_ptr<BenchDaemon> daemon_;
  std::string socket_;
  std::unique_ptr<StrataClient> client_;
  std::vector<Latency> latencies_;
  ConcurrentCallsResult concurrent_;
  Handoff handoff_;
  uint64_t bucket_elements_ = 0;
  std::string load_start_, load_end_;
  bool doorbell_ = false;  // the daemon offered the doorbell
  std::thread background_;
  std::atomic<bool> stop_background_{false};
  std::atomic<uint64_t> background_steps_{0};
  absl::Status background_status_;  // written by background_, read after join
};

absl::Status RpcBench::Connect() {
  socket_ = f_.socket;
  if (socket_.empty()) {
    STRATA_ASSIGN_OR_RETURN(BenchScratchDir dir, BenchScratchDir::Create(""));
    scratch_ = std::make_unique<BenchScratchDir>(std::move(dir));
    BenchDaemonOptions options;
    options.work_dir = scratch_->path();
    options.optimizer_threads = f_.daemon_threads;
    STRATA_ASSIGN_OR_RETURN(daemon_, BenchDaemon::Start(options));
    socket_ = daemon_->socket_path();
    std::printf("daemon: private %s on %s (log %s)\n", daemon_->binary().c_str(), socket_.c_str(),
                daemon_->log_path().c_str());
  } else {
    std::printf("daemon: the running one on %s\n", socket_.c_str());
  }
  ClientOptions options;
  options.socket_path = socket_;
  STRATA_ASSIGN_OR_RETURN(client_, StrataClient::Connect(options));
  return absl::OkStatus();
}

// A 1-rank ZeRO-Offload job with fp16 params and gradients, registered and
// initialized, whose flat shard is cut into `shards` sub-groups of at most
// `sub_group` elements.
absl::StatusOr<std::unique_ptr<RankSession>> RpcBench::OpenRank(StrataClient& client, const std::string& name,
                                                               uint64_t sub_group,
                                                               const std::vector<TensorDesc>& tensors,
                                                               size_t shards) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 1;
  spec.mode = JobMode::kOffload;
  spec.deepspeed_config_json = absl::StrCat(
      R"({"gradient_clipping": 0, "zero_optimization": {"stage": 2, "sub_group_size": )", sub_group,
      R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "fp16": {"enabled": true}})");
  spec.param_dtype = DType::kFp16;
  spec.grad_dtype = DType::kFp16;
  STRATA_RETURN_IF_ERROR(client.CreateJob(spec).status());
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RankSession> rank, client.Attach(name, 0));
  STRATA_RETURN_IF_ERROR(rank->RegisterTensors(tensors));
  for (ShardView& shard : rank->shards()) {
    uint16_t* p = reinterpret_cast<uint16_t*>(shard.param);
    uint16_t* g = reinterpret_cast<uint16_t*>(shard.grad);
    for (uint64_t i = 0; i < shard.padded_numel; ++i) p[i] = g[i] = kFp16One;
  }
  STRATA_RETURN_IF_ERROR(rank->InitParams());
  if (rank->shards().size() != shards) {
    return absl::InternalError(absl::StrCat("job ", name, " has ", rank->shards().size(), " sub-groups, expected ",
                                            shards));
  }
  return rank;
}

absl::Status RpcBench::MeasureNoop() {
  Latency l{"noop", "Noop: empty unary gRPC call over the Unix socket", {}};
  for (int i = 0; i < kWarmupCalls; ++i) STRATA_RETURN_IF_ERROR(client_->Noop());
  l.us.reserve(f_.calls);
  for (uint64_t i = 0; i < f_.calls; ++i) {
    const int64_t t0 = MonotonicNanos();
    absl::Status s = client_->Noop();
    const int64_t t1 = MonotonicNanos();
    STRATA_RETURN_IF_ERROR(s);
    l.us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  latencies_.push_back(std::move(l));
  return absl::OkStatus();
}

absl::Status RpcBench::StartBackground() {
  if (f_.background_elements == 0) return absl::OkStatus();
  ClientOptions options;
  options.socket_path = socket_;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<StrataClient> client, StrataClient::Connect(options));
  const uint64_t n = std::max<uint64_t>(kAlignElements, f_.background_elements / kAlignElements * kAlignElements);
  const std::string name = absl::StrCat("strata-bench-rpc-", pid_, "-background");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RankSession> rank, OpenRank(*client, name, n, {{"w", n}}, 1));
  background_ = std::thread([this, client = std::move(client), rank = std::move(rank), name]() mutable {
    absl::Status s;
    for (uint64_t step = 0; s.ok() && !stop_background_.load(); ++step) {
      s = rank->GradReady(0, step);
      if (s.ok()) s = rank->WaitStep(step).status();
      if (s.ok()) background_steps_.fetch_add(1);
    }
    rank.reset();
    if (s.ok()) s = client->DeleteJob(name);
    background_status_ = s;
  });
  return absl::OkStatus();
}

absl::Status RpcBench::StopBackground() {
  if (!background_.joinable()) return absl::OkStatus();
  stop_background_ = true;
  background_.join();
  if (!background_status_.ok()) {
    return absl::Status(background_status_.code(),
                        absl::StrCat("the background stepping job: ", background_status_.message()));
  }
  return absl::OkStatus();
}

absl::Status RpcBench::MeasureGradReadyOn(StrataClient& client, const std::string& suffix, bool flush, Latency l) {
  // Two sub-groups of 4096 elements; only sub-group 0 is ever signalled, so
  // step 0 never runs and every call is a re-send of the same gradient,
  // which the daemon accepts and queues for re-inspection (inf/nan check and
  // norm of 4096 fp16 values on its worker, after the reply).
  const std::string name = absl::StrCat("strata-bench-rpc-", pid_, "-grad-ready-", suffix);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RankSession> rank,
                          OpenRank(client, name, 2 * kAlignElements, {{"w", 4 * kAlignElements}}, 2));
  if (&client == client_.get()) doorbell_ = rank->doorbell_active();
  for (int i = 0; i < kWarmupCalls; ++i) {
    STRATA_RETURN_IF_ERROR(rank->GradReady(0, 0));
    if (flush) STRATA_RETURN_IF_ERROR(rank->Flush());
  }
  STRATA_RETURN_IF_ERROR(rank->Flush());
  l.us.reserve(f_.calls);
  for (uint64_t i = 0; i < f_.calls; ++i) {
    const int64_t t0 = MonotonicNanos();
    absl::Status s = rank->GradReady(0, 0);
    if (s.ok() && flush) s = rank->Flush();
    const int64_t t1 = MonotonicNanos();
    STRATA_RETURN_IF_ERROR(s);
    l.us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  STRATA_RETURN_IF_ERROR(rank->Flush());
  latencies_.push_back(std::move(l));
  rank.reset();
  return client.DeleteJob(name);
}

absl::Status RpcBench::MeasureGradReady() {
  STRATA_RETURN_IF_ERROR(StartBackground());
  const std::string stepping =
      f_.background_elements == 0
          ? std::string("idle daemon")
          : absl::StrCat("daemon stepping a ", FormatBytes(f_.background_elements * 2), " fp16 job meanwhile");
  absl::Status s = MeasureGradReadyOn(
      *client_, "doorbell", /*flush=*/true,
      {"grad_ready", absl::StrCat("GradReady(shard 0, step 0) re-sent, through the doorbell (shared-memory ring + "
                                  "eventfd) when offered, until the daemon has taken it (Flush): the same "
                                  "bookkeeping as the gRPC reply; ", stepping),
       {}});
  if (s.ok()) {
    s = MeasureGradReadyOn(*client_, "post", /*flush=*/false,
                           {"grad_ready_post",
                            absl::StrCat("the same GradReady, returning once the signal is in the ring "
                                         "(what a trainer waits for between buckets); ", stepping),
                            {}});
  }
  if (s.ok()) {
    // The peer: the same call over gRPC (an older daemon, or use_doorbell off).
    ClientOptions options;
    options.socket_path = socket_;
    options.use_doorbell = false;
    absl::StatusOr<std::unique_ptr<StrataClient>> grpc_client = StrataClient::Connect(options);
    s = grpc_client.status();
    if (s.ok()) {
      s = MeasureGradReadyOn(**grpc_client, "grpc", /*flush=*/false,
                             {"grad_ready_grpc",
                              absl::StrCat("the same GradReady as a unary gRPC call (the fallback path); ", stepping),
                              {}});
    }
  }
  absl::Status stopped = StopBackground();
  return s.ok() ? stopped : s;
}

absl::Status RpcBench::MeasureConcurrent() {
  const uint64_t per_client = std::max<uint64_t>(1, f_.calls / f_.clients);
  STRATA_ASSIGN_OR_RETURN(concurrent_, RunConcurrentNoopClients(socket_, f_.clients, per_client));
  return absl::OkStatus();
}

absl::Status RpcBench::MeasureHandoff() {
  // One tensor, one sub-group: the bucket. Each hand-off is a real step: the
  // trainer copies its bucket into the slot and signals it (the timed part),
  // then waits for the step, so the daemon -- which inspects the bucket and
  // runs the optimizer on it after GradReady returns -- is idle again before
  // the next timed copy of either kind.
  bucket_elements_ = std::max<uint64_t>(kAlignElements, f_.bucket_bytes / 2 / kAlignElements * kAlignElements);
  const uint64_t bytes = bucket_elements_ * 2;
  const std::string name = absl::StrCat("strata-bench-rpc-", pid_, "-handoff");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<RankSession> rank,
                          OpenRank(*client_, name, bucket_elements_, {{"bucket", bucket_elements_}}, 1));
  ShardView& slot = rank->shards()[0];
  if (slot.padded_numel != bucket_elements_) {
    return absl::InternalError(absl::StrCat("the bucket's sub-group holds ", slot.padded_numel,
                                            " elements, expected ", bucket_elements_));
  }
  // The trainer's gradient bucket and the private destination, both touched
  // before timing (the shared slot was touched by OpenRank and is mapped
  // with MAP_POPULATE).
  PrivateBuffer source(bytes), private_copy(bytes);
  uint16_t* src = reinterpret_cast<uint16_t*>(source.data);
  for (uint64_t i = 0; i < bucket_elements_; ++i) src[i] = static_cast<uint16_t>(kFp16One + (i & 0xff));
  std::memset(private_copy.data, 0, bytes);
  uint64_t step = 0;
  // What the trainer pays: the copy into the slot (WriteGrad, streaming
  // stores) and GradReady (with the doorbell: the signal is in the ring). The
  // daemon taking the signal (Flush) is timed apart, outside the ratio.
  auto handoff = [&]() -> absl::StatusOr<double> {
    const int64_t t0 = MonotonicNanos();
    STRATA_RETURN_IF_ERROR(rank->WriteGrad(0, source.data, bytes));
    Clobber(slot.grad);
    const int64_t t1 = MonotonicNanos();
    STRATA_RETURN_IF_ERROR(rank->GradReady(0, step));
    const int64_t t2 = MonotonicNanos();
    STRATA_RETURN_IF_ERROR(rank->Flush());
    const int64_t t3 = MonotonicNanos();
    const double seconds = static_cast<double>(t2 - t0) / 1e9;
    if (step > 0) {  // not the warm-up
      handoff_.slot_copy_s.push_back(static_cast<double>(t1 - t0) / 1e9);
      handoff_.grad_ready_s.push_back(static_cast<double>(t2 - t1) / 1e9);
      handoff_.flush_s.push_back(static_cast<double>(t3 - t2) / 1e9);
    }
    STRATA_ASSIGN_OR_RETURN(StepResult result, rank->WaitStep(step));
    if (result.skipped) return absl::InternalError("the hand-off step was skipped (gradient overflow)");
    ++step;
    return seconds;
  };
  STRATA_RETURN_IF_ERROR(handoff().status());  // warm-up
  for (uint32_t rep = 0; rep < f_.handoff_reps; ++rep) {
    double times[2] = {0, 0};  // memcpy, hand-off
    for (int side = 0; side < 2; ++side) {
      const bool do_handoff = (side == 0) == (rep % 2 == 1);  // alternate which goes first
      absl::SleepFor(f_.settle);
      if (do_handoff) {
        STRATA_ASSIGN_OR_RETURN(times[1], handoff());
      } else {
        const int64_t t0 = MonotonicNanos();
        std::memcpy(private_copy.data, source.data, bytes);
        Clobber(private_copy.data);
        times[0] = static_cast<double>(MonotonicNanos() - t0) / 1e9;
      }
    }
    handoff_.memcpy_s.push_back(times[0]);
    handoff_.handoff_s.push_back(times[1]);
    handoff_.ratios.push_back(times[0] / times[1]);
    // For comparison: a plain memcpy into the slot (what a trainer copying
    // with its own memcpy pays), no signal.
    absl::SleepFor(f_.settle);
    const int64_t t0 = MonotonicNanos();
    std::memcpy(slot.grad, source.data, bytes);
    Clobber(slot.grad);
    handoff_.slot_memcpy_s.push_back(static_cast<double>(MonotonicNanos() - t0) / 1e9);
  }
  rank.reset();
  return client_->DeleteJob(name);
}

void RpcBench::Report() const {
  std::printf("\nper-bucket signals: %s; background job stepped %llu times during the grad_ready rows\n",
              doorbell_ ? "doorbell offered by the daemon (grad_ready, grad_ready_post) and gRPC (grad_ready_grpc)"
                        : "the daemon offers no doorbell: every row is gRPC",
              static_cast<unsigned long long>(background_steps_.load()));
  std::printf("\n%-15s %8s %9s %9s %9s  %s\n", "call", "calls", "p50 us", "p99 us", "max us", "what the call does");
  for (const Latency& l : latencies_) {
    std::printf("%-15s %8zu %9.1f %9.1f %9.1f  %s\n", l.call.c_str(), l.us.size(), l.p50(), l.p99(),
                Percentile(l.us, 100), l.what.c_str());
  }
  std::printf("\n%d concurrent client processes (own connection each), noop: %.0f calls/s (%llu calls in %.3f s, "
              "%llu failed)\n",
              f_.clients, concurrent_.calls_per_s, static_cast<unsigned long long>(concurrent_.calls),
              concurrent_.seconds, static_cast<unsigned long long>(concurrent_.failed));
  const double bytes = static_cast<double>(bucket_elements_ * 2);
  const double m = Median(handoff_.memcpy_s), h = Median(handoff_.handoff_s);
  std::printf("\nhand-off of a %s fp16 gradient bucket (%u pairs alternating, %s settle before each, buffers "
              "pre-touched; after each hand-off the step it completes is waited for, untimed)\n",
              FormatBytes(bucket_elements_ * 2).c_str(), f_.handoff_reps, absl::FormatDuration(f_.settle).c_str());
  std::printf("  %-40s %9s %8s  %s\n", "", "median ms", "GB/s", "runs (ms)");
  std::vector<double> m_ms, h_ms;
  for (double s : handoff_.memcpy_s) m_ms.push_back(s * 1e3);
  for (double s : handoff_.handoff_s) h_ms.push_back(s * 1e3);
  std::printf("  %-40s %9.2f %8.2f  %s\n", "memcpy into private memory", m * 1e3, bytes / m / 1e9,
              JoinSamples(m_ms, 1).c_str());
  std::printf("  %-40s %9.2f %8.2f  %s\n", "WriteGrad into the slot + GradReady", h * 1e3, bytes / h / 1e9,
              JoinSamples(h_ms, 1).c_str());
  std::vector<double> c_ms, g_ms;
  for (double s : handoff_.slot_copy_s) c_ms.push_back(s * 1e3);
  for (double s : handoff_.grad_ready_s) g_ms.push_back(s * 1e3);
  std::printf("  %-40s %9.2f %8s  %s\n", "  of which the write into the slot", Median(c_ms), "", JoinSamples(c_ms, 1).c_str());
  std::printf("  %-40s %9.2f %8s  %s\n", "  of which GradReady", Median(g_ms), "", JoinSamples(g_ms, 3).c_str());
  std::vector<double> f_ms, sm_ms;
  for (double s : handoff_.flush_s) f_ms.push_back(s * 1e3);
  for (double s : handoff_.slot_memcpy_s) sm_ms.push_back(s * 1e3);
  std::printf("  %-40s %9.2f %8s  %s\n", "then until the daemon took it (Flush)", Median(f_ms), "",
              JoinSamples(f_ms, 2).c_str());
  std::printf("  %-40s %9.2f %8.2f  %s\n", "std::memcpy into the slot (no signal)", Median(sm_ms),
              bytes / Median(handoff_.slot_memcpy_s) / 1e9, JoinSamples(sm_ms, 1).c_str());
  const double ratio = Median(handoff_.ratios);
  std::printf("  handoff_vs_memcpy (memcpy time / hand-off time, median of pairs): %.3f\n", ratio);
  std::printf("  WriteGrad alone vs memcpy (ratio of medians): %.3f; std::memcpy into the slot vs memcpy: %.3f; "
              "GradReady + Flush here (after an idle pause, as between buckets) vs its tight-loop p50: %.3f ms vs "
              "%.3f ms\n",
              m / Median(handoff_.slot_copy_s), m / Median(handoff_.slot_memcpy_s),
              (Median(handoff_.grad_ready_s) + Median(handoff_.flush_s)) * 1e3,
              latencies_.size() > 1 ? latencies_[1].p50() / 1e3 : 0.0);

  std::printf("\nload average at start %s, at end %s (1/5/15 min)\n", load_start_.c_str(), load_end_.c_str());
  std::printf("\ntargets:\n");
  const Latency* gr = nullptr;
  for (const Latency& l : latencies_) {
    if (l.call == "grad_ready") gr = &l;
  }
  if (gr != nullptr) {
    const double p99 = gr->p99();
    std::printf("  grad_ready p99 <= 50 us (%s): %.1f us -> %s\n", doorbell_ ? "doorbell" : "gRPC, no doorbell", p99,
                p99 <= 50 ? "MET" : absl::StrCat("MISSED by ", absl::StrFormat("%.1f", p99 - 50), " us").c_str());
  }
  std::printf("  hand-off >= 0.95x memcpy: %.3f -> %s\n", ratio,
              ratio >= 0.95 ? "MET" : absl::StrCat("MISSED by ", absl::StrFormat("%.3f", 0.95 - ratio)).c_str());
}

absl::Status RpcBench::WriteJson() const {
  if (f_.json_path.empty()) return absl::OkStatus();
  nlohmann::json j;
  j["results"] = nlohmann::json::array();
  for (const Latency& l : latencies_) {
    j["results"].push_back({{"call", l.call}, {"p50_us", l.p50()}, {"p99_us", l.p99()},
                            {"max_us", Percentile(l.us, 100)}, {"calls", l.us.size()}, {"what", l.what}});
  }
  j["calls_per_s_8_clients"] = concurrent_.calls_per_s;
  j["clients"] = f_.clients;
  j["handoff_vs_memcpy"] = Median(handoff_.ratios);
  j["slot_write_vs_memcpy"] = Median(handoff_.memcpy_s) / Median(handoff_.slot_copy_s);
  j["slot_memcpy_vs_memcpy"] = Median(handoff_.memcpy_s) / Median(handoff_.slot_memcpy_s);
  j["handoff"] = {{"bucket_bytes", bucket_elements_ * 2},
                  {"memcpy_s", Median(handoff_.memcpy_s)},
                  {"handoff_s", Median(handoff_.handoff_s)},
                  {"memcpy_s_runs", handoff_.memcpy_s},
                  {"handoff_s_runs", handoff_.handoff_s},
                  {"ratio_runs", handoff_.ratios},
                  {"slot_copy_s_runs", handoff_.slot_copy_s},
                  {"grad_ready_s_runs", handoff_.grad_ready_s},
                  {"flush_s_runs", handoff_.flush_s},
                  {"slot_memcpy_s_runs", handoff_.slot_memcpy_s}};
  j["doorbell"] = doorbell_;
  j["background_steps"] = background_steps_.load();
  j["config"] = {{"calls", f_.calls},
                 {"background_step_elements", f_.background_elements},
                 {"daemon_threads", f_.daemon_threads},
                 {"private_daemon", daemon_ != nullptr},
                 {"load_average_start", load_start_},
                 {"load_average_end", load_end_}};
  return WriteBenchJson(f_.json_path, j.dump(2));
}

absl::Status RpcBench::Run() { return WithDaemonLogTail(RunMeasurements(), daemon_.get()); }

absl::Status RpcBench::RunMeasurements() {
  load_start_ = LoadAverageText();
  STRATA_RETURN_IF_ERROR(Connect());
  std::printf("machine: %ld cores, load average %s\n", sysconf(_SC_NPROCESSORS_ONLN), load_start_.c_str());
  std::printf("measuring: noop and grad_ready latency (%llu calls each after %d warm-up), %d client processes, "
              "bucket hand-off\n",
              static_cast<unsigned long long>(f_.calls), kWarmupCalls, f_.clients);
  std::fflush(stdout);
  STRATA_RETURN_IF_ERROR(MeasureNoop());
  STRATA_RETURN_IF_ERROR(MeasureGradReady());
  STRATA_RETURN_IF_ERROR(MeasureConcurrent());
  STRATA_RETURN_IF_ERROR(MeasureHandoff());
  load_end_ = LoadAverageText();
  Report();
  STRATA_RETURN_IF_ERROR(WriteJson());
  client_.reset();
  if (daemon_ != nullptr) STRATA_RETURN_IF_ERROR(daemon_->Stop());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParsePositive(absl::string_view text, uint64_t max) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v == 0 || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a whole number in 1..", max));
  }
  return v;
}

}  // namespace

int RunRpcBench(int argc, char** argv) {
  Flags f;
  CommandLine cl("strata bench rpc");
  cl.AddString("socket", &f.socket, "measure the stratad on this socket (default: start a private one)");
  cl.AddString("json", &f.json_path, "write results as JSON to this file");
  cl.AddParsed("calls", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.calls, ParsePositive(v, 100000000));
    return absl::OkStatus();
  }, "calls per latency measurement, and in total over the concurrent clients (default 20000)");
  cl.AddParsed("clients", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t n, ParsePositive(v, 256));
    f.clients = static_cast<int>(n);
    return absl::OkStatus();
  }, "concurrent client processes (default 8)");
  cl.AddParsed("bucket", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.bucket_bytes, ParseByteSize(v));
    if (f.bucket_bytes < 4096 || f.bucket_bytes > (4ull << 30)) {
      return absl::InvalidArgumentError("--bucket must be 4KiB..4GiB");
    }
    return absl::OkStatus();
  }, "gradient bucket size for the hand-off (default 64MiB)");
  cl.AddParsed("handoff_reps", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t n, ParsePositive(v, 10000));
    f.handoff_reps = static_cast<uint32_t>(n);
    return absl::OkStatus();
  }, "memcpy / hand-off pairs (default 15)");
  cl.AddParsed("daemon_threads", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t n, ParsePositive(v, 1024));
    f.daemon_threads = static_cast<uint32_t>(n);
    return absl::OkStatus();
  }, "optimizer threads of the private daemon (default: its own default, one per core)");
  cl.AddParsed("background_elements", [&](absl::string_view v) -> absl::Status {
    if (v == "0") {
      f.background_elements = 0;
      return absl::OkStatus();
    }
    STRATA_ASSIGN_OR_RETURN(f.background_elements, ParsePositive(v, uint64_t{1} << 30));
    return absl::OkStatus();
  }, "fp16 elements of a job the daemon keeps stepping while GradReady is measured (default 1048576; 0: idle)");
  cl.AddParsed("worker_calls", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.worker_calls, ParsePositive(v, 100000000));
    return absl::OkStatus();
  }, "internal: run as one concurrent client process making this many calls");
  if (absl::Status s = cl.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (cl.help_requested()) {
    std::printf("%s", cl.Usage().c_str());
    return 0;
  }
  if (f.worker_calls > 0) {
    if (f.socket.empty()) {
      std::fprintf(stderr, "strata bench rpc: --worker_calls needs --socket\n");
      return 2;
    }
    return RunNoopWorker(f.socket, f.worker_calls);
  }
  RpcBench bench(std::move(f));
  if (absl::Status s = bench.Run(); !s.ok()) {
    std::fprintf(stderr, "strata bench rpc: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata
