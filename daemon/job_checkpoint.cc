// Job checkpoints: a directory with manifest.json (settings, tensors, step
// count, loss-scaler state) and one file per rank and shard holding its fp32
// master, optimizer states and working params, bit for bit. Written into
// "<dir>.tmp-<pid>", fsynced, then renamed, so a checkpoint either exists
// whole or not at all.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"
#include "core/status_macros.h"
#include "daemon/job.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;
constexpr char kFormat[] = "strata-checkpoint-v1";

std::string ShardFile(const std::string& dir, uint32_t rank, uint32_t index) {
  return absl::StrCat(dir, "/rank", rank, "-shard", index, ".bin");
}

absl::Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("writing ", path));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t size, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = read(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("reading ", path));
    }
    if (n == 0) return absl::DataLossError(absl::StrCat(path, " is shorter than its manifest says"));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", path, " to sync"));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status Job::SaveTo(const std::string& directory) const {
  // Hold the job still between steps: no step may run while states are read.
  absl::MutexLock states_lock(&states_mu_);
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("the job has no registered tensors to save");
  if (step_queued_) {
    return absl::FailedPreconditionError("a step is running; checkpoint between steps (after WaitStep)");
  }
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r].initialized) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", r, " has not initialized its params"));
    }
  }
  std::error_code ec;
  if (std::filesystem::exists(directory, ec) && !std::filesystem::is_empty(directory, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint directory ", directory,
                                                 " exists and is not empty; choose a new one"));
  }
  const std::string tmp = absl::StrCat(directory, ".tmp-", getpid());
  std::filesystem::remove_all(tmp, ec);
  if (!std::filesystem::create_directories(tmp, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create ", tmp, ": ", ec.message()));
  }
  const std::string manifest = SerializeJobRecord(RecordLocked(), kFormat);
  uint64_t bytes = 0;
  const size_t psize = DTypeSize(settings_.param_dtype);
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    for (const ExchangeSlot& slot : ranks_[r].slots) {
      const std::string path = ShardFile(tmp, r, slot.layout.index);
      int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", path));
      absl::Status s = states_->Read({ShardId{r, slot.layout.index}}, [&](const ShardId&, const StateTile& tile) {
        for (const float* stream : {tile.master, tile.exp_avg, tile.exp_avg_sq, tile.max_exp_avg_sq}) {
          if (stream == nullptr) continue;
          STRATA_RETURN_IF_ERROR(WriteAll(fd, stream, tile.size * 4, path));
          bytes += tile.size * 4;
        }
        return absl::OkStatus();
      });
      // Working params as the trainer sees them (in infinity mode, from the
      // NVMe home via the param slot after the last step).
      if (s.ok()) {
        s = WriteAll(fd, ranks_[r].exchange.data() + slot.param_offset, slot.layout.padded_numel * psize, path);
        bytes += slot.layout.padded_numel * psize;
      }
      if (s.ok() && fsync(fd) != 0) s = ErrnoToStatus(errno, absl::StrCat("fsync ", path));
      close(fd);
      if (!s.ok()) return s;
    }
  }
  {
    std::ofstream out(tmp + "/manifest.json");
    out << manifest;
    if (!out) return absl::InternalError(absl::StrCat("writing ", tmp, "/manifest.json"));
  }
  STRATA_RETURN_IF_ERROR(FsyncPath(tmp + "/manifest.json"));
  STRATA_RETURN_IF_ERROR(FsyncPath(tmp));
  std::filesystem::remove(directory, ec);  // an empty directory may be replaced
  if (rename(tmp.c_str(), directory.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("renaming ", tmp, " to ", directory));
  }
  const size_t slash = directory.rfind('/');
  if (slash != std::string::npos && slash > 0) (void)FsyncPath(directory.substr(0, slash));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Job>> Job::LoadFrom(uint64_t id, const std::string& directory,
                                                   const std::string& new_name, JobServices services) {
  const std::string manifest_path = directory + "/manifest.json";
  std::ifstream in(manifest_path);
  if (!in) return absl::NotFoundError(absl::StrCat("no checkpoint at ", directory, " (", manifest_path, " missing)"));
  std::stringstream text;
  text << in.rdbuf();
  STRATA_ASSIGN_OR_RETURN(JobRecord record, ParseJobRecord(text.str(), manifest_path, kFormat));
  if (!new_name.empty()) record.settings.set_name(new_name);
  STRATA_ASSIGN_OR_RETURN(JobSettings settings, ResolveJobSettings(record.settings));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Create(id, std::move(settings), services));
  // Register as a rank this daemon serves (all of them are, unless local_ranks says otherwise).
  const uint32_t first_local = job->settings_.local_ranks.empty() ? 0 : job->settings_.local_ranks.front();
  if (record.partitions.empty()) {
    STRATA_RETURN_IF_ERROR(job->Register(first_local, record.tensors, record.groups));
  } else {
    // Trainer-supplied partitions: each local rank's, as a trainer would register them.
    if (record.partitions.size() != job->settings_.world_size) {
      return absl::DataLossError(absl::StrCat(manifest_path, " has partitions for ", record.partitions.size(),
                                              " ranks; the job has ", job->settings_.world_size));
    }
    for (uint32_t r = 0; r < job->settings_.world_size; ++r) {
      if (!job->settings_.IsLocal(r)) continue;
      STRATA_RETURN_IF_ERROR(job->Register(r, record.tensors, record.groups, record.partitions[r]));
    }
  }
  absl::MutexLock lock(&job->mu_);
  const size_t psize = DTypeSize(job->settings_.param_dtype);
  for (uint32_t r = 0; r < job->ranks_.size(); ++r) {
    for (const ExchangeSlot& slot : job->ranks_[r].slots) {
      const std::string path = ShardFile(directory, r, slot.layout.index);
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening checkpoint shard ", path));
      absl::Status s = job->states_->Update({ShardId{r, slot.layout.index}}, [&](const ShardId&, const StateTile& tile) {
        for (float* stream : {tile.master, tile.exp_avg, tile.exp_avg_sq, tile.max_exp_avg_sq}) {
          if (stream == nullptr) continue;
          STRATA_RETURN_IF_ERROR(ReadAll(fd, stream, tile.size * 4, path));
        }
        return absl::OkStatus();
      });
      if (s.ok()) {
        s = ReadAll(fd, job->ranks_[r].exchange.data() + slot.param_offset, slot.layout.padded_numel * psize, path);
      }
      close(fd);
      if (!s.ok()) return s;
      if (job->param_cache_ != nullptr) {
        STRATA_RETURN_IF_ERROR(job->param_cache_->StoreHome(r, slot.layout.index));
      }
    }
  }
  job->ApplyRecordLocked(record);
  return job;
}

}  // namespace strata
