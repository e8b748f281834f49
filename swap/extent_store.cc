#include "swap/extent_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/byte_size.h"
#include "core/errno_status.h"
#include "core/status_macros.h"
#include "swap/aligned_buffer.h"
#include "swap/checksum.h"
#include "swap/chunk_hasher.h"
#include "swap/direct_io.h"
#include "swap/extent_allocator.h"
#include "swap/manifest_journal.h"

namespace strata {

absl::string_view SyncPolicyName(SyncPolicy policy) {
  switch (policy) {
    case SyncPolicy::kEveryCommit: return "every_commit";
    case SyncPolicy::kBatched: return "batched";
    case SyncPolicy::kNever: return "never";
  }
  return "unknown";
}

absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "every_commit" || t == "always") return SyncPolicy::kEveryCommit;
  if (t == "batched") return SyncPolicy::kBatched;
  if (t == "never") return SyncPolicy::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown fdatasync policy '", text, "': use every_commit, batched or never"));
}

absl::string_view ChecksumKindName(ChecksumKind kind) {
  return kind == ChecksumKind::kXxh3 ? "xxh3" : "crc32c";
}

absl::StatusOr<ChecksumKind> ParseChecksumKind(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "xxh3") return ChecksumKind::kXxh3;
  if (t == "crc32c") return ChecksumKind::kCrc32c;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown checksum '", text, "': use xxh3 or crc32c"));
}

namespace {

constexpr char kDataFileName[] = "strata-extents.data";
constexpr char kManifestFileName[] = "strata-extents.manifest";
// flock'ed by the open store; holds its pid.
constexpr char kLockFileName[] = "strata-extents.lock";
// Compact the journal once it is this many times larger than a snapshot
// would be (and at least manifest_compaction_min_bytes), so replay stays proportional to live shards.
constexpr uint64_t kCompactionFactor = 4;

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// One data file. The fd and path are fixed after Init; the allocator is
// guarded by the store's mu_.
struct DataFile {
  std::string path;
  int fd = -1;
  bool direct = false;
  std::unique_ptr<ExtentAllocator> allocator;
};

// One live shard version as the store tracks it.
struct Entry {
  ExtentRecord record;
  // The manifest has it, or a commit that is writing it to the manifest
  // does: replacing it must wait for a commit before its extent is reused.
  bool committed = false;
};

struct FreeExtent {
  uint32_t file_index;
  uint64_t offset;
  uint64_t bytes;
};

// One owner's (job's) changes since its last commit.
struct Pending {
  std::vector<ManifestChange> changes;
  // Committed versions this owner replaced or deleted: reusable once the
  // commit that drops them is durable.
  std::vector<FreeExtent> free_after_commit;
};

// An I/O lane: one engine, driven by one caller at a time, with the scratch
// space one extent's I/O needs. Lanes let reads and writes of several jobs
// (and a job's load and save) run at once without sharing an engine.
struct Lane {
  IoEngine* engine = nullptr;
  std::vector<IoFileId> file_ids;  // per data file
  AlignedBuffer bounce;
  // Checksums are computed here, off the thread that drives the I/O.
  std::unique_ptr<ChunkHasher> hasher;
  std::vector<IoRequest> requests;
  std::vector<IoCompletion> completions;
  std::vector<uint64_t> offsets;
  std::vector<bool> done;
};

using ExtentId = std::pair<uint32_t, uint64_t>;  // file index, offset

ShardKey FirstKeyOf(uint64_t owner) {
  ShardKey k;
  k.job = JobId(owner);
  return k;
}

class ExtentStoreImpl final : public ExtentStore {
 public:
  ExtentStoreImpl(ExtentStoreOptions options, std::vector<IoEngine*> engines)
      : options_(std::move(options)), engines_(std::move(engines)) {}

  ~ExtentStoreImpl() override {
    for (Lane& lane : lanes_) {
      for (IoFileId id : lane.file_ids) (void)lane.engine->UnregisterFile(id);
    }
    for (DataFile& f : files_) {
      if (f.fd >= 0) close(f.fd);
    }
    for (int fd : lock_fds_) close(fd);  // releases the flocks
  }

  absl::Status Init();

  uint32_t alignment() const override { return alignment_; }
  absl::Status Write(const ShardKey& key, absl::Span<const std::byte> data) override;
  absl::StatusOr<uint64_t> Read(const ShardKey& key, absl::Span<std::byte> into) override;
  absl::StatusOr<uint64_t> SizeOf(const ShardKey& key) const override;
  bool Contains(const ShardKey& key) const override;
  absl::Status Delete(const ShardKey& key) override;
  absl::Status Rename(const ShardKey& from, const ShardKey& to) override;
  absl::Status Commit(uint64_t owner) override { return CommitImpl(true, owner, /*force_sync=*/false); }
  absl::Status Commit() override { return CommitImpl(false, 0, /*force_sync=*/false); }
  absl::Status Sync() override { return CommitImpl(false, 0, /*force_sync=*/true); }
  void Rollback(uint64_t owner) override;
  absl::Status DeleteOwner(uint64_t owner) override;
  absl::StatusOr<uint64_t> GenerationOf(const ShardKey& key) const override;
  std::vector<ShardKey> Keys() const override;
  ExtentStoreStats Stats() const override;
  std::vector<std::string> warnings() const override {
    absl::MutexLock lock(&mu_);
    return warnings_;
  }

