// ExtentStore: shards kept on NVMe in preallocated files, one checksummed
// extent per shard, findable again after a restart.
//
// Layout. Each configured directory holds one data file, `strata-extents.data`,
// preallocated with fallocate to its capacity, and the first directory holds
// the manifest journal `strata-extents.manifest`. A shard is one contiguous
// extent in one data file; its length is rounded up to the allocation unit.
// An extent allocator (best fit over a coalescing free list per file) hands
// out extents; Write always goes to a fresh extent (copy on write) and the old
// extent is freed only after the new one is durable, so committed data is
// never overwritten in place.
//
// Integrity. Every extent carries a 64-bit checksum (XXH3 seeded with the
// generation, or CRC32C with SSE4.2) and a generation number that increases
// with every write. Read() verifies the checksum while the data arrives (on
// a hashing thread of the store's own, chunk by chunk in order, so the I/O
// thread keeps the queue full); a mismatch is DataLoss naming the shard, file
// and offset -- never wrong data.
//
// Durability. Write() makes data readable at once (by this process); each
// shard belongs to an owner -- its key's job id -- and Commit(owner) makes
// that owner's writes and deletes so far survive a crash, and no one else's:
// it waits for the data, fdatasyncs the data files (per SyncPolicy), appends
// the owner's changes and a commit record naming the owner to the manifest
// journal and fdatasyncs it. Jobs sharing a store therefore never make each
// other's half-written steps durable. Rollback(owner) drops an owner's
// uncommitted changes; DeleteOwner(owner) removes all its shards in one
// commit. On Open, the journal is replayed up to the last complete commit
// record (a torn tail is ignored and truncated); uncommitted writes of every
// owner are gone. After a crash at any point each shard therefore reads back
// as its owner's last committed version or is missing (NotFound), never torn.
// The journal is compacted by writing a snapshot of the committed state to a
// temporary file, fsyncing it and renaming it over the journal.
//
// Exclusive use. Open takes an flock on `strata-extents.lock` in every path
// (holding the process id); a second store on the same paths -- another
// daemon -- is FailedPrecondition naming the holder's pid.
//
// Thread-safe, for several jobs at once: metadata (index, allocator, pending
// changes) is guarded by one mutex that is never held across I/O. Reads and
// writes run concurrently on I/O lanes, one engine each (see Open); a read
// pins its extent so a concurrent replace cannot reuse it mid-read. Commits
// are serialized with each other (the journal is one file), but not with
// reads and writes.
#ifndef STRATA_SWAP_EXTENT_STORE_H_
#define STRATA_SWAP_EXTENT_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/shard_key.h"
#include "swap/io_engine.h"

namespace strata {

// When Commit() forces data and manifest to stable storage.
enum class SyncPolicy : uint8_t {
  // fdatasync data files and the manifest on every Commit(). A commit that
  // returned OK survives power loss.
  kEveryCommit = 0,
  // fdatasync on every `sync_every_commits`-th Commit() (and on Close/Sync()).
  // A process crash loses nothing committed; a power loss may fall back to
  // the last synced commit. Extents freed by an unsynced commit are not
  // reused before the next sync, so that fallback never reads overwritten data.
  kBatched = 1,
  // Never fdatasync (Sync() still does). Safe against process crashes (the
  // page cache survives); after power loss, shards may be missing or, if their
  // extents were reused, reported as DataLoss -- never returned wrong.
  kNever = 2,
};
absl::string_view SyncPolicyName(SyncPolicy policy);  // "every_commit", "batched", "never"
absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view text);

enum class ChecksumKind : uint8_t {
  kXxh3 = 0,    // XXH3-64 from libxxhash, seeded with the generation
  kCrc32c = 1,  // CRC32C with the SSE4.2 instruction (software fallback)
};
absl::string_view ChecksumKindName(ChecksumKind kind);  // "xxh3", "crc32c"
absl::StatusOr<ChecksumKind> ParseChecksumKind(absl::string_view text);

struct ExtentStoreOptions {
  // Directories on NVMe, one data file each. At least one; must exist.
  std::vector<std::string> paths;
  // Size of each data file. Checked against the file system's free space at
  // Open: too little is ResourceExhausted with both numbers. An existing file
  // smaller than this is grown; a larger one keeps its size.
  uint64_t capacity_bytes_per_path = 0;
  // Extents are multiples of this (a power of two, >= the direct-I/O
  // alignment, default 64 KiB), which bounds fragmentation.
  uint64_t allocation_unit_bytes = 64 << 10;
  // Open data files with O_DIRECT. A file system that refuses it is
  // InvalidArgument at Open unless allow_buffered_fallback, in which case the
  // files are opened buffered and warnings() says so.
  bool direct_io = true;
  bool allow_buffered_fallback = false;
  SyncPolicy sync_policy = SyncPolicy::kEveryCommit;
  uint32_t sync_every_commits = 16;  // kBatched only
  ChecksumKind checksum = ChecksumKind::kXxh3;
  // Reads and writes are issued as requests of this size, all in flight
  // together (the engine bounds them by its queue depth), and checksummed
  // piece by piece as they complete. 0: the engine's block size.
  uint64_t io_chunk_bytes = 0;
  // The journal is compacted once it exceeds both this and 4x the size of a
  // snapshot of the live shards.
  uint64_t manifest_compaction_min_bytes = 4 << 20;
};

