#include "daemon/daemon_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/byte_size.h"
#include "core/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace strata {
namespace {

// Collects text-format parse errors so the Status can say where the file is wrong.
class ErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

absl::StatusOr<uint64_t> SizeField(const std::string& value, const std::string& default_value,
                                   absl::string_view field) {
  auto parsed = ParseByteSize(value.empty() ? default_value : value);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", parsed.status().message()));
  }
  return *parsed;
}

// Trust, checkpoint and limit settings (docs/SECURITY.md).
absl::Status ResolveHardeningSettings(const strata::v1::DaemonConfig& c, DaemonSettings* s) {
  s->admin_group = c.admin_group();
  s->tcp_token_file = c.tcp_token_file();
  if (!s->tcp_address.empty() && s->tcp_token_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp_address: '", s->tcp_address, "' needs tcp_token_file: TCP has no peer credentials, and "
        "strata serves it only to callers presenting the token from a file readable only by permitted users"));
  }
  if (!s->tcp_token_file.empty() && s->tcp_token_file.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp_token_file: '", s->tcp_token_file, "' is not an absolute path"));
  }
  s->checkpoint_root = c.checkpoint_root();
  if (s->checkpoint_root.empty() && !s->nvme_paths.empty()) {
    s->checkpoint_root = absl::StrCat(s->nvme_paths.front(), "/checkpoints");
  }
  if (!s->checkpoint_root.empty() && s->checkpoint_root.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_root: '", s->checkpoint_root, "' is not an absolute directory path"));
  }
  if (c.checkpoint_quota() == "none") {
    s->checkpoint_quota_bytes = UINT64_MAX;
  } else {
    STRATA_ASSIGN_OR_RETURN(s->checkpoint_quota_bytes, SizeField(c.checkpoint_quota(), "0", "checkpoint_quota"));
  }
  RequestLimits& l = s->limits;
  auto cap = [](auto value, auto fallback, auto ceiling, absl::string_view field, auto* out) -> absl::Status {
    const auto v = value == 0 ? fallback : value;
    if (v > ceiling) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", v, " is above the ceiling ", ceiling));
    }
    *out = v;
    return absl::OkStatus();
  };
  const RequestLimits d;
  STRATA_RETURN_IF_ERROR(cap(c.max_jobs_per_uid(), d.max_jobs_per_uid, 1u << 20, "max_jobs_per_uid", &l.max_jobs_per_uid));
  STRATA_RETURN_IF_ERROR(
      cap(c.max_tensors_per_job(), d.max_tensors_per_job, 1u << 24, "max_tensors_per_job", &l.max_tensors_per_job));
  STRATA_RETURN_IF_ERROR(cap(c.max_tensor_elements(), d.max_tensor_elements, kHardMaxElements,
                             "max_tensor_elements", &l.max_tensor_elements));
  STRATA_RETURN_IF_ERROR(
      cap(c.max_job_elements(), d.max_job_elements, kHardMaxElements, "max_job_elements", &l.max_job_elements));
  STRATA_ASSIGN_OR_RETURN(l.max_region_bytes, SizeField(c.max_region_bytes(), "64GiB", "max_region_bytes"));
  if (l.max_region_bytes == 0 || l.max_region_bytes > (uint64_t{1} << 50)) {
    return absl::InvalidArgumentError(absl::StrCat("max_region_bytes: ", l.max_region_bytes,
                                                   " is not valid; expected 1..1PiB"));
  }
  STRATA_RETURN_IF_ERROR(cap(c.max_name_length(), d.max_name_length, 1u << 16, "max_name_length", &l.max_name_length));
  STRATA_RETURN_IF_ERROR(
      cap(c.max_world_size(), d.max_world_size, kHardMaxWorldSize, "max_world_size", &l.max_world_size));
  STRATA_RETURN_IF_ERROR(
      cap(c.max_pending_waits(), d.max_pending_waits, 1u << 20, "max_pending_waits", &l.max_pending_waits));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<strata::v1::DaemonConfig> LoadDaemonConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("config file '", path, "' cannot be opened; check the path"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  strata::v1::DaemonConfig config;
  absl::string_view stripped = absl::StripLeadingAsciiWhitespace(text);
  if (!stripped.empty() && stripped.front() == '{') {
    auto status = google::protobuf::util::JsonStringToMessage(text, &config);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", path, "' (JSON): ", status.message().as_string()));
    }
    return config;
  }
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' (text format): ", errors.first()));
  }
  return config;
}