 private:
  // Borrows a free lane for the scope; waits while all are busy.
  class LaneLease {
   public:
    explicit LaneLease(ExtentStoreImpl* store) : store_(store) {
      absl::MutexLock lock(&store_->lanes_mu_);
      store_->lanes_mu_.Await(absl::Condition(
          +[](std::vector<Lane*>* free) { return !free->empty(); }, &store_->free_lanes_));
      lane_ = store_->free_lanes_.back();
      store_->free_lanes_.pop_back();
    }
    ~LaneLease() {
      absl::MutexLock lock(&store_->lanes_mu_);
      store_->free_lanes_.push_back(lane_);
    }
    LaneLease(const LaneLease&) = delete;
    LaneLease& operator=(const LaneLease&) = delete;
    Lane* operator->() const { return lane_; }
    Lane& operator*() const { return *lane_; }

   private:
    ExtentStoreImpl* const store_;
    Lane* lane_ = nullptr;
  };

  absl::Status LockPath(const std::string& dir);
  absl::Status OpenDataFile(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Issues the I/O for one extent on `lane`: `main` covers the aligned body
  // and `tail` (if non-empty) the last partial block through the lane's
  // bounce buffer. `on_chunk_done(offset, length)` runs as chunks finish, in
  // order. Holds no store lock: the extent is the caller's (being written,
  // or pinned for a read).
  template <typename OnChunk>
  absl::Status RunExtentIo(Lane& lane, IoOp op, const ExtentRecord& rec, std::byte* data, OnChunk on_chunk);
  // Drops `e` from the index: its extent is free now (never durable) or
  // after `pending`'s owner commits (durable).
  void ReleaseLocked(const Entry& e, Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns an extent to the allocator, or once its last reader is done.
  void FreeLocked(const FreeExtent& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnpinLocked(const ExtentId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitImpl(bool one_owner, uint64_t owner, bool force_sync) ABSL_LOCKS_EXCLUDED(commit_mu_, mu_);
  std::string Where(const ExtentRecord& rec) const {
    return absl::StrCat(files_[rec.file_index].path, " at offset ", rec.offset_bytes, ", ",
                        rec.extent_bytes, " bytes, generation ", rec.generation);
  }

  const ExtentStoreOptions options_;
  const std::vector<IoEngine*> engines_;
  // Fixed after Init.
  uint32_t alignment_ = 4096;
  uint64_t chunk_bytes_ = 1 << 20;
  std::vector<DataFile> files_;
  std::vector<int> lock_fds_;
  std::vector<Lane> lanes_;

  absl::Mutex lanes_mu_;
  std::vector<Lane*> free_lanes_ ABSL_GUARDED_BY(lanes_mu_);

  // Serializes commits (and the journal); taken before mu_, never inside it.
  absl::Mutex commit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<ManifestJournal> journal_ ABSL_GUARDED_BY(commit_mu_);
  uint64_t commit_seq_ ABSL_GUARDED_BY(commit_mu_) = 0;
  uint64_t commits_since_sync_ ABSL_GUARDED_BY(commit_mu_) = 0;
  uint64_t synced_epoch_ ABSL_GUARDED_BY(commit_mu_) = 0;  // write_epoch_ covered by the last fdatasync
  // Set when a journal append or rewrite failed part way: what is on disk is
  // unknown, so no further commit is attempted.
  absl::Status broken_ ABSL_GUARDED_BY(commit_mu_);

  // Metadata; never held across I/O.
  mutable absl::Mutex mu_;
  std::map<ShardKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // What the manifest holds: snapshots and rollbacks start from it.
  std::map<ShardKey, ExtentRecord> durable_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Freed by a commit that was not synced (kBatched): reusable after a sync.
  std::vector<FreeExtent> free_after_sync_ ABSL_GUARDED_BY(mu_);
  // Extents being read, and frees that wait for their readers.
  std::map<ExtentId, int> pins_ ABSL_GUARDED_BY(mu_);
  std::map<ExtentId, uint64_t> deferred_free_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t write_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // data writes finished so far
  std::vector<std::string> warnings_ ABSL_GUARDED_BY(mu_);
};

absl::Status ValidateOptions(const ExtentStoreOptions& o) {
  if (o.paths.empty()) {
    return absl::InvalidArgumentError("extent store: no NVMe paths given; configure at least one directory");
  }
  if (o.capacity_bytes_per_path == 0) {
    return absl::InvalidArgumentError("extent store: capacity_bytes_per_path is 0; give each path a size");
  }
  if (!IsPowerOfTwo(o.allocation_unit_bytes) || o.allocation_unit_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent store: allocation_unit_bytes ", o.allocation_unit_bytes,
        " must be a power of two of at least 4096"));
  }
  if (o.capacity_bytes_per_path % o.allocation_unit_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent store: capacity_bytes_per_path ", o.capacity_bytes_per_path,
        " is not a multiple of the allocation unit ", o.allocation_unit_bytes));
  }
  if (o.io_chunk_bytes != 0 && o.io_chunk_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent store: io_chunk_bytes ", o.io_chunk_bytes, " must be a multiple of 4096"));
  }
  if (o.sync_policy == SyncPolicy::kBatched && o.sync_every_commits == 0) {
    return absl::InvalidArgumentError("extent store: sync_every_commits must be at least 1");
  }
  for (size_t i = 0; i < o.paths.size(); ++i) {
    for (size_t j = i + 1; j < o.paths.size(); ++j) {
      if (o.paths[i] == o.paths[j]) {
        return absl::InvalidArgumentError(absl::StrCat("extent store: path ", o.paths[i], " is listed twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExtentStoreImpl::LockPath(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kLockFileName);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("extent store: opening lock file ", path));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    if (err == EWOULDBLOCK) {
      std::string holder = n > 0 ? std::string(absl::StripAsciiWhitespace(absl::string_view(buf, n))) : "?";
      return absl::FailedPreconditionError(absl::StrCat(
          "extent store: ", dir, " is in use by another process (pid ", holder, " holds ", path,
          "); two daemons must not share an NVMe path: stop that one or choose another --nvme_path"));
    }
    return ErrnoToStatus(err, absl::StrCat("extent store: locking ", path));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, absl::StrCat("extent store: writing the pid into ", path));
  }
  lock_fds_.push_back(fd);
  return absl::OkStatus();
}

absl::Status ExtentStoreImpl::OpenDataFile(size_t index) {
  const std::string& dir = options_.paths[index];
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("extent store: NVMe path ", dir,
                                            " is not an existing directory; create it or fix the path"));
  }
  DataFile f;
  f.path = absl::StrCat(dir, "/", kDataFileName);
  STRATA_ASSIGN_OR_RETURN(OpenedFile opened, OpenForIo(f.path, /*create=*/true, options_.direct_io,
                                                       options_.allow_buffered_fallback));
  f.fd = opened.fd;
  f.direct = opened.direct;
  if (!opened.warning.empty()) warnings_.push_back(opened.warning);
  files_.push_back(std::move(f));  // from here on the destructor closes it
  DataFile& file = files_.back();

