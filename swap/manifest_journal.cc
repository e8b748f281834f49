#include "swap/manifest_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/errno_status.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr uint32_t kMagic = 0x4D525453;  // "STRM" little-endian
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kFrameBytes = 16;
constexpr uint32_t kMaxPayload = 1 << 20;

enum RecordType : uint8_t { kHeader = 1, kPut = 2, kDelete = 3, kCommit = 4 };

void PutU8(std::string* s, uint8_t v) { s->push_back(static_cast<char>(v)); }
void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }
void PutString(std::string* s, absl::string_view v) {
  PutU32(s, static_cast<uint32_t>(v.size()));
  s->append(v.data(), v.size());
}

class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool String(std::string* v) {
    uint32_t n;
    if (!U32(&n) || n > data_.size()) return false;
    v->assign(data_.data(), n);
    data_.remove_prefix(n);
    return true;
  }
  bool done() const { return data_.empty(); }

 private:
  bool Raw(void* v, size_t n) {
    if (data_.size() < n) return false;
    std::memcpy(v, data_.data(), n);
    data_.remove_prefix(n);
    return true;
  }
  absl::string_view data_;
};

void AppendFramed(std::string* out, const std::string& payload) {
  PutU32(out, kMagic);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU64(out, XXH3_64bits(payload.data(), payload.size()));
  out->append(payload);
}

std::string HeaderPayload(const std::vector<std::string>& paths) {
  std::string p;
  PutU8(&p, kHeader);
  PutU32(&p, kFormatVersion);
  PutU32(&p, static_cast<uint32_t>(paths.size()));
  for (const std::string& path : paths) PutString(&p, path);
  return p;
}

std::string PutPayload(const ExtentRecord& r) {
  std::string p;
  PutU8(&p, kPut);
  PutString(&p, ShardKeyToString(r.key));
  PutU32(&p, r.file_index);
  PutU64(&p, r.offset_bytes);
  PutU64(&p, r.size_bytes);
  PutU64(&p, r.extent_bytes);
  PutU64(&p, r.checksum);
  PutU8(&p, static_cast<uint8_t>(r.checksum_kind));
  PutU64(&p, r.generation);
  return p;
}

std::string DeletePayload(const ExtentRecord& r) {
  std::string p;
  PutU8(&p, kDelete);
  PutString(&p, ShardKeyToString(r.key));
  PutU64(&p, r.generation);
  return p;
}

// The owner field was added after format 1 shipped: a COMMIT without it (an
// older journal, or a snapshot) closes changes of any owner.
std::string CommitPayload(uint64_t seq, uint64_t max_generation,
                          uint64_t owner = ManifestJournal::kAllOwners) {
  std::string p;
  PutU8(&p, kCommit);
  PutU64(&p, seq);
  PutU64(&p, max_generation);
  if (owner != ManifestJournal::kAllOwners) PutU64(&p, owner);
  return p;
}

// Parses the framed record at `pos`; false if it is not intact.
bool ParseFrame(absl::string_view file, size_t pos, absl::string_view* payload, size_t* next) {
  if (file.size() - pos < kFrameBytes) return false;
  uint32_t magic, len;
  uint64_t hash;
  std::memcpy(&magic, file.data() + pos, 4);
  std::memcpy(&len, file.data() + pos + 4, 4);
  std::memcpy(&hash, file.data() + pos + 8, 8);
  if (magic != kMagic || len == 0 || len > kMaxPayload || file.size() - pos - kFrameBytes < len) return false;
  absl::string_view p = file.substr(pos + kFrameBytes, len);
  if (XXH3_64bits(p.data(), p.size()) != hash) return false;
  *payload = p;
  *next = pos + kFrameBytes + len;
  return true;
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("appending to manifest ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncDirOf(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/'));
  if (dir.empty()) dir = ".";
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening directory ", dir));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("fsync of directory ", dir));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(int fd, const std::string& path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat of manifest ", path));
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = pread(fd, data.data() + done, data.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("reading manifest ", path));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