absl::StatusOr<DaemonSettings> ResolveDaemonSettings(const strata::v1::DaemonConfig& c,
                                                     const std::string& runtime_dir) {
  DaemonSettings s;
  s.socket_path = c.socket_path();
  if (s.socket_path.empty()) {
    s.socket_path = runtime_dir.empty() ? "/run/strata/stratad.sock"
                                        : absl::StrCat(runtime_dir, "/strata/stratad.sock");
  }
  if (s.socket_path.size() >= 108) {  // sizeof(sockaddr_un::sun_path)
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_path '", s.socket_path, "' is ", s.socket_path.size(),
        " bytes; Unix socket paths must be shorter than 108 bytes"));
  }
  s.tcp_address = c.tcp_address();
  if (!s.tcp_address.empty() && s.tcp_address.rfind("127.", 0) != 0 && s.tcp_address.rfind("[::1]", 0) != 0 &&
      s.tcp_address.rfind("localhost:", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp_address: '", s.tcp_address, "' is not a loopback address; TCP has no peer credentials, so "
        "strata listens only on 127.0.0.0/8 or [::1] (use the Unix socket from other users)"));
  }
  s.allowed_group = c.allowed_group();

  const std::string device = absl::AsciiStrToLower(c.device());
  if (device.empty() || device == "auto") s.device = DeviceChoice::kAuto;
  else if (device == "cuda") s.device = DeviceChoice::kCuda;
  else if (device == "emulated") s.device = DeviceChoice::kEmulated;
  else if (device == "none") s.device = DeviceChoice::kNone;
  else {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", c.device(), "' is not valid; expected auto, cuda, emulated or none"));
  }
  STRATA_ASSIGN_OR_RETURN(s.device_capacity_bytes,
                          SizeField(c.device_capacity(), "1GiB", "device_capacity"));
  // Jobs' device budgets are admitted against this capacity; each job gets an
  // arena of its own (daemon/device_arena.h, daemon/job_device_tier.h),
  // sub-allocated in 4 KiB slots.
  if (s.device != DeviceChoice::kNone &&
      (s.device_capacity_bytes == 0 || s.device_capacity_bytes % 4096 != 0 ||
       s.device_capacity_bytes > (uint64_t{1} << 50))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_capacity: ", s.device_capacity_bytes,
        " bytes is not valid; expected a multiple of 4 KiB in 4KiB..1PiB (or device: none)"));
  }
  STRATA_ASSIGN_OR_RETURN(s.pinned_capacity_bytes,
                          SizeField(c.pinned_capacity(), "1GiB", "pinned_capacity"));
  for (const std::string& p : c.nvme_paths()) {
    if (p.empty() || p.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("nvme_paths: '", p, "' is not an absolute directory path"));
    }
    s.nvme_paths.push_back(p);
  }
  STRATA_ASSIGN_OR_RETURN(s.nvme_capacity_bytes, SizeField(c.nvme_capacity(), "4GiB", "nvme_capacity"));

  const std::string engine = absl::AsciiStrToLower(c.io_engine());
  if (engine.empty() || engine == "auto") s.io_engine = IoEngineChoice::kAuto;
  else if (engine == "io_uring" || engine == "uring") s.io_engine = IoEngineChoice::kUring;
  else if (engine == "libaio" || engine == "aio") s.io_engine = IoEngineChoice::kAio;
  else if (engine == "psync") s.io_engine = IoEngineChoice::kPsync;
  else {
    return absl::InvalidArgumentError(absl::StrCat(
        "io_engine: '", c.io_engine(), "' is not valid; expected auto, io_uring, libaio or psync"));
  }
  STRATA_ASSIGN_OR_RETURN(s.io_block_size, SizeField(c.io_block_size(), "1MiB", "io_block_size"));
  if (s.io_block_size < 4096 || (s.io_block_size & (s.io_block_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "io_block_size: ", s.io_block_size, " is not valid; expected a power of two >= 4096"));
  }
  s.io_queue_depth = c.io_queue_depth() == 0 ? 8 : c.io_queue_depth();
  if (s.io_queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("io_queue_depth: ", s.io_queue_depth, " is not valid; expected 1..4096"));
  }
  s.io_sqpoll = c.io_sqpoll();
  const std::string fsync = absl::AsciiStrToLower(c.fsync_policy());
  // every_commit is the default: the extent store keeps a shard's old extents
  // until the next sync, so batching syncs multiplies the NVMe space a job
  // whose every step rewrites all its states needs (16 commits: 16 copies).
  if (fsync.empty() || fsync == "every_commit") s.fsync_policy = FsyncPolicy::kEveryCommit;
  else if (fsync == "batched") s.fsync_policy = FsyncPolicy::kBatched;
  else if (fsync == "never") s.fsync_policy = FsyncPolicy::kNever;
  else {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsync_policy: '", c.fsync_policy(), "' is not valid; expected every_commit, batched or never"));
  }
  s.optimizer_threads = c.optimizer_threads() == 0
                            ? std::max(1u, std::thread::hardware_concurrency())
                            : c.optimizer_threads();
  s.pin_optimizer_threads = c.pin_optimizer_threads();
  // Every job's items run on one pool: a thread per job would make the
  // daemon's thread count grow with its jobs (1000 jobs, 1000 threads).
  constexpr uint32_t kMaxJobWorkerThreads = 1024;
  if (c.job_worker_threads() > kMaxJobWorkerThreads) {
    return absl::InvalidArgumentError(absl::StrCat("job_worker_threads: ", c.job_worker_threads(),
                                                   " is more than ", kMaxJobWorkerThreads,
                                                   " (0 = one per core)"));
  }
  s.job_worker_threads = c.job_worker_threads() != 0
                             ? c.job_worker_threads()
                             : std::clamp(std::thread::hardware_concurrency(), 2u, 64u);
  s.reattach_timeout = absl::Seconds(c.reattach_timeout_s() == 0 ? 300 : c.reattach_timeout_s());
  s.lease_timeout = absl::Seconds(c.lease_timeout_s() == 0 ? 60 : c.lease_timeout_s());
  if (c.metrics_port() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port: ", c.metrics_port(), " is not a TCP port (1..65535, 0 = off)"));
  }
  s.metrics_port = c.metrics_port();
  STRATA_RETURN_IF_ERROR(ResolveHardeningSettings(c, &s));
  return s;
}