  if (fstat(file.fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat of ", file.path));
  uint64_t have = static_cast<uint64_t>(st.st_size);
  uint64_t capacity = options_.capacity_bytes_per_path;
  if (have > capacity) {
    uint64_t rounded = have - have % options_.allocation_unit_bytes;
    warnings_.push_back(absl::StrCat(file.path, " is ", FormatBytes(have), ", larger than the configured ",
                                     FormatBytes(capacity), "; keeping its size"));
    capacity = rounded;
  }
  // Preallocate: the blocks exist before the first shard lands, so a full
  // disk is found now, not halfway through an optimizer step, and O_DIRECT
  // writes do not allocate (or convert unwritten extents) on the hot path
  // more than once.
  uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  if (allocated < capacity) {
    struct statvfs vfs {};
    if (fstatvfs(file.fd, &vfs) == 0) {
      uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
      uint64_t need = capacity - allocated;
      if (free_bytes < need) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "extent store: need ", FormatBytes(need), " more at ", dir, " for a ", FormatBytes(capacity),
            " data file, but only ", FormatBytes(free_bytes),
            " are free; free space or lower capacity_bytes_per_path"));
      }
    }
    int rc = posix_fallocate(file.fd, 0, static_cast<off_t>(capacity));
    if (rc == ENOSPC) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "extent store: preallocating ", FormatBytes(capacity), " at ", file.path,
          " failed: no space left on the device; free space or lower capacity_bytes_per_path"));
    }
    if (rc != 0) {
      return ErrnoToStatus(rc, absl::StrCat("preallocating ", FormatBytes(capacity), " at ", file.path));
    }
  }
  file.allocator = std::make_unique<ExtentAllocator>(capacity, options_.allocation_unit_bytes);
  for (Lane& lane : lanes_) {
    STRATA_ASSIGN_OR_RETURN(IoFileId id, lane.engine->RegisterFile(file.fd, file.path));
    lane.file_ids.push_back(id);
    STRATA_ASSIGN_OR_RETURN(uint32_t a, lane.engine->RequiredAlignment(id));
    alignment_ = std::max(alignment_, a);
  }
  return absl::OkStatus();
}