absl::Status Corrupt(const std::string& path, size_t pos, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      "manifest ", path, " is corrupt at offset ", pos, " (", what,
      ") with intact records after it; the shards it lists cannot be trusted. Restore the store "
      "from a checkpoint or remove its files to start empty"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ManifestJournal>> ManifestJournal::Open(
    const std::string& path, const std::vector<std::string>& data_paths, ManifestState* state,
    std::vector<std::string>* warnings) {
  *state = ManifestState{};
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening manifest ", path));
  std::unique_ptr<ManifestJournal> j(new ManifestJournal(path, data_paths, fd, 0));
  STRATA_ASSIGN_OR_RETURN(std::string file, ReadWholeFile(fd, path));

  if (file.empty()) {
    // New store (or a crash before the header reached the disk).
    std::string out;
    AppendFramed(&out, HeaderPayload(data_paths));
    AppendFramed(&out, CommitPayload(0, 0));
    STRATA_RETURN_IF_ERROR(WriteAll(fd, out, path));
    if (fdatasync(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync of manifest ", path));
    STRATA_RETURN_IF_ERROR(FsyncDirOf(path));
    j->size_bytes_ = out.size();
    return j;
  }

  size_t pos = 0;
  size_t last_commit_end = 0;
  bool have_header = false;
  std::vector<ManifestChange> staged;
  absl::string_view view(file);
  while (pos < view.size()) {
    absl::string_view payload;
    size_t next;
    if (!ParseFrame(view, pos, &payload, &next)) break;
    Reader r(payload);
    uint8_t type = 0;
    r.U8(&type);
    bool ok = true;
    if (type == kHeader) {
      uint32_t version = 0, n = 0;
      ok = r.U32(&version) && r.U32(&n);
      if (ok && version != kFormatVersion) {
        return absl::FailedPreconditionError(absl::StrCat(
            "manifest ", path, " has format version ", version, "; this build reads version ",
            kFormatVersion));
      }
      std::vector<std::string> recorded;
      for (uint32_t i = 0; ok && i < n; ++i) {
        std::string p;
        ok = r.String(&p);
        recorded.push_back(std::move(p));
      }
      if (ok && recorded != data_paths) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the extent store at ", path, " was created with data paths [",
            absl::StrJoin(recorded, ", "), "] but was opened with [", absl::StrJoin(data_paths, ", "),
            "]; pass the same paths in the same order"));
      }
      have_header = ok;
    } else if (type == kPut) {
      ManifestChange c;
      std::string key;
      uint8_t kind = 0;
      ok = r.String(&key) && r.U32(&c.record.file_index) && r.U64(&c.record.offset_bytes) &&
           r.U64(&c.record.size_bytes) && r.U64(&c.record.extent_bytes) &&
           r.U64(&c.record.checksum) && r.U8(&kind) && r.U64(&c.record.generation);
      if (ok) {
        absl::StatusOr<ShardKey> k = ParseShardKey(key);
        ok = k.ok() && kind <= 1;
        if (ok) c.record.key = *k;
        c.record.checksum_kind = static_cast<ChecksumKind>(kind);
      }
      staged.push_back(std::move(c));
    } else if (type == kDelete) {
      ManifestChange c;
      c.is_delete = true;
      std::string key;
      ok = r.String(&key) && r.U64(&c.record.generation);
      if (ok) {
        absl::StatusOr<ShardKey> k = ParseShardKey(key);
        ok = k.ok();
        if (ok) c.record.key = *k;
      }
      staged.push_back(std::move(c));
    } else if (type == kCommit) {
      uint64_t seq = 0, max_gen = 0, owner = kAllOwners;
      ok = r.U64(&seq) && r.U64(&max_gen);
      if (ok && !r.done()) ok = r.U64(&owner);
      if (ok && owner != kAllOwners) {
        for (const ManifestChange& c : staged) {
          if (c.record.key.job.value() != owner) {
            return Corrupt(path, pos, absl::StrCat("the commit of owner ", owner, " closes a change of shard ",
                                                   ShardKeyToString(c.record.key)));
          }
        }
      }
      if (ok) {
        for (ManifestChange& c : staged) {
          if (c.is_delete) {
            state->extents.erase(c.record.key);
          } else {
            state->extents[c.record.key] = c.record;
          }
        }
        staged.clear();
        state->commit_seq = seq;
        state->max_generation = std::max(state->max_generation, max_gen);
        last_commit_end = next;
      }
    } else {
      ok = false;
    }
    if (!ok || !r.done()) return Corrupt(path, pos, "a record with an intact frame does not parse");
    if (!have_header) return Corrupt(path, 0, "no header record: not a strata manifest");
    pos = next;
  }
  if (!have_header) {
    return absl::DataLossError(absl::StrCat("manifest ", path,
                                            " does not start with a strata header; it is not a "
                                            "strata manifest or its first record is damaged"));
  }
  // Anything after the last intact COMMIT was an interrupted commit -- unless
  // an intact record follows a damaged one, which no crash produces.
  if (pos < view.size()) {
    for (size_t p = pos + 1; p + kFrameBytes <= view.size(); ++p) {
      absl::string_view payload;
      size_t next;
      if (ParseFrame(view, p, &payload, &next)) return Corrupt(path, pos, "damaged record");
    }
  }
  if (last_commit_end < view.size()) {
    warnings->push_back(absl::StrCat("manifest ", path, ": discarded ", view.size() - last_commit_end,
                                     " bytes after the last complete commit (an interrupted commit)"));
    if (ftruncate(fd, static_cast<off_t>(last_commit_end)) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("truncating manifest ", path));
    }
    if (fdatasync(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync of manifest ", path));
  }
  j->size_bytes_ = last_commit_end;
  if (lseek(fd, static_cast<off_t>(last_commit_end), SEEK_SET) < 0) {
    return ErrnoToStatus(errno, absl::StrCat("seeking in manifest ", path));
  }
  return j;
}

ManifestJournal::~ManifestJournal() {
  if (fd_ >= 0) close(fd_);
}

absl::Status ManifestJournal::AppendCommit(absl::Span<const ManifestChange> changes,
                                           uint64_t commit_seq, uint64_t max_generation, bool sync,
                                           uint64_t owner) {
  std::string out;
  for (const ManifestChange& c : changes) {
    AppendFramed(&out, c.is_delete ? DeletePayload(c.record) : PutPayload(c.record));
  }
  AppendFramed(&out, CommitPayload(commit_seq, max_generation, owner));
  // pwrite at our own end offset: a failed earlier append may have left
  // garbage, which this overwrites.
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = pwrite(fd_, out.data() + done, out.size() - done,
                       static_cast<off_t>(size_bytes_ + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("appending a commit to manifest ", path_));
    }
    done += static_cast<size_t>(n);
  }
  if (sync && fdatasync(fd_) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fdatasync of manifest ", path_));
  }
  size_bytes_ += out.size();
  return absl::OkStatus();
}

absl::Status ManifestJournal::Sync() {
  if (fdatasync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync of manifest ", path_));
  return absl::OkStatus();
}

absl::Status ManifestJournal::Rewrite(const ManifestState& state) {
  std::string out;
  AppendFramed(&out, HeaderPayload(data_paths_));
  for (const auto& [key, record] : state.extents) AppendFramed(&out, PutPayload(record));
  AppendFramed(&out, CommitPayload(state.commit_seq, state.max_generation));
  std::string tmp = path_ + ".tmp";
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", tmp));
  absl::Status s = WriteAll(fd, out, tmp);
  if (s.ok() && fdatasync(fd) != 0) s = ErrnoToStatus(errno, absl::StrCat("fdatasync of ", tmp));
  if (s.ok() && rename(tmp.c_str(), path_.c_str()) != 0) {
    s = ErrnoToStatus(errno, absl::StrCat("renaming ", tmp, " over ", path_));
  }
  if (!s.ok()) {
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  STRATA_RETURN_IF_ERROR(FsyncDirOf(path_));
  close(fd_);
  fd_ = fd;
  size_bytes_ = out.size();
  return absl::OkStatus();
}

}  // namespace strata
