// Job checkpoints: a directory with manifest.json (settings, tensors, step
// count, loss-scaler state, owner uid) and one file per rank and shard
// holding its fp32 master, optimizer states and working params, bit for bit.
// Written into a fresh hidden directory beside the target, fsynced, then
// renamed into place with RENAME_NOREPLACE, so a checkpoint either exists
// whole or not at all and never replaces anything. Every file is opened
// relative to its directory's fd with O_NOFOLLOW (and O_EXCL when created).
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/byte_size.h"
#include "core/checked_math.h"
#include "core/errno_status.h"
#include "core/random_id.h"
#include "core/status_macros.h"
#include "core/unix_socket.h"
#include "daemon/job.h"
#include "nlohmann/json.hpp"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"

namespace strata {
namespace {

constexpr char kFormat[] = "strata-checkpoint-v1";
// Manifests hold settings and a tensor list, bounded by the request caps.
constexpr size_t kMaxManifestBytes = 64 << 20;

std::string ShardFile(uint32_t rank, uint32_t index) { return absl::StrCat("rank", rank, "-shard", index, ".bin"); }

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

// A new file in `dir_fd`: never an existing one, never through a link.
absl::StatusOr<UniqueFd> CreateFileIn(int dir_fd, const std::string& name, const std::string& display) {
  UniqueFd fd(openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("creating ", display));
  return fd;
}

// An existing regular file in `dir_fd`, not a link.
absl::StatusOr<UniqueFd> OpenFileIn(int dir_fd, const std::string& name, const std::string& display) {
  UniqueFd fd(openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(display, " is missing"));
    if (err == ELOOP) return absl::InvalidArgumentError(absl::StrCat(display, " is a symbolic link; refused"));
    return ErrnoToStatus(err, absl::StrCat("opening ", display));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", display));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(display, " is not a regular file"));
  // Plain blocking reads from here on.
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// Removes the files of a half-written temporary directory, then it.
void RemoveTemp(int parent_fd, const std::string& tmp, const std::vector<std::string>& files) {
  UniqueFd dir(openat(parent_fd, tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.valid()) {
    for (const std::string& f : files) unlinkat(dir.get(), f.c_str(), 0);
  }
  unlinkat(parent_fd, tmp.c_str(), AT_REMOVEDIR);
}

// How one shard file lays out its states, as the manifest lists it (SaveTo
// writes `files`): `padded` elements, `streams` fp32 streams interleaved by
// tiles of `tile` elements (tile k of every stream, then tile k+1), then the
// params. The loading job's own NVMe tile can differ (it is derived from the
// daemon's staging size), so LoadFrom reads by the file's tiling, not its own.
struct ShardFileLayout {
  uint64_t padded = 0;
  uint64_t tile = 0;
};

// The manifest's `files` by (rank, index). Empty for a manifest written
// before files were listed: those are read in the loading job's own tiling,
// as their daemon wrote them. The manifest is a client's file: every field
// is type- and range-checked, a bad one is DataLoss naming it.
absl::StatusOr<absl::flat_hash_map<std::pair<uint32_t, uint32_t>, ShardFileLayout>> ReadFileLayouts(
    const std::string& text, const std::string& path, std::vector<std::string>* streams) {
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, ShardFileLayout> layouts;
  const nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object() || !m.contains("files")) return layouts;
  const nlohmann::json& files = m["files"];
  const nlohmann::json* names = m.contains("streams") ? &m["streams"] : nullptr;
  if (!files.is_array() || names == nullptr || !names->is_array() || names->empty() || names->size() > 4) {
    return absl::DataLossError(absl::StrCat(path, ": 'files' must be an array beside 'streams', an array of 1 to 4 "
                                            "stream names"));
  }
  for (const nlohmann::json& n : *names) {
    if (!n.is_string()) return absl::DataLossError(absl::StrCat(path, ": 'streams' holds a non-string"));
    streams->push_back(n.get<std::string>());
  }
  auto number = [&](const nlohmann::json& e, const char* key, size_t i) -> absl::StatusOr<uint64_t> {
    if (!e.is_object() || !e.contains(key) || !e[key].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat(path, ": files[", i, "].", key, " must be a non-negative integer"));
    }
    return e[key].get<uint64_t>();
  };
  for (size_t i = 0; i < files.size(); ++i) {
    const nlohmann::json& e = files[i];
    STRATA_ASSIGN_OR_RETURN(const uint64_t rank, number(e, "rank", i));
    STRATA_ASSIGN_OR_RETURN(const uint64_t index, number(e, "index", i));
    STRATA_ASSIGN_OR_RETURN(const uint64_t padded, number(e, "padded_numel", i));
    STRATA_ASSIGN_OR_RETURN(const uint64_t tile, number(e, "tile_numel", i));
    if (rank > UINT32_MAX || index > UINT32_MAX) {
      return absl::DataLossError(absl::StrCat(path, ": files[", i, "] names rank ", rank, " shard ", index));
    }
    if (padded > 0 && (tile == 0 || tile > padded)) {
      return absl::DataLossError(absl::StrCat(path, ": files[", i, "].tile_numel is ", tile, "; it must be 1 to its ",
                                              padded, " elements"));
    }
    if (!layouts.emplace(std::make_pair(static_cast<uint32_t>(rank), static_cast<uint32_t>(index)),
                         ShardFileLayout{padded, tile}).second) {
      return absl::DataLossError(absl::StrCat(path, ": rank ", rank, " shard ", index, " is listed twice"));
    }
  }
  return layouts;
}

absl::Status PReadAll(int fd, void* data, size_t size, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("reading ", path));
    }
    if (n == 0) return absl::DataLossError(absl::StrCat(path, " is shorter than its manifest says"));
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Elements [offset, offset + size) of stream `k` of `streams` from a file laid
// out as `layout` says, into `dst`: one read per file tile the range crosses.
// REQUIRES: offset + size <= layout.padded (the file's size was checked).
absl::Status ReadStreamRange(int fd, const std::string& path, const ShardFileLayout& layout, uint64_t streams,
                             uint64_t k, uint64_t offset, uint64_t size, float* dst) {
  for (uint64_t e = offset; e < offset + size;) {
    const uint64_t tile_begin = e / layout.tile * layout.tile;
    const uint64_t tile_len = std::min(layout.tile, layout.padded - tile_begin);
    const uint64_t n = std::min(offset + size, tile_begin + tile_len) - e;
    const uint64_t at = (tile_begin * streams + k * tile_len + (e - tile_begin)) * 4;
    STRATA_RETURN_IF_ERROR(PReadAll(fd, dst + (e - offset), n * 4, at, path));
    e += n;
  }
  return absl::OkStatus();
}

// What a save may still write: the caller's quota less what its home holds.
class SaveBudget {
 public:
  SaveBudget(uint64_t room, const std::string& display) : room_(room), display_(display) {}
  absl::Status Take(uint64_t bytes) {
    if (bytes > room_ - used_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "checkpoint ", display_, " needs more than the ", FormatBytes(room_),
          " left of your checkpoint quota (checkpoint_quota); remove old checkpoints from your checkpoint home, or ask "
          "the operator to raise stratad's --checkpoint_quota"));
    }
    used_ += bytes;
    return absl::OkStatus();
  }
  uint64_t used() const { return used_; }

 private:
  const uint64_t room_;
  const std::string& display_;
  uint64_t used_ = 0;
};