absl::Status ExtentStoreImpl::Init() {
  absl::MutexLock commit_lock(&commit_mu_);
  absl::MutexLock lock(&mu_);
  if (engines_.empty()) return absl::InvalidArgumentError("extent store: no I/O engine given");
  for (IoEngine* e : engines_) {
    if (e == nullptr) return absl::InvalidArgumentError("extent store: engine is null");
  }
  // The manifest lives in the first path. Finding one elsewhere means the
  // paths were reordered; opening would start an empty store over live data.
  for (size_t i = 1; i < options_.paths.size(); ++i) {
    std::string other = absl::StrCat(options_.paths[i], "/", kManifestFileName);
    if (access(other.c_str(), F_OK) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "extent store: ", other, " exists, but the manifest belongs in the first path (",
          options_.paths[0], "); the paths were reordered. Pass the same paths in the same order"));
    }
  }
  for (const std::string& dir : options_.paths) {
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("extent store: NVMe path ", dir,
                                              " is not an existing directory; create it or fix the path"));
    }
    STRATA_RETURN_IF_ERROR(LockPath(dir));
  }
  lanes_.resize(engines_.size());
  for (size_t i = 0; i < engines_.size(); ++i) lanes_[i].engine = engines_[i];
  for (size_t i = 0; i < options_.paths.size(); ++i) STRATA_RETURN_IF_ERROR(OpenDataFile(i));
  if (options_.allocation_unit_bytes % alignment_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent store: allocation_unit_bytes ", options_.allocation_unit_bytes,
        " is not a multiple of the O_DIRECT alignment ", alignment_));
  }
  chunk_bytes_ = options_.io_chunk_bytes != 0 ? options_.io_chunk_bytes : engines_[0]->info().block_size_bytes;
  chunk_bytes_ = std::max<uint64_t>(chunk_bytes_ - chunk_bytes_ % alignment_, alignment_);
  {
    absl::MutexLock lanes_lock(&lanes_mu_);
    for (Lane& lane : lanes_) {
      STRATA_ASSIGN_OR_RETURN(lane.bounce, AlignedBuffer::Allocate(alignment_, alignment_));
      lane.hasher = std::make_unique<ChunkHasher>();
      free_lanes_.push_back(&lane);
    }
  }

  ManifestState state;
  STRATA_ASSIGN_OR_RETURN(
      journal_, ManifestJournal::Open(absl::StrCat(options_.paths[0], "/", kManifestFileName),
                                      options_.paths, &state, &warnings_));
  for (const auto& [key, rec] : state.extents) {
    if (rec.file_index >= files_.size()) {
      return absl::DataLossError(absl::StrCat("manifest lists shard ", ShardKeyToString(key),
                                              " in data file #", rec.file_index, ", which does not exist"));
    }
    if (rec.extent_bytes > 0) {
      absl::Status s = files_[rec.file_index].allocator->Reserve(rec.offset_bytes, rec.extent_bytes);
      if (!s.ok()) {
        return absl::DataLossError(absl::StrCat("manifest lists shard ", ShardKeyToString(key), " at ",
                                                Where(rec), ", which cannot be claimed: ", s.message()));
      }
    }
    entries_[key] = Entry{rec, /*committed=*/true};
  }
  durable_ = std::move(state.extents);
  next_generation_ = state.max_generation + 1;
  commit_seq_ = state.commit_seq;
  return absl::OkStatus();
}

// See RunExtentIo: the fewest chunks in flight at which the I/O thread will
// hash a queued chunk itself instead of sleeping in Reap.
constexpr size_t kInlineHashInFlight = 4;

template <typename OnChunk>
absl::Status ExtentStoreImpl::RunExtentIo(Lane& lane, IoOp op, const ExtentRecord& rec, std::byte* data,
                                          OnChunk on_chunk) {
  IoEngine* const engine = lane.engine;
  const IoFileId file_id = lane.file_ids[rec.file_index];
  std::vector<IoRequest>& requests = lane.requests;
  std::vector<uint64_t>& offsets = lane.offsets;
  std::vector<bool>& done = lane.done;
  std::byte* const bounce = lane.bounce.data();
  uint64_t body = rec.size_bytes - rec.size_bytes % alignment_;
  uint64_t tail = rec.size_bytes - body;
  requests.clear();
  offsets.clear();
  // user_data is the chunk's index; offsets holds its offset in the shard.
  for (uint64_t o = 0; o < body; o += chunk_bytes_) {
    requests.push_back(IoRequest{op, file_id, rec.offset_bytes + o, data + o,
                                 std::min(chunk_bytes_, body - o), requests.size(), OwnerOf(rec.key)});
    offsets.push_back(o);
  }
  if (tail > 0) {
    if (op == IoOp::kWrite) {
      std::memcpy(bounce, data + body, tail);
      std::memset(bounce + tail, 0, alignment_ - tail);
    }
    requests.push_back(
        IoRequest{op, file_id, rec.offset_bytes + body, bounce, alignment_, requests.size(), OwnerOf(rec.key)});
    offsets.push_back(body);
  }
  auto shard_bytes = [&](size_t i) {
    return std::min<uint64_t>(requests[i].length_bytes, rec.size_bytes - offsets[i]);
  };
  const size_t total = requests.size();
  size_t to_finish = total;  // lowered to what was submitted once an error stops issuing
  size_t submitted = 0;
  size_t finished = 0;
  size_t next_in_order = 0;  // chunks before this have been handed to on_chunk
  done.assign(total, false);
  absl::Status first_error;
  while (finished < to_finish) {
    if (submitted < total && first_error.ok()) {
      absl::StatusOr<size_t> n = engine->Submit(absl::MakeConstSpan(requests).subspan(submitted));
      if (!n.ok()) {
        first_error = n.status();
      } else {
        submitted += *n;
      }
    }
    if (!first_error.ok()) {
      to_finish = submitted;
      if (finished >= to_finish) break;
    }
    auto collect = [&](absl::Duration wait) -> absl::Status {
      lane.completions.clear();
      STRATA_RETURN_IF_ERROR(engine->Reap(wait == absl::ZeroDuration() ? 0 : 1, wait, &lane.completions));
      for (const IoCompletion& c : lane.completions) {
        ++finished;
        if (!c.status.ok() && first_error.ok()) first_error = c.status;
        if (c.user_data < total) done[c.user_data] = true;
      }
      return absl::OkStatus();
    };
    // Checksum while the I/O is in flight: writes hash the chunks already
    // handed to the engine (their bytes are in the caller's buffer), reads
    // hash each chunk once it and every chunk before it have arrived. After
    // each chunk a non-blocking Reap refills the queue, so hashing never
    // lets the device run dry.
    bool hashed = false;
    while (first_error.ok() && next_in_order < (op == IoOp::kWrite ? submitted : total) &&
           (op == IoOp::kWrite || done[next_in_order])) {
      if (op == IoOp::kRead && requests[next_in_order].buffer == bounce) {
        std::memcpy(data + offsets[next_in_order], bounce, shard_bytes(next_in_order));
      }
      on_chunk(offsets[next_in_order], shard_bytes(next_in_order));
      ++next_in_order;
      hashed = true;
      if (finished < to_finish) STRATA_RETURN_IF_ERROR(collect(absl::ZeroDuration()));
    }
    if (!hashed && finished < to_finish) {
      // Nothing new to hand over. With a few chunks still queued at the
      // device (>= kInlineHashInFlight: milliseconds of its work against
      // ~0.1 ms to hash a chunk), hash a queued chunk on this thread rather
      // than sleep -- on a loaded machine the hasher thread may not get a CPU
      // for a whole slice, and the bytes it owes are then the tail of this
      // call -- and reap without blocking. Otherwise sleep until a completion.
      if (submitted - finished >= kInlineHashInFlight && lane.hasher->TryHashOne()) {
        STRATA_RETURN_IF_ERROR(collect(absl::ZeroDuration()));
      } else {
        STRATA_RETURN_IF_ERROR(collect(absl::InfiniteDuration()));
      }
    }
  }
  // Reads: the chunks that arrived with the last completions.
  for (; op == IoOp::kRead && first_error.ok() && next_in_order < total && done[next_in_order];
       ++next_in_order) {
    if (requests[next_in_order].buffer == bounce) {
      std::memcpy(data + offsets[next_in_order], bounce, shard_bytes(next_in_order));
    }
    on_chunk(offsets[next_in_order], shard_bytes(next_in_order));
  }
  return first_error;
}

