// ManifestJournal: where each shard's extent lives, durable across crashes.
//
// An append-only journal of framed records: a header (format version and the
// store's data paths), then per commit the PUT/DELETE records of the shards it
// changed followed by one COMMIT record. A COMMIT record names its owner (the
// job whose changes it makes durable, or kAllOwners); replay checks that every
// change it closes belongs to that owner. Records of one commit are written
// in one pwrite by one committer at a time, so commits never interleave. Each record is framed as
//   magic u32 | payload length u32 | XXH3-64 of payload u64 | payload
// so a torn or partly written tail fails its hash. Replay applies records a
// commit at a time: changes are staged and only take effect when their
// COMMIT record is read intact. Everything after the last intact COMMIT is a
// tail an interrupted commit left behind; it is ignored and truncated away.
// A bad record followed by intact ones is real corruption: DataLoss.
//
// Compaction writes the live state as a fresh journal to `<path>.tmp`,
// fdatasyncs it, renames it over the journal and fsyncs the directory, so a
// crash leaves either the old or the new journal, both complete.
//
// Thread-compatible.
#ifndef STRATA_SWAP_MANIFEST_JOURNAL_H_
#define STRATA_SWAP_MANIFEST_JOURNAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/shard_key.h"
#include "swap/extent_store.h"

namespace strata {

// Where one version of one shard lives and how to verify it.
struct ExtentRecord {
  ShardKey key;
  uint32_t file_index = 0;  // index into the store's paths
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;    // the shard's bytes
  uint64_t extent_bytes = 0;  // allocated (rounded up); 0 for an empty shard
  uint64_t checksum = 0;
  ChecksumKind checksum_kind = ChecksumKind::kXxh3;
  uint64_t generation = 0;

  friend bool operator==(const ExtentRecord&, const ExtentRecord&) = default;
};

struct ManifestState {
  std::map<ShardKey, ExtentRecord> extents;
  uint64_t commit_seq = 0;
  uint64_t max_generation = 0;
};

struct ManifestChange {
  bool is_delete = false;
  ExtentRecord record;  // for a delete only key and generation matter
};

class ManifestJournal {
 public:
  // Opens the journal at `path`, creating it (with a header naming
  // `data_paths`) when absent or empty, and replays it into `*state`.
  // FailedPrecondition when the journal was written for other data paths;
  // DataLoss when it is corrupt before its last intact record. A discarded
  // tail adds a line to `*warnings`.
  static absl::StatusOr<std::unique_ptr<ManifestJournal>> Open(
      const std::string& path, const std::vector<std::string>& data_paths, ManifestState* state,
      std::vector<std::string>* warnings);
  ~ManifestJournal();

  static constexpr uint64_t kAllOwners = UINT64_MAX;
  // Appends `changes` and a COMMIT record as one write; fdatasync when `sync`.
  // REQUIRES: every change's key belongs to `owner` (unless kAllOwners).
  absl::Status AppendCommit(absl::Span<const ManifestChange> changes, uint64_t commit_seq,
                            uint64_t max_generation, bool sync, uint64_t owner = kAllOwners);
  // Replaces the journal by a snapshot of `state` (see above).
  absl::Status Rewrite(const ManifestState& state);
  absl::Status Sync();

  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  ManifestJournal(std::string path, std::vector<std::string> data_paths, int fd, uint64_t size)
      : path_(std::move(path)), data_paths_(std::move(data_paths)), fd_(fd), size_bytes_(size) {}

  std::string path_;
  std::vector<std::string> data_paths_;
  int fd_;
  uint64_t size_bytes_;
};

}  // namespace strata

#endif  // STRATA_SWAP_MANIFEST_JOURNAL_H_