// Gives what a save made to the caller, so it can read (and remove) its own
// checkpoints when the daemon runs as root.
absl::Status GiveTo(int fd, const std::optional<uid_t>& owner, const std::string& display) {
  if (owner.has_value() && fchown(fd, *owner, static_cast<gid_t>(-1)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("giving ", display, " to uid ", *owner));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> Job::SaveTo(int parent_fd, const std::string& name, const std::string& display,
                                     const CheckpointWrite& write) const {
  // states_mu_ keeps every step from changing the states while they are
  // read; mu_ is held only to copy the record and the slots.
  absl::MutexLock states_lock(&states_mu_);
  std::string manifest;
  std::vector<std::vector<ExchangeSlot>> slots;
  std::vector<const std::byte*> regions;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return absl::FailedPreconditionError("the job has no registered tensors to save");
    if (!worker_error_.ok()) {
      // Its states may be half of a failed step: save only what it resumes from.
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's last step failed (", worker_error_.message(), "); checkpoint it after it resumes: attach "
          "its ranks again and the daemon reloads it at its last committed step"));
    }
    if (barrier_.step_queued()) {
      return absl::FailedPreconditionError("a step is running; checkpoint between steps (after WaitStep)");
    }
    for (uint32_t r = 0; r < ranks_.size(); ++r) {
      if (!ranks_[r].initialized) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", r, " has not initialized its params"));
      }
      if (barrier_.AnyApplied()) {
        return absl::FailedPreconditionError(
            "part of the next step is already applied; checkpoint between steps (after WaitStep)");
      }
      slots.push_back(ranks_[r].slots);
      regions.push_back(ranks_[r].exchange.data());
    }
    manifest = SerializeJobRecord(RecordLocked(), kFormat);
  }
  // Fail early (the rename below is what decides) when the name is taken.
  struct stat existing {};
  if (fstatat(parent_fd, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", display, " exists; choose a new name"));
  }
  STRATA_ASSIGN_OR_RETURN(const std::string suffix, RandomHexToken(8));
  const std::string tmp = absl::StrCat(".", name.substr(0, 200), ".tmp-", suffix);
  if (mkdirat(parent_fd, tmp.c_str(), 0700) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("creating a temporary directory beside ", display));
  }
  std::vector<std::string> written;
  bool keep = false;
  absl::Cleanup cleanup = [&] {
    if (!keep) RemoveTemp(parent_fd, tmp, written);
  };
  UniqueFd dir(openat(parent_fd, tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir.valid()) return ErrnoToStatus(errno, absl::StrCat("opening the temporary directory of ", display));
  STRATA_RETURN_IF_ERROR(GiveTo(dir.get(), write.owner, display));
  SaveBudget budget(write.max_bytes, display);
  const size_t psize = DTypeSize(settings_.param_dtype);
  // What each file holds, so a reader (strata checkpoint export) needs neither
  // the daemon's partition rules nor its NVMe tile size: the shard's layout,
  // its streams and the elements per tile (streams are interleaved by tile).
  nlohmann::json files = nlohmann::json::array();
  nlohmann::json stream_names = nlohmann::json::array();
  for (uint32_t r = 0; r < slots.size(); ++r) {
    for (const ExchangeSlot& slot : slots[r]) {
      const std::string file = ShardFile(r, slot.layout.index);
      const std::string path = absl::StrCat(display, "/", file);
      STRATA_ASSIGN_OR_RETURN(UniqueFd fd, CreateFileIn(dir.get(), file, path));
      written.push_back(file);
      STRATA_RETURN_IF_ERROR(GiveTo(fd.get(), write.owner, path));
      uint64_t tile_numel = 0;
      STRATA_RETURN_IF_ERROR(states_->Read({ShardId{r, slot.layout.index}}, [&](const ShardId&, const StateTile& tile) {
        if (tile_numel == 0) {
          tile_numel = tile.size;
          stream_names = nlohmann::json::array();
          const char* names[] = {"master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
          const float* streams[] = {tile.master, tile.exp_avg, tile.exp_avg_sq, tile.max_exp_avg_sq};
          for (int k = 0; k < 4; ++k) {
            if (streams[k] != nullptr) stream_names.push_back(names[k]);
          }
        }
        for (const float* stream : {tile.master, tile.exp_avg, tile.exp_avg_sq, tile.max_exp_avg_sq}) {
          if (stream == nullptr) continue;
          STRATA_RETURN_IF_ERROR(budget.Take(tile.size * 4));
          STRATA_RETURN_IF_ERROR(WriteAll(fd.get(), stream, tile.size * 4, path));
        }
        return absl::OkStatus();
      }));
      nlohmann::json ranges = nlohmann::json::array();
      for (const OwnedRange& o : slot.layout.ranges) {
        ranges.push_back({o.tensor.value(), o.tensor_offset, o.numel, o.shard_offset});
      }
      files.push_back({{"file", file},
                       {"rank", r},
                       {"index", slot.layout.index},
                       {"padded_numel", slot.layout.padded_numel},
                       {"tile_numel", tile_numel},
                       {"ranges", std::move(ranges)}});
      // Working params as the trainer sees them. In infinity mode their home
      // on NVMe is the truth: a slot may be empty (a job restored after a
      // restart has not read its params back yet) or not resident.
      std::optional<AlignedBuffer> home;
      STRATA_ASSIGN_OR_RETURN(const std::byte* params,
                              pipeline_->ParamsToSave(r, slot, regions[r] + slot.param_offset, home));
      STRATA_RETURN_IF_ERROR(budget.Take(slot.layout.padded_numel * psize));
      STRATA_RETURN_IF_ERROR(WriteAll(fd.get(), params, slot.layout.padded_numel * psize, path));
      if (fsync(fd.get()) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path));
    }
  }
  {
    // Added beside the record's own fields; LoadFrom ignores them.
    nlohmann::json m = nlohmann::json::parse(manifest);
    m["param_bytes"] = psize;
    m["streams"] = std::move(stream_names);
    m["files"] = std::move(files);
    manifest = m.dump(2);
  }
  {
    const std::string path = absl::StrCat(display, "/manifest.json");
    STRATA_ASSIGN_OR_RETURN(UniqueFd fd, CreateFileIn(dir.get(), "manifest.json", path));
    written.push_back("manifest.json");
    STRATA_RETURN_IF_ERROR(GiveTo(fd.get(), write.owner, path));
    STRATA_RETURN_IF_ERROR(budget.Take(manifest.size()));
    STRATA_RETURN_IF_ERROR(WriteAll(fd.get(), manifest.data(), manifest.size(), path));
    if (fsync(fd.get()) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path));
  }
  if (fsync(dir.get()) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync the directory of ", display));
  if (renameat2(parent_fd, tmp.c_str(), parent_fd, name.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) {
      return absl::AlreadyExistsError(absl::StrCat("checkpoint ", display, " exists; choose a new name"));
    }
    return ErrnoToStatus(err, absl::StrCat("renaming the checkpoint into ", display));
  }
  keep = true;
  (void)fsync(parent_fd);
  return budget.used();
}