void ExtentStoreImpl::FreeLocked(const FreeExtent& f) {
  const ExtentId id{f.file_index, f.offset};
  if (pins_.contains(id)) {
    deferred_free_[id] = f.bytes;
    return;
  }
  (void)files_[f.file_index].allocator->Free(f.offset, f.bytes);
}

void ExtentStoreImpl::UnpinLocked(const ExtentId& id) {
  auto it = pins_.find(id);
  if (it == pins_.end() || --it->second > 0) return;
  pins_.erase(it);
  auto d = deferred_free_.find(id);
  if (d == deferred_free_.end()) return;
  (void)files_[id.first].allocator->Free(id.second, d->second);
  deferred_free_.erase(d);
}

void ExtentStoreImpl::ReleaseLocked(const Entry& e, Pending* pending) {
  const ExtentRecord& rec = e.record;
  if (rec.extent_bytes == 0) return;
  const FreeExtent f{rec.file_index, rec.offset_bytes, rec.extent_bytes};
  if (!e.committed) {
    // Never durable: nothing on disk refers to it.
    FreeLocked(f);
    return;
  }
  pending->free_after_commit.push_back(f);
}

absl::Status ExtentStoreImpl::Write(const ShardKey& key, absl::Span<const std::byte> data) {
  if (!data.empty() && reinterpret_cast<uintptr_t>(data.data()) % alignment_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "writing shard ", ShardKeyToString(key), ": buffer address 0x",
        absl::Hex(reinterpret_cast<uintptr_t>(data.data())), " is not a multiple of ", alignment_,
        ", the store's O_DIRECT alignment; allocate shard buffers aligned to alignment()"));
  }
  ExtentRecord rec;
  rec.key = key;
  rec.size_bytes = data.size();
  rec.checksum_kind = options_.checksum;
  {
    absl::MutexLock lock(&mu_);
    rec.generation = next_generation_++;
    if (!data.empty()) {
      // The file with the most free space that has a large enough hole:
      // spreads shards (and bandwidth) across paths.
      int best = -1;
      uint64_t need = files_[0].allocator->RoundUp(data.size());
      for (size_t i = 0; i < files_.size(); ++i) {
        const ExtentAllocator& a = *files_[i].allocator;
        if (a.largest_free_extent_bytes() < need) continue;
        if (best < 0 || a.free_bytes() > files_[best].allocator->free_bytes()) best = static_cast<int>(i);
      }
      if (best < 0) {
        ExtentStoreStats st;
        for (const DataFile& f : files_) {
          st.free_bytes += f.allocator->free_bytes();
          st.largest_free_extent_bytes =
              std::max(st.largest_free_extent_bytes, f.allocator->largest_free_extent_bytes());
        }
        bool frees_pending = !free_after_sync_.empty();
        for (const auto& [owner, p] : pending_) frees_pending = frees_pending || !p.free_after_commit.empty();
        return absl::ResourceExhaustedError(absl::StrCat(
            "writing shard ", ShardKeyToString(key), " (", FormatBytes(data.size()),
            "): no free extent large enough on NVMe: ", FormatBytes(st.free_bytes), " free, largest free extent ",
            FormatBytes(st.largest_free_extent_bytes),
            (frees_pending ? "; Commit() (and Sync()) release replaced versions" : ""),
            "; raise capacity_bytes_per_path or evict shards"));
      }
      rec.file_index = static_cast<uint32_t>(best);
      STRATA_ASSIGN_OR_RETURN(rec.offset_bytes, files_[best].allocator->Allocate(data.size()));
      rec.extent_bytes = need;
    }
  }
  // The new extent is this call's alone until it is installed below.
  StreamingChecksum sum(rec.checksum_kind, rec.generation);
  if (!data.empty()) {
    absl::Status s;
    {
      LaneLease lane(this);
      ChunkHasher* hasher = lane->hasher.get();
      s = RunExtentIo(*lane, IoOp::kWrite, rec, const_cast<std::byte*>(data.data()),
                      [&](uint64_t off, uint64_t len) { hasher->Add(&sum, data.data() + off, len); });
      hasher->Drain();  // before `sum` or the caller's buffer can go away
    }
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      FreeLocked(FreeExtent{rec.file_index, rec.offset_bytes, rec.extent_bytes});
      return absl::Status(s.code(), absl::StrCat("writing shard ", ShardKeyToString(key), " to NVMe: ",
                                                 s.message(), "; the previous version is unchanged"));
    }
  }
  rec.checksum = sum.Digest();
  absl::MutexLock lock(&mu_);
  if (!data.empty()) ++write_epoch_;
  Pending& pending = pending_[OwnerOf(key)];
  auto it = entries_.find(key);
  if (it != entries_.end()) ReleaseLocked(it->second, &pending);
  entries_[key] = Entry{rec, false};
  pending.changes.push_back(ManifestChange{false, rec});
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ExtentStoreImpl::Read(const ShardKey& key, absl::Span<std::byte> into) {
  ExtentRecord rec;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("shard ", ShardKeyToString(key), " is not on NVMe"));
    }
    rec = it->second.record;
    if (into.size() < rec.size_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reading shard ", ShardKeyToString(key), ": the buffer holds ", into.size(),
          " bytes but the shard is ", rec.size_bytes, "; pass a buffer of at least SizeOf(key)"));
    }
    if (rec.size_bytes > 0 && reinterpret_cast<uintptr_t>(into.data()) % alignment_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reading shard ", ShardKeyToString(key), ": buffer address 0x",
          absl::Hex(reinterpret_cast<uintptr_t>(into.data())), " is not a multiple of ", alignment_,
          ", the store's O_DIRECT alignment; allocate shard buffers aligned to alignment()"));
    }
    // Pinned: a concurrent replace or delete frees it only after this read.
    if (rec.extent_bytes > 0) ++pins_[ExtentId{rec.file_index, rec.offset_bytes}];
  }
  StreamingChecksum sum(rec.checksum_kind, rec.generation);
  absl::Status s;
  if (rec.size_bytes > 0) {
    LaneLease lane(this);
    ChunkHasher* hasher = lane->hasher.get();
    s = RunExtentIo(*lane, IoOp::kRead, rec, into.data(),
                    [&](uint64_t off, uint64_t len) { hasher->Add(&sum, into.data() + off, len); });
    hasher->Drain();  // before `sum` or the caller's buffer can go away
  }
  if (rec.extent_bytes > 0) {
    absl::MutexLock lock(&mu_);
    UnpinLocked(ExtentId{rec.file_index, rec.offset_bytes});
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("reading shard ", ShardKeyToString(key), " from NVMe: ",
                                               s.message()));
  }
  uint64_t got = sum.Digest();
  if (got != rec.checksum) {
    return absl::DataLossError(absl::StrCat(
        "reading shard ", ShardKeyToString(key), " from NVMe: ", ChecksumKindName(rec.checksum_kind),
        " checksum mismatch (stored 0x", absl::Hex(rec.checksum), ", read 0x", absl::Hex(got), ") in ",
        Where(rec), "; the extent is damaged or was overwritten. The shard's bytes cannot be trusted: "
        "restore it from a checkpoint"));
  }
  return rec.size_bytes;
}