std::string DescribeDaemonSettings(const DaemonSettings& s) {
  auto device = [](DeviceChoice d) {
    return d == DeviceChoice::kAuto      ? "auto"
           : d == DeviceChoice::kCuda    ? "cuda"
           : d == DeviceChoice::kEmulated ? "emulated"
                                          : "none";
  };
  auto engine = [](IoEngineChoice e) {
    switch (e) {
      case IoEngineChoice::kAuto: return "auto";
      case IoEngineChoice::kUring: return "io_uring";
      case IoEngineChoice::kAio: return "libaio";
      case IoEngineChoice::kPsync: return "psync";
    }
    return "?";
  };
  auto fsync = [](FsyncPolicy f) {
    return f == FsyncPolicy::kEveryCommit ? "every_commit" : f == FsyncPolicy::kBatched ? "batched" : "never";
  };
  return absl::StrCat(
      "socket_path: ", s.socket_path, "\n",
      "tcp_address: ", s.tcp_address.empty() ? "(off)" : s.tcp_address, "\n",
      "device: ", device(s.device),
      s.device == DeviceChoice::kNone ? std::string() : absl::StrCat(" (capacity ", FormatBytes(s.device_capacity_bytes), ")"),
      "\n",
      "pinned_capacity: ", FormatBytes(s.pinned_capacity_bytes), "\n",
      "nvme_paths: ", s.nvme_paths.empty() ? "(none: NVMe tier off)" : absl::StrJoin(s.nvme_paths, ","),
      " (capacity ", FormatBytes(s.nvme_capacity_bytes), " per path)\n",
      "io_engine: ", engine(s.io_engine), " (block ", FormatBytes(s.io_block_size), ", depth ",
      s.io_queue_depth, s.io_sqpoll ? ", sqpoll" : "", ")\n",
      "fsync_policy: ", fsync(s.fsync_policy), "\n",
      "optimizer_threads: ", s.optimizer_threads, s.pin_optimizer_threads ? " (pinned)" : "", "\n",
      "job_worker_threads: ", s.job_worker_threads, "\n",
      "reattach_timeout: ", absl::FormatDuration(s.reattach_timeout), "\n",
      "lease_timeout: ", absl::FormatDuration(s.lease_timeout), "\n",
      "metrics_port: ", s.metrics_port == 0 ? std::string("(off)") : absl::StrCat(s.metrics_port), "\n",
      "admin_group: ", s.admin_group.empty() ? "(none)" : s.admin_group, "\n",
      "tcp_token_file: ", s.tcp_token_file.empty() ? "(none)" : s.tcp_token_file, "\n",
      "checkpoint_root: ", s.checkpoint_root.empty() ? "(none: checkpoints refused)" : s.checkpoint_root, "\n",
      "checkpoint_quota: ",
      s.checkpoint_quota_bytes == 0            ? std::string("a quarter of checkpoint_root's filesystem per user")
      : s.checkpoint_quota_bytes == UINT64_MAX ? std::string("none")
                                               : absl::StrCat(FormatBytes(s.checkpoint_quota_bytes), " per user"),
      "\n",
      "limits: ", s.limits.max_jobs_per_uid, " jobs/uid, ", s.limits.max_tensors_per_job, " tensors/job, ",
      s.limits.max_tensor_elements, " elements/tensor, ", s.limits.max_job_elements, " elements/job, ",
      FormatBytes(s.limits.max_region_bytes), "/region, world size <= ", s.limits.max_world_size, ", ",
      s.limits.max_pending_waits, " pending waits\n");
}

}  // namespace strata