absl::StatusOr<std::unique_ptr<Job>> Job::LoadFrom(
    uint64_t id, int dir_fd, const std::string& display, const std::string& new_name, uint32_t new_owner,
    const std::function<absl::Status(std::optional<uint32_t>)>& may_load, JobServices services) {
  const std::string manifest_path = absl::StrCat(display, "/manifest.json");
  auto manifest_fd = OpenFileIn(dir_fd, "manifest.json", manifest_path);
  if (!manifest_fd.ok()) {
    if (absl::IsNotFound(manifest_fd.status())) {
      return absl::NotFoundError(absl::StrCat("no checkpoint at ", display, " (manifest.json missing)"));
    }
    return manifest_fd.status();
  }
  struct stat st {};
  if (fstat(manifest_fd->get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", manifest_path));
  if (static_cast<uint64_t>(st.st_size) > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(manifest_path, " is ", st.st_size, " bytes; at most ",
                                                   kMaxManifestBytes, " are read"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  STRATA_RETURN_IF_ERROR(ReadAll(manifest_fd->get(), text.data(), text.size(), manifest_path));
  STRATA_ASSIGN_OR_RETURN(JobRecord record, ParseJobRecord(text, manifest_path, kFormat));
  STRATA_RETURN_IF_ERROR(may_load(record.owner_uid));
  if (!new_name.empty()) record.settings.name = new_name;
  STRATA_ASSIGN_OR_RETURN(JobSettings settings, ResolveJobSettings(record.settings));
  settings.owner_uid = new_owner;
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
  std::vector<std::string> file_streams;
  STRATA_ASSIGN_OR_RETURN(const auto layouts, ReadFileLayouts(text, manifest_path, &file_streams));
  absl::MutexLock lock(&job->mu_);
  const size_t psize = DTypeSize(job->settings_.param_dtype);
  for (uint32_t r = 0; r < job->ranks_.size(); ++r) {
    for (const ExchangeSlot& slot : job->ranks_[r].slots) {
      const std::string file = ShardFile(r, slot.layout.index);
      const std::string path = absl::StrCat(display, "/", file);
      STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFileIn(dir_fd, file, path));
      const uint64_t padded = slot.layout.padded_numel;
      // The file's own tiling where the manifest lists it (checked against
      // the job's layout and the file's size before anything is read).
      std::optional<ShardFileLayout> layout;
      if (!layouts.empty()) {
        auto it = layouts.find(std::make_pair(r, slot.layout.index));
        if (it == layouts.end()) {
          return absl::DataLossError(absl::StrCat(manifest_path, " lists no file for rank ", r, " shard ",
                                                  slot.layout.index));
        }
        if (it->second.padded != padded) {
          return absl::DataLossError(absl::StrCat(manifest_path, " gives ", file, " ", it->second.padded,
                                                  " elements; the job's shard has ", padded));
        }
        layout = it->second;
        struct stat st {};
        if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
        STRATA_ASSIGN_OR_RETURN(const uint64_t per_element,
                                CheckedAdd(file_streams.size() * 4, psize, "bytes per element"));
        STRATA_ASSIGN_OR_RETURN(const uint64_t expected, CheckedMul(padded, per_element, "shard file bytes"));
        if (static_cast<uint64_t>(st.st_size) != expected) {
          return absl::DataLossError(absl::StrCat(path, " holds ", st.st_size, " bytes; its layout says ", expected, " (",
                                                  padded, " elements x (", file_streams.size(), " fp32 streams + ",
                                                  psize, "-byte params))"));
        }
      }
      absl::Status s = job->states_->Update({ShardId{r, slot.layout.index}}, [&](const ShardId&, const StateTile& tile) {
        const char* names[] = {"master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
        float* streams[] = {tile.master, tile.exp_avg, tile.exp_avg_sq, tile.max_exp_avg_sq};
        if (!layout.has_value()) {  // an older manifest: the job's own tiling
          for (float* stream : streams) {
            if (stream != nullptr) STRATA_RETURN_IF_ERROR(ReadAll(fd.get(), stream, tile.size * 4, path));
          }
          return absl::OkStatus();
        }
        uint64_t k = 0;
        for (int i = 0; i < 4; ++i) {
          if (streams[i] == nullptr) continue;
          if (k >= file_streams.size() || file_streams[k] != names[i]) {
            return absl::DataLossError(absl::StrCat(manifest_path, " lists streams [", absl::StrJoin(file_streams, ", "),
                                                    "]; the job's optimizer keeps '", names[i], "' as stream ", k));
          }
          STRATA_RETURN_IF_ERROR(
              ReadStreamRange(fd.get(), path, *layout, file_streams.size(), k, tile.offset, tile.size, streams[i]));
          ++k;
        }
        if (k != file_streams.size()) {
          return absl::DataLossError(absl::StrCat(manifest_path, " lists ", file_streams.size(),
                                                  " streams; the job's optimizer keeps ", k));
        }
        return absl::OkStatus();
      });
      if (s.ok()) {
        std::byte* params = job->ranks_[r].exchange.data() + slot.param_offset;
        s = layout.has_value() ? PReadAll(fd.get(), params, padded * psize, padded * file_streams.size() * 4, path)
                               : ReadAll(fd.get(), params, padded * psize, path);
      }
      if (!s.ok()) return s;
      STRATA_RETURN_IF_ERROR(job->pipeline_->ParamsWritten(r, slot.layout.index));
    }
  }
  job->ApplyRecordLocked(record);
  if (job->pipeline_->durable()) {
    // The loaded states and param homes become durable with the job's
    // record, so the job survives a restart from here on.
    STRATA_RETURN_IF_ERROR(job->CommitWithRecord(SerializeJobRecord(job->RecordLocked())));
  }
  return job;
}

}  // namespace strata