absl::StatusOr<uint64_t> ExtentStoreImpl::SizeOf(const ShardKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("shard ", ShardKeyToString(key), " is not on NVMe"));
  }
  return it->second.record.size_bytes;
}

absl::StatusOr<uint64_t> ExtentStoreImpl::GenerationOf(const ShardKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("shard ", ShardKeyToString(key), " is not on NVMe"));
  }
  return it->second.record.generation;
}

bool ExtentStoreImpl::Contains(const ShardKey& key) const {
  absl::MutexLock lock(&mu_);
  return entries_.contains(key);
}

absl::Status ExtentStoreImpl::Delete(const ShardKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("deleting shard ", ShardKeyToString(key), ": not on NVMe"));
  }
  Pending& pending = pending_[OwnerOf(key)];
  ReleaseLocked(it->second, &pending);
  ManifestChange c;
  c.is_delete = true;
  c.record.key = key;
  c.record.generation = next_generation_++;
  pending.changes.push_back(c);
  entries_.erase(it);
  return absl::OkStatus();
}

absl::Status ExtentStoreImpl::Rename(const ShardKey& from, const ShardKey& to) {
  if (from == to) {
    return absl::InvalidArgumentError(
        absl::StrCat("renaming shard ", ShardKeyToString(from), " onto itself; name another key"));
  }
  if (OwnerOf(from) != OwnerOf(to)) {
    return absl::InvalidArgumentError(absl::StrCat("renaming shard ", ShardKeyToString(from), " to ",
                                                   ShardKeyToString(to),
                                                   ": the keys belong to different jobs, whose commits are apart"));
  }
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(from);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("renaming shard ", ShardKeyToString(from), ": not on NVMe"));
  }
  if (it->second.committed) {
    // The manifest has (or is getting) the extent under `from`: moving it
    // would need a delete of `from` that must not free it, and a later
    // replace of `to` could not free it either. Not needed: renames follow
    // writes of the same step.
    return absl::FailedPreconditionError(absl::StrCat(
        "renaming shard ", ShardKeyToString(from), " to ", ShardKeyToString(to),
        ": its latest version is committed; only a version written since the owner's last commit can be renamed "
        "(write it again, or copy it)"));
  }
  ExtentRecord rec = it->second.record;
  entries_.erase(it);
  Pending& pending = pending_[OwnerOf(from)];
  // `from`'s puts leave the journal-to-be (an older uncommitted version's
  // extent is free already); a version the manifest holds is deleted.
  std::erase_if(pending.changes,
                [&](const ManifestChange& c) { return !c.is_delete && c.record.key == from; });
  if (durable_.contains(from)) {
    ManifestChange c;
    c.is_delete = true;
    c.record.key = from;
    c.record.generation = next_generation_++;
    pending.changes.push_back(c);
  }
  rec.key = to;
  auto old = entries_.find(to);
  if (old != entries_.end()) ReleaseLocked(old->second, &pending);
  entries_[to] = Entry{rec, /*committed=*/false};
  pending.changes.push_back(ManifestChange{false, rec});
  return absl::OkStatus();
}