struct ExtentStoreStats {
  uint64_t capacity_bytes = 0;  // sum over data files
  uint64_t used_bytes = 0;      // allocated extents, including not yet freed old versions
  uint64_t free_bytes = 0;
  uint64_t largest_free_extent_bytes = 0;  // fragmentation: free vs largest
  uint64_t shard_count = 0;
  uint64_t committed_generation = 0;
};

class ExtentStore {
 public:
  // Opens (creating if absent) the store in `options.paths`, preallocating
  // the data files and replaying the manifest. `engine` is borrowed, must
  // outlive the store and must not be used by anyone else while the store is
  // open (it is driven from the store's calls).
  // Errors: InvalidArgument for bad options or a file system that refuses
  // O_DIRECT; ResourceExhausted when a path lacks the space ("need 64.0 GiB
  // at /nvme0, 12.3 GiB free"); DataLoss when the manifest is corrupt before
  // its last commit record; errno-derived codes for open/fallocate failures.
  static absl::StatusOr<std::unique_ptr<ExtentStore>> Open(
      const ExtentStoreOptions& options, IoEngine* engine);
  // As above with one I/O lane per engine: up to engines.size() reads and
  // writes run at once (each lane drives its own engine from the calling
  // thread). All engines are borrowed, as above.
  static absl::StatusOr<std::unique_ptr<ExtentStore>> Open(
      const ExtentStoreOptions& options, absl::Span<IoEngine* const> engines);

  // The owner of a shard: its job. Commit/Rollback/DeleteOwner act per owner.
  static uint64_t OwnerOf(const ShardKey& key) { return key.job.value(); }

  // The destructor does not commit: writes since the last Commit() are
  // dropped as by a crash (the next Open does not see them).
  virtual ~ExtentStore() = default;

  // Buffers passed to Write and Read must start at a multiple of this.
  virtual uint32_t alignment() const = 0;

  // Stores `data` as the new version of `key` (readable at once, durable at
  // the next Commit). Only the address must be aligned; any length is fine
  // (the tail block goes through an internal bounce buffer). An empty shard
  // is allowed. Errors: InvalidArgument (misaligned), ResourceExhausted (no
  // free extent large enough: the message gives free and largest-free bytes),
  // and engine errors with the shard named. On error the previous version of
  // `key` stays as it was.
  virtual absl::Status Write(const ShardKey& key, absl::Span<const std::byte> data) = 0;

  // Reads the latest version of `key` into the front of `into` and returns
  // its size. REQUIRES: into.data() aligned; into.size() >= SizeOf(key)
  // (else InvalidArgument saying how much is needed). NotFound if absent;
  // DataLoss on checksum mismatch. Bytes of `into` beyond the shard's size
  // are left unchanged.
  virtual absl::StatusOr<uint64_t> Read(const ShardKey& key, absl::Span<std::byte> into) = 0;

  // Size of the latest version of `key` in bytes; NotFound if absent.
  virtual absl::StatusOr<uint64_t> SizeOf(const ShardKey& key) const = 0;
  virtual bool Contains(const ShardKey& key) const = 0;

  // Removes `key` (durable at the next Commit). NotFound if absent.
  virtual absl::Status Delete(const ShardKey& key) = 0;

  // Makes the latest version of `from` the new version of `to`, moving no
  // data: its extent, size, generation and checksum (seeded by the
  // generation, not the key) now belong to `to`, and `from` is gone. Both
  // changes are durable at the owner's next Commit, together; until then a
  // crash or Rollback leaves `to` as it was and `from` absent. `to`'s
  // previous version is released as a Write would release it. Written under
  // a scratch key and renamed at the right moment, a shard is stored once
  // (the daemon's early-stepped params: docs/DAEMON.md). Errors: NotFound
  // when `from` is absent; InvalidArgument when the keys are equal or have
  // different owners; FailedPrecondition when `from`'s latest version was
  // committed (or is being committed) -- a rename applies to writes of the
  // owner's open step only.
  virtual absl::Status Rename(const ShardKey& from, const ShardKey& to) = 0;

  // Makes `owner`'s writes and deletes so far durable, atomically, as
  // described above; other owners' pending changes stay pending.
  virtual absl::Status Commit(uint64_t owner) = 0;
  // Commits every owner's pending changes at once (tools, tests, shutdown).
  virtual absl::Status Commit() = 0;
  // Commit() plus fdatasync regardless of SyncPolicy.
  virtual absl::Status Sync() = 0;
  // Drops `owner`'s uncommitted writes and deletes: its shards read back as
  // of its last commit (what a crash would leave), their new extents freed.
  virtual void Rollback(uint64_t owner) = 0;
  // Deletes every shard of `owner` (committed or not) and commits that, so
  // the owner is gone after a crash too. OK when it has no shards.
  virtual absl::Status DeleteOwner(uint64_t owner) = 0;
  // Generation of the latest version of `key` (it grows with every write).
  virtual absl::StatusOr<uint64_t> GenerationOf(const ShardKey& key) const = 0;

  // Every shard currently stored (including uncommitted writes), sorted.
  virtual std::vector<ShardKey> Keys() const = 0;
  virtual ExtentStoreStats Stats() const = 0;
  // Things Open noticed that the daemon should log once (buffered fallback,
  // a data file larger than configured, a truncated journal tail).
  virtual std::vector<std::string> warnings() const = 0;
};

}  // namespace strata

#endif  // STRATA_SWAP_EXTENT_STORE_H_
