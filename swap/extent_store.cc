#include "swap/extent_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
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
// Compact the journal once it is this many times larger than a snapshot
// would be (and at least manifest_compaction_min_bytes), so replay stays proportional to live shards.
constexpr uint64_t kCompactionFactor = 4;

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

struct DataFile {
  std::string path;
  int fd = -1;
  bool direct = false;
  IoFileId id;
  std::unique_ptr<ExtentAllocator> allocator;
};

// One live shard version as the store tracks it.
struct Entry {
  ExtentRecord record;
  bool committed = false;  // the manifest has it
};

struct FreeExtent {
  uint32_t file_index;
  uint64_t offset;
  uint64_t bytes;
};

class ExtentStoreImpl final : public ExtentStore {
 public:
  ExtentStoreImpl(ExtentStoreOptions options, IoEngine* engine)
      : options_(std::move(options)), engine_(engine) {}

  ~ExtentStoreImpl() override {
    for (DataFile& f : files_) {
      if (f.fd < 0) continue;
      (void)engine_->UnregisterFile(f.id);
      close(f.fd);
    }
  }

  absl::Status Init();

  uint32_t alignment() const override { return alignment_; }
  absl::Status Write(const ShardKey& key, absl::Span<const std::byte> data) override;
  absl::StatusOr<uint64_t> Read(const ShardKey& key, absl::Span<std::byte> into) override;
  absl::StatusOr<uint64_t> SizeOf(const ShardKey& key) const override;
  bool Contains(const ShardKey& key) const override;
  absl::Status Delete(const ShardKey& key) override;
  absl::Status Commit() override;
  absl::Status Sync() override;
  std::vector<ShardKey> Keys() const override;
  ExtentStoreStats Stats() const override;
  std::vector<std::string> warnings() const override {
    absl::MutexLock lock(&mu_);
    return warnings_;
  }

 private:
  absl::Status OpenDataFile(size_t index);
  // Issues the I/O for one extent: `main` covers the aligned body and `tail`
  // (if non-empty) the last partial block through the bounce buffer.
  // `on_chunk_done(offset, length)` runs as chunks finish, in order.
  template <typename OnChunk>
  absl::Status RunExtentIo(IoOp op, const ExtentRecord& rec, std::byte* data, OnChunk on_chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseExtent(const ExtentRecord& rec, bool committed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitLocked(bool force_sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Where(const ExtentRecord& rec) const {
    return absl::StrCat(files_[rec.file_index].path, " at offset ", rec.offset_bytes, ", ",
                        rec.extent_bytes, " bytes, generation ", rec.generation);
  }

  const ExtentStoreOptions options_;
  IoEngine* const engine_;
  uint32_t alignment_ = 4096;
  uint64_t chunk_bytes_ = 1 << 20;

  mutable absl::Mutex mu_;
  std::vector<DataFile> files_;  // fixed after Init
  std::unique_ptr<ManifestJournal> journal_ ABSL_GUARDED_BY(mu_);
  std::map<ShardKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<ManifestChange> uncommitted_ ABSL_GUARDED_BY(mu_);
  // Old versions replaced or deleted since the last commit: freed once the
  // commit that drops them is durable.
  std::vector<FreeExtent> free_after_commit_ ABSL_GUARDED_BY(mu_);
  // Freed by a commit that was not synced (kBatched): reusable after a sync.
  std::vector<FreeExtent> free_after_sync_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t commit_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t commits_since_sync_ ABSL_GUARDED_BY(mu_) = 0;
  bool data_dirty_ ABSL_GUARDED_BY(mu_) = false;  // data written since the last fdatasync
  AlignedBuffer bounce_ ABSL_GUARDED_BY(mu_);
  // Checksums are computed here, off the thread that drives the I/O.
  ChunkHasher hasher_;
  std::vector<IoRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<IoCompletion> completions_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> offsets_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);
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
  STRATA_ASSIGN_OR_RETURN(file.id, engine_->RegisterFile(file.fd, file.path));
  STRATA_ASSIGN_OR_RETURN(uint32_t a, engine_->RequiredAlignment(file.id));
  alignment_ = std::max(alignment_, a);
  return absl::OkStatus();
}

absl::Status ExtentStoreImpl::Init() {
  absl::MutexLock lock(&mu_);
  if (engine_ == nullptr) return absl::InvalidArgumentError("extent store: engine is null");
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
  for (size_t i = 0; i < options_.paths.size(); ++i) STRATA_RETURN_IF_ERROR(OpenDataFile(i));
  if (options_.allocation_unit_bytes % alignment_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent store: allocation_unit_bytes ", options_.allocation_unit_bytes,
        " is not a multiple of the O_DIRECT alignment ", alignment_));
  }
  chunk_bytes_ = options_.io_chunk_bytes != 0 ? options_.io_chunk_bytes : engine_->info().block_size_bytes;
  chunk_bytes_ = std::max<uint64_t>(chunk_bytes_ - chunk_bytes_ % alignment_, alignment_);
  STRATA_ASSIGN_OR_RETURN(bounce_, AlignedBuffer::Allocate(alignment_, alignment_));

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
  next_generation_ = state.max_generation + 1;
  commit_seq_ = state.commit_seq;
  return absl::OkStatus();
}