absl::Status ExtentStoreImpl::DeleteOwner(uint64_t owner) {
  {
    absl::MutexLock lock(&mu_);
    Pending& pending = pending_[owner];
    for (auto it = entries_.lower_bound(FirstKeyOf(owner)); it != entries_.end() && OwnerOf(it->first) == owner;) {
      ReleaseLocked(it->second, &pending);
      ManifestChange c;
      c.is_delete = true;
      c.record.key = it->first;
      c.record.generation = next_generation_++;
      pending.changes.push_back(c);
      it = entries_.erase(it);
    }
  }
  return Commit(owner);
}

void ExtentStoreImpl::Rollback(uint64_t owner) {
  // No commit of this owner may be half way (its extents about to become
  // durable) while its pending state is thrown away.
  absl::MutexLock commit_lock(&commit_mu_);
  absl::MutexLock lock(&mu_);
  std::set<ExtentId> keep;  // the owner's durable extents
  const ShardKey first = FirstKeyOf(owner);
  for (auto it = durable_.lower_bound(first); it != durable_.end() && OwnerOf(it->first) == owner; ++it) {
    if (it->second.extent_bytes > 0) keep.insert(ExtentId{it->second.file_index, it->second.offset_bytes});
  }
  auto p = pending_.find(owner);
  if (p != pending_.end()) {
    for (const FreeExtent& f : p->second.free_after_commit) {
      if (!keep.contains(ExtentId{f.file_index, f.offset})) FreeLocked(f);
    }
    pending_.erase(p);
  }
  for (auto it = entries_.lower_bound(first); it != entries_.end() && OwnerOf(it->first) == owner;) {
    auto d = durable_.find(it->first);
    if (d != durable_.end() && d->second.generation == it->second.record.generation) {
      ++it;
      continue;
    }
    const ExtentRecord& rec = it->second.record;
    if (rec.extent_bytes > 0 && !keep.contains(ExtentId{rec.file_index, rec.offset_bytes})) {
      FreeLocked(FreeExtent{rec.file_index, rec.offset_bytes, rec.extent_bytes});
    }
    it = entries_.erase(it);
  }
  for (auto it = durable_.lower_bound(first); it != durable_.end() && OwnerOf(it->first) == owner; ++it) {
    if (!entries_.contains(it->first)) entries_[it->first] = Entry{it->second, /*committed=*/true};
  }
}

