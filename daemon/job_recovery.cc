#include "daemon/job_recovery.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/job_record.h"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"

namespace strata {
namespace {

constexpr int kRecordReadAttempts = 3;

struct FoundRecord {
  uint64_t id = 0;
  uint64_t generation = 0;
  std::string text;
  std::string name;
};

}  // namespace

absl::Status RecoverJobs(ExtentStore* store, const JobServices& services, JobRegistry* registry,
                         std::vector<std::string>* log) {
  std::map<uint64_t, uint64_t> shards_of;  // job id -> shard count
  std::vector<FoundRecord> records;
  std::set<uint64_t> unreadable;  // records kept on NVMe for the operator
  for (const ShardKey& key : store->Keys()) {
    const uint64_t id = key.job.value();
    registry->ReserveJobId(id);  // ids are random: never hand out one found on NVMe
    ++shards_of[id];
    if (!Job::IsRecordKey(key)) continue;
    absl::StatusOr<uint64_t> size = store->SizeOf(key);
    absl::StatusOr<uint64_t> generation = store->GenerationOf(key);
    if (!size.ok()) return size.status();
    if (!generation.ok()) return generation.status();
    absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(std::max<uint64_t>(*size, 1), store->alignment());
    if (!buffer.ok()) return buffer.status();
    // A read can fail once and work the next time (one bad request, a
    // transient EIO): a few tries before the job is given up for this run --
    // given up, its name is free and a new job of that name would replace it
    // at the next start.
    absl::StatusOr<uint64_t> got = store->Read(key, buffer->span());
    for (int attempt = 2; !got.ok() && !absl::IsNotFound(got.status()) && attempt <= kRecordReadAttempts; ++attempt) {
      log->push_back(absl::StrCat("nvme: reading the record of job ", id, " failed (", got.status().message(),
                                  "); try ", attempt, " of ", kRecordReadAttempts));
      got = store->Read(key, buffer->span());
    }
    if (!got.ok()) {
      log->push_back(absl::StrCat("nvme: the record of job ", id, " is unreadable (", got.status().message(),
                                  "); job skipped, its shards kept"));
      unreadable.insert(id);
      continue;
    }
    FoundRecord r{id, *generation, std::string(reinterpret_cast<const char*>(buffer->data()), *got), ""};
    absl::StatusOr<JobRecord> parsed = ParseJobRecord(r.text, absl::StrCat("the NVMe record of job ", id));
    if (!parsed.ok()) {
      log->push_back(absl::StrCat("nvme: job ", id, " not restored: ", parsed.status().message(),
                                  "; its shards are kept"));
      unreadable.insert(id);
      continue;
    }
    r.name = parsed->settings.name;
    records.push_back(std::move(r));
  }

  // One job per name: the newest record wins.
  std::map<std::string, const FoundRecord*> newest;
  for (const FoundRecord& r : records) {
    auto [it, inserted] = newest.emplace(r.name, &r);
    if (!inserted && r.generation > it->second->generation) it->second = &r;
  }
  std::set<uint64_t> keep(unreadable);
  for (const auto& [name, r] : newest) keep.insert(r->id);
  for (const FoundRecord& r : records) {
    if (keep.contains(r.id)) continue;
    const FoundRecord* winner = newest[r.name];
    log->push_back(absl::StrCat("nvme: job '", r.name, "' (id ", r.id, ", generation ", r.generation,
                                ") is an older record of the same name as id ", winner->id, " (generation ",
                                winner->generation, "); its ", shards_of[r.id], " shards are freed"));
  }
  for (const auto& [id, count] : shards_of) {
    if (keep.contains(id)) continue;
    bool has_record = false;
    for (const FoundRecord& r : records) has_record = has_record || r.id == id;
    if (!has_record) {
      log->push_back(absl::StrCat("nvme: ", count, " shards of job id ", id,
                                  " have no job record (a job that never committed); freed"));
    }
    if (absl::Status s = store->DeleteOwner(id); !s.ok()) return s;
  }
  for (const auto& [name, r] : newest) {
    absl::StatusOr<std::unique_ptr<Job>> job = Job::Restore(r->id, r->text, services);
    if (!job.ok()) {
      log->push_back(absl::StrCat("nvme: job ", r->id, " not restored: ", job.status().message(),
                                  "; its shards are kept"));
      continue;
    }
    const uint64_t step = (*job)->next_step();
    if (absl::Status s = registry->AddJob(std::move(*job)); !s.ok()) return s;
    log->push_back(absl::StrCat("nvme: restored job '", name, "' (id ", r->id, ") at step ", step));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Job>> RestoreCommittedJob(ExtentStore* store, uint64_t id,
                                                         const JobServices& services) {
  const ShardKey key = Job::RecordKey(id);
  absl::StatusOr<uint64_t> size = store->SizeOf(key);
  if (!size.ok()) return size.status();
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(std::max<uint64_t>(*size, 1), store->alignment());
  if (!buffer.ok()) return buffer.status();
  absl::StatusOr<uint64_t> got = store->Read(key, buffer->span());
  if (!got.ok()) return got.status();
  return Job::Restore(id, std::string(reinterpret_cast<const char*>(buffer->data()), *got), services);
}

}  // namespace strata