// See RunExtentIo: the fewest chunks in flight at which the I/O thread will
// hash a queued chunk itself instead of sleeping in Reap.
constexpr size_t kInlineHashInFlight = 4;

template <typename OnChunk>
absl::Status ExtentStoreImpl::RunExtentIo(IoOp op, const ExtentRecord& rec, std::byte* data,
                                          OnChunk on_chunk) {
  const DataFile& file = files_[rec.file_index];
  uint64_t body = rec.size_bytes - rec.size_bytes % alignment_;
  uint64_t tail = rec.size_bytes - body;
  requests_.clear();
  offsets_.clear();
  // user_data is the chunk's index; offsets_ holds its offset in the shard.
  for (uint64_t o = 0; o < body; o += chunk_bytes_) {
    requests_.push_back(IoRequest{op, file.id, rec.offset_bytes + o, data + o,
                                  std::min(chunk_bytes_, body - o), requests_.size()});
    offsets_.push_back(o);
  }
  if (tail > 0) {
    if (op == IoOp::kWrite) {
      std::memcpy(bounce_.data(), data + body, tail);
      std::memset(bounce_.data() + tail, 0, alignment_ - tail);
    }
    requests_.push_back(IoRequest{op, file.id, rec.offset_bytes + body, bounce_.data(), alignment_,
                                  requests_.size()});
    offsets_.push_back(body);
  }
  auto shard_bytes = [&](size_t i) {
    return std::min<uint64_t>(requests_[i].length_bytes, rec.size_bytes - offsets_[i]);
  };
  const size_t total = requests_.size();
  size_t to_finish = total;  // lowered to what was submitted once an error stops issuing
  size_t submitted = 0;
  size_t finished = 0;
  size_t next_in_order = 0;  // chunks before this have been handed to on_chunk
  done_.assign(total, false);
  absl::Status first_error;
  while (finished < to_finish) {
    if (submitted < total && first_error.ok()) {
      absl::StatusOr<size_t> n = engine_->Submit(absl::MakeConstSpan(requests_).subspan(submitted));
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
      completions_.clear();
      STRATA_RETURN_IF_ERROR(engine_->Reap(wait == absl::ZeroDuration() ? 0 : 1, wait, &completions_));
      for (const IoCompletion& c : completions_) {
        ++finished;
        if (!c.status.ok() && first_error.ok()) first_error = c.status;
        if (c.user_data < total) done_[c.user_data] = true;
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
           (op == IoOp::kWrite || done_[next_in_order])) {
      if (op == IoOp::kRead && requests_[next_in_order].buffer == bounce_.data()) {
        std::memcpy(data + offsets_[next_in_order], bounce_.data(), shard_bytes(next_in_order));
      }
      on_chunk(offsets_[next_in_order], shard_bytes(next_in_order));
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
      if (submitted - finished >= kInlineHashInFlight && hasher_.TryHashOne()) {
        STRATA_RETURN_IF_ERROR(collect(absl::ZeroDuration()));
      } else {
        STRATA_RETURN_IF_ERROR(collect(absl::InfiniteDuration()));
      }
    }
  }
  // Reads: the chunks that arrived with the last completions.
  for (; op == IoOp::kRead && first_error.ok() && next_in_order < total && done_[next_in_order];
       ++next_in_order) {
    if (requests_[next_in_order].buffer == bounce_.data()) {
      std::memcpy(data + offsets_[next_in_order], bounce_.data(), shard_bytes(next_in_order));
    }
    on_chunk(offsets_[next_in_order], shard_bytes(next_in_order));
  }
  return first_error;
}

void ExtentStoreImpl::ReleaseExtent(const ExtentRecord& rec, bool committed) {
  if (rec.extent_bytes == 0) return;
  if (!committed) {
    // Never durable: nothing on disk refers to it.
    (void)files_[rec.file_index].allocator->Free(rec.offset_bytes, rec.extent_bytes);
    return;
  }
  free_after_commit_.push_back(FreeExtent{rec.file_index, rec.offset_bytes, rec.extent_bytes});
}

absl::Status ExtentStoreImpl::Write(const ShardKey& key, absl::Span<const std::byte> data) {
  absl::MutexLock lock(&mu_);
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
  rec.generation = next_generation_++;
  if (!data.empty()) {
    // The file with the most free space that has a large enough hole: spreads
    // shards (and bandwidth) across paths.
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
        st.largest_free_extent_bytes = std::max(st.largest_free_extent_bytes, f.allocator->largest_free_extent_bytes());
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "writing shard ", ShardKeyToString(key), " (", FormatBytes(data.size()),
          "): no free extent large enough on NVMe: ", FormatBytes(st.free_bytes), " free, largest free extent ",
          FormatBytes(st.largest_free_extent_bytes),
          (free_after_commit_.empty() && free_after_sync_.empty() ? "" : "; Commit() (and Sync()) release replaced versions"),
          "; raise capacity_bytes_per_path or evict shards"));
    }
    rec.file_index = static_cast<uint32_t>(best);
    STRATA_ASSIGN_OR_RETURN(rec.offset_bytes, files_[best].allocator->Allocate(data.size()));
    rec.extent_bytes = need;
  }
  StreamingChecksum sum(rec.checksum_kind, rec.generation);
  if (!data.empty()) {
    absl::Status s = RunExtentIo(IoOp::kWrite, rec, const_cast<std::byte*>(data.data()),
                                 [&](uint64_t off, uint64_t len) { hasher_.Add(&sum, data.data() + off, len); });
    hasher_.Drain();  // before `sum` or the caller's buffer can go away
    if (!s.ok()) {
      (void)files_[rec.file_index].allocator->Free(rec.offset_bytes, rec.extent_bytes);
      return absl::Status(s.code(), absl::StrCat("writing shard ", ShardKeyToString(key), " to NVMe: ",
                                                 s.message(), "; the previous version is unchanged"));
    }
    data_dirty_ = true;
  }
  rec.checksum = sum.Digest();
  auto it = entries_.find(key);
  if (it != entries_.end()) ReleaseExtent(it->second.record, it->second.committed);
  entries_[key] = Entry{rec, false};
  uncommitted_.push_back(ManifestChange{false, rec});
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ExtentStoreImpl::Read(const ShardKey& key, absl::Span<std::byte> into) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("shard ", ShardKeyToString(key), " is not on NVMe"));
  }
  const ExtentRecord rec = it->second.record;
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
  StreamingChecksum sum(rec.checksum_kind, rec.generation);
  if (rec.size_bytes > 0) {
    absl::Status s = RunExtentIo(IoOp::kRead, rec, into.data(),
                                 [&](uint64_t off, uint64_t len) { hasher_.Add(&sum, into.data() + off, len); });
    hasher_.Drain();  // before `sum` or the caller's buffer can go away
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("reading shard ", ShardKeyToString(key), " from NVMe: ",
                                                 s.message()));
    }
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
  ReleaseExtent(it->second.record, it->second.committed);
  ManifestChange c;
  c.is_delete = true;
  c.record.key = key;
  c.record.generation = next_generation_++;
  uncommitted_.push_back(c);
  entries_.erase(it);
  return absl::OkStatus();
}