absl::Status ExtentStoreImpl::CommitImpl(bool one_owner, uint64_t owner, bool force_sync) {
  absl::MutexLock commit_lock(&commit_mu_);
  if (!broken_.ok()) return broken_;
  bool sync = force_sync;
  if (!sync) {
    switch (options_.sync_policy) {
      case SyncPolicy::kEveryCommit: sync = true; break;
      case SyncPolicy::kBatched: sync = commits_since_sync_ + 1 >= options_.sync_every_commits; break;
      case SyncPolicy::kNever: sync = false; break;
    }
  }
  std::map<uint64_t, Pending> taken;
  std::vector<ManifestChange> changes;
  uint64_t epoch, max_generation;
  {
    absl::MutexLock lock(&mu_);
    if (one_owner) {
      auto it = pending_.find(owner);
      if (it != pending_.end()) {
        taken.emplace(owner, std::move(it->second));
        pending_.erase(it);
      }
    } else {
      taken.swap(pending_);
    }
    for (auto& [o, p] : taken) {
      for (const ManifestChange& c : p.changes) {
        changes.push_back(c);
        if (c.is_delete) continue;
        // From here a replace of this version waits for a commit to free it.
        auto e = entries_.find(c.record.key);
        if (e != entries_.end() && e->second.record.generation == c.record.generation) e->second.committed = true;
      }
    }
    epoch = write_epoch_;
    max_generation = next_generation_ - 1;
  }
  // Puts what was taken back in front of what arrived since (a failed commit
  // leaves the changes pending, as if it had not been tried).
  auto give_back = [&] {
    absl::MutexLock lock(&mu_);
    for (auto& [o, p] : taken) {
      Pending& now = pending_[o];
      p.changes.insert(p.changes.end(), now.changes.begin(), now.changes.end());
      p.free_after_commit.insert(p.free_after_commit.end(), now.free_after_commit.begin(),
                                 now.free_after_commit.end());
      now = std::move(p);
    }
  };
  if (changes.empty() && !sync) return absl::OkStatus();
  // Data before the manifest that points at it: after a crash a committed
  // record never refers to bytes that had not reached the disk.
  if (sync && epoch > synced_epoch_) {
    for (const DataFile& f : files_) {
      if (fdatasync(f.fd) != 0) {
        absl::Status s = ErrnoToStatus(errno, absl::StrCat("fdatasync of ", f.path));
        give_back();
        return s;
      }
    }
    synced_epoch_ = epoch;
  }
  if (!changes.empty()) {
    absl::Status s = journal_->AppendCommit(changes, commit_seq_ + 1, max_generation, sync,
                                            one_owner ? owner : ManifestJournal::kAllOwners);
    if (!s.ok()) {
      // The append may have reached the file in part; whether it survives is
      // unknown, so nothing more is committed until the store is reopened.
      broken_ = absl::Status(s.code(), absl::StrCat("the NVMe manifest could not be appended (", s.message(),
                                                    "); no further commits until the daemon restarts"));
      give_back();
      return s;
    }
    ++commit_seq_;
  } else if (sync) {
    STRATA_RETURN_IF_ERROR(journal_->Sync());
  }
  ManifestState snapshot;
  bool compact = false;
  {
    absl::MutexLock lock(&mu_);
    for (const ManifestChange& c : changes) {
      if (c.is_delete) {
        durable_.erase(c.record.key);
      } else {
        durable_[c.record.key] = c.record;
      }
    }
    std::vector<FreeExtent> freed;
    for (const auto& [o, p] : taken) freed.insert(freed.end(), p.free_after_commit.begin(), p.free_after_commit.end());
    // Extents replaced by this commit. Reusing them is safe once the manifest
    // that no longer references them cannot be lost: after a sync, or at once
    // under kNever (which gives up power-loss safety anyway; a stale record
    // then reads as DataLoss, never as wrong data).
    if (sync) {
      for (const FreeExtent& f : free_after_sync_) FreeLocked(f);
      free_after_sync_.clear();
      for (const FreeExtent& f : freed) FreeLocked(f);
    } else if (options_.sync_policy == SyncPolicy::kNever) {
      for (const FreeExtent& f : freed) FreeLocked(f);
    } else {
      free_after_sync_.insert(free_after_sync_.end(), freed.begin(), freed.end());
    }
    const uint64_t snapshot_estimate = 128 + durable_.size() * 96;
    if (journal_->size_bytes() > std::max(options_.manifest_compaction_min_bytes, kCompactionFactor * snapshot_estimate)) {
      compact = true;
      snapshot.extents = durable_;
      snapshot.max_generation = next_generation_ - 1;
    }
  }
  commits_since_sync_ = sync ? 0 : commits_since_sync_ + 1;
  if (compact) {
    snapshot.commit_seq = commit_seq_;
    absl::Status s = journal_->Rewrite(snapshot);
    if (!s.ok()) {
      broken_ = absl::Status(s.code(), absl::StrCat("compacting the NVMe manifest failed (", s.message(),
                                                    "); no further commits until the daemon restarts"));
      return broken_;
    }
  }
  return absl::OkStatus();
}

std::vector<ShardKey> ExtentStoreImpl::Keys() const {
  absl::MutexLock lock(&mu_);
  std::vector<ShardKey> keys;
  keys.reserve(entries_.size());
  for (const auto& [key, e] : entries_) keys.push_back(key);
  return keys;
}

ExtentStoreStats ExtentStoreImpl::Stats() const {
  absl::MutexLock lock(&mu_);
  ExtentStoreStats s;
  for (const DataFile& f : files_) {
    s.capacity_bytes += f.allocator->capacity_bytes();
    s.free_bytes += f.allocator->free_bytes();
    s.largest_free_extent_bytes = std::max(s.largest_free_extent_bytes, f.allocator->largest_free_extent_bytes());
  }
  s.used_bytes = s.capacity_bytes - s.free_bytes;
  s.shard_count = entries_.size();
  s.committed_generation = next_generation_ - 1;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExtentStore>> ExtentStore::Open(const ExtentStoreOptions& options,
                                                               IoEngine* engine) {
  IoEngine* const engines[] = {engine};
  return Open(options, absl::MakeConstSpan(engines));
}

absl::StatusOr<std::unique_ptr<ExtentStore>> ExtentStore::Open(const ExtentStoreOptions& options,
                                                               absl::Span<IoEngine* const> engines) {
  STRATA_RETURN_IF_ERROR(ValidateOptions(options));
  auto store = std::make_unique<ExtentStoreImpl>(options, std::vector<IoEngine*>(engines.begin(), engines.end()));
  STRATA_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<ExtentStore>(std::move(store));
}

}  // namespace strata