absl::Status ExtentStoreImpl::CommitLocked(bool force_sync) {
  bool sync = force_sync;
  if (!sync) {
    switch (options_.sync_policy) {
      case SyncPolicy::kEveryCommit: sync = true; break;
      case SyncPolicy::kBatched: sync = commits_since_sync_ + 1 >= options_.sync_every_commits; break;
      case SyncPolicy::kNever: sync = false; break;
    }
  }
  if (uncommitted_.empty() && !sync) return absl::OkStatus();
  // Data before the manifest that points at it: after a crash a committed
  // record never refers to bytes that had not reached the disk.
  if (sync && data_dirty_) {
    for (const DataFile& f : files_) {
      if (fdatasync(f.fd) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync of ", f.path));
    }
    data_dirty_ = false;
  }
  if (!uncommitted_.empty()) {
    STRATA_RETURN_IF_ERROR(journal_->AppendCommit(uncommitted_, commit_seq_ + 1, next_generation_ - 1, sync));
    ++commit_seq_;
    for (const ManifestChange& c : uncommitted_) {
      if (c.is_delete) continue;
      auto it = entries_.find(c.record.key);
      if (it != entries_.end() && it->second.record.generation == c.record.generation) it->second.committed = true;
    }
    uncommitted_.clear();
  } else if (sync) {
    STRATA_RETURN_IF_ERROR(journal_->Sync());
  }
  // Extents replaced by this commit. Reusing them is safe once the manifest
  // that no longer references them cannot be lost: after a sync, or at once
  // under kNever (which gives up power-loss safety anyway; a stale record
  // then reads as DataLoss, never as wrong data).
  if (sync) {
    for (const FreeExtent& f : free_after_sync_) (void)files_[f.file_index].allocator->Free(f.offset, f.bytes);
    free_after_sync_.clear();
    for (const FreeExtent& f : free_after_commit_) (void)files_[f.file_index].allocator->Free(f.offset, f.bytes);
    commits_since_sync_ = 0;
  } else if (options_.sync_policy == SyncPolicy::kNever) {
    for (const FreeExtent& f : free_after_commit_) (void)files_[f.file_index].allocator->Free(f.offset, f.bytes);
    ++commits_since_sync_;
  } else {
    free_after_sync_.insert(free_after_sync_.end(), free_after_commit_.begin(), free_after_commit_.end());
    ++commits_since_sync_;
  }
  free_after_commit_.clear();

  uint64_t snapshot_estimate = 128 + entries_.size() * 96;
  if (journal_->size_bytes() > std::max(options_.manifest_compaction_min_bytes, kCompactionFactor * snapshot_estimate)) {
    ManifestState state;
    for (const auto& [key, e] : entries_) state.extents[key] = e.record;
    state.commit_seq = commit_seq_;
    state.max_generation = next_generation_ - 1;
    STRATA_RETURN_IF_ERROR(journal_->Rewrite(state));
  }
  return absl::OkStatus();
}

absl::Status ExtentStoreImpl::Commit() {
  absl::MutexLock lock(&mu_);
  return CommitLocked(/*force_sync=*/false);
}

absl::Status ExtentStoreImpl::Sync() {
  absl::MutexLock lock(&mu_);
  return CommitLocked(/*force_sync=*/true);
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
  STRATA_RETURN_IF_ERROR(ValidateOptions(options));
  auto store = std::make_unique<ExtentStoreImpl>(options, engine);
  STRATA_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<ExtentStore>(std::move(store));
}

}  // namespace strata
