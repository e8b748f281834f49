// libFuzzer target: the two files through which a job comes back from disk,
// both JSON job records (daemon/job_record.h):
//   * the NVMe record of a ZeRO-Infinity job, read at startup by RecoverJobs
//     and rebuilt by Job::Restore;
//   * a checkpoint's manifest.json, read by LoadCheckpoint (Job::LoadFrom).
// Each input is tried as both, against real services: a CPU optimizer, a
// psync extent store and a pinned budget in a private temporary directory,
// and, for a manifest that lists its shard files (`files`, `streams`,
// `param_bytes`), those files at the sizes it gives (at most 1 MiB each), so
// LoadFrom's layout checks and its reads by the files' own tiling are reached,
// with the request caps a daemon would have. Every input must end in a job or
// an error, never a crash, a hang or a sanitizer report; and a record that
// parses must survive Serialize -> Parse unchanged (the daemon writes what it
// reads back).
//   build-hardening/daemon/fuzz/job_record_fuzz daemon/fuzz/corpus/job_record
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/job.h"
#include "daemon/job_record.h"
#include "daemon/job_settings.h"
#include "daemon/pinned_budget.h"
#include "daemon/request_limits.h"
#include "nlohmann/json.hpp"
#include "optimizer_cpu/cpu_optimizer.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"

namespace strata {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "job_record_fuzz: %s\n", what.c_str());
  std::abort();
}

// Services shared by every input (what a daemon builds once at startup).
struct World {
  std::string dir;
  std::unique_ptr<CpuOptimizer> optimizer;
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<ExtentStore> nvme;
  std::unique_ptr<PinnedBudget> pinned;
  RequestLimits limits;
  int checkpoint_fd = -1;  // the checkpoint directory the manifest is written into

  JobServices services() {
    JobServices s;
    s.optimizer = optimizer.get();
    s.nvme = nvme.get();
    s.io_tile_bytes = 1 << 20;
    s.limits = &limits;
    s.pinned = pinned.get();
    return s;
  }
};

World* MakeWorld() {
  auto* w = new World;
  char dir[] = "/tmp/strata-record-fuzz-XXXXXX";
  if (mkdtemp(dir) == nullptr) Fail("mkdtemp");
  w->dir = dir;
  // The directory (NVMe files of tens of MiB) goes when the run ends; a
  // crash leaves it for the post-mortem.
  static std::string* removed_at_exit = new std::string(w->dir);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(*removed_at_exit, ec);
  });
  std::filesystem::create_directories(w->dir + "/nvme");
  std::filesystem::create_directories(w->dir + "/ckpt");
  CpuOptimizerOptions opt;
  opt.num_threads = 1;
  auto optimizer = CpuOptimizer::Create(opt);
  if (!optimizer.ok()) Fail(optimizer.status().ToString());
  w->optimizer = std::move(*optimizer);
  IoEngineOptions io;
  io.queue_depth = 8;
  io.block_size_bytes = 1 << 20;
  auto engine = NewPsyncEngine(io);
  if (!engine.ok()) Fail(engine.status().ToString());
  w->engine = std::move(*engine);
  ExtentStoreOptions store;
  store.paths = {w->dir + "/nvme"};
  store.capacity_bytes_per_path = 64 << 20;
  store.allow_buffered_fallback = true;
  store.sync_policy = SyncPolicy::kNever;
  auto nvme = ExtentStore::Open(store, w->engine.get());
  if (!nvme.ok()) Fail(nvme.status().ToString());
  w->nvme = std::move(*nvme);
  w->pinned = std::make_unique<PinnedBudget>(64 << 20);
  // Caps small enough that a record cannot make the fuzzer allocate
  // gigabytes (a daemon's operator sets them the same way).
  w->limits.max_jobs_per_uid = 4;
  w->limits.max_tensors_per_job = 256;
  w->limits.max_tensor_elements = 1 << 16;
  w->limits.max_job_elements = 1 << 18;
  w->limits.max_region_bytes = 16 << 20;
  w->limits.max_world_size = 8;
  w->checkpoint_fd = open((w->dir + "/ckpt").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (w->checkpoint_fd < 0) Fail("open ckpt");
  return w;
}

void CheckRoundTrip(const JobRecord& record, const std::string& format) {
  const std::string once = SerializeJobRecord(record, format);
  auto again = ParseJobRecord(once, "the re-serialized record", format);
  if (!again.ok()) Fail("a serialized record does not parse: " + again.status().ToString() + "\n" + once);
  const std::string twice = SerializeJobRecord(*again, format);
  if (twice != once) Fail("Serialize(Parse(Serialize(r))) differs:\n" + once + "\n---\n" + twice);
}

// A job that came back is removed again (and its NVMe record with it), so
// the shared extent store does not fill across inputs.
void Discard(std::unique_ptr<Job> job) {
  job->Stop();
  (void)job->Retire();
}

// The shard files a fuzzed manifest lists, each of the size its layout gives
// (capped), filled with a pattern; the previous input's files are removed
// first. Entries that are not plain numbers are skipped (LoadFrom refuses them).
void WriteListedFiles(const World& w, const std::string& text) {
  const std::string dir = w.dir + "/ckpt";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename() != "manifest.json") std::filesystem::remove(entry.path());
  }
  const nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object() || !m.contains("files") || !m["files"].is_array()) return;
  uint64_t streams = 3, param_bytes = 4;
  if (m.contains("streams") && m["streams"].is_array()) streams = m["streams"].size();
  if (m.contains("param_bytes") && m["param_bytes"].is_number_unsigned()) param_bytes = m["param_bytes"].get<uint64_t>();
  constexpr uint64_t kMaxFileBytes = 1 << 20;
  std::vector<char> pattern(kMaxFileBytes);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>(i * 131 + 7);
  int written = 0;
  for (const nlohmann::json& e : m["files"]) {
    if (++written > 64) break;
    if (!e.is_object()) continue;
    auto number = [&](const char* key) -> std::optional<uint64_t> {
      if (!e.contains(key) || !e[key].is_number_unsigned()) return std::nullopt;
      return e[key].get<uint64_t>();
    };
    const auto rank = number("rank"), index = number("index"), padded = number("padded_numel");
    if (!rank || !index || !padded || *rank > 64 || *index > 4096 || *padded > kMaxFileBytes) continue;
    const uint64_t bytes = std::min<uint64_t>(*padded * (streams * 4 + std::min<uint64_t>(param_bytes, 8)), kMaxFileBytes);
    const std::string path = dir + "/rank" + std::to_string(*rank) + "-shard" + std::to_string(*index) + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) Fail("cannot write " + path);
    if (bytes > 0 && std::fwrite(pattern.data(), 1, bytes, f) != bytes) Fail("short write of " + path);
    std::fclose(f);
  }
}

}  // namespace
}  // namespace strata

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  static World* world = MakeWorld();
  const std::string text(reinterpret_cast<const char*>(data), size);

  // The parser alone, as both kinds of file.
  for (const std::string format : {"", "strata-checkpoint-v1"}) {
    auto record = ParseJobRecord(text, "the fuzzed record", format);
    if (!record.ok()) {
      if (record.status().code() != absl::StatusCode::kDataLoss) Fail(record.status().ToString());
      continue;
    }
    CheckRoundTrip(*record, format);
    (void)ResolveJobSettings(record->settings);
  }

  // The NVMe record of an Infinity job, as RecoverJobs hands it over.
  auto restored = Job::Restore(/*id=*/7, text, world->services());
  if (restored.ok()) Discard(std::move(*restored));

  // The manifest of a checkpoint, as LoadCheckpoint reads it.
  const std::string manifest = world->dir + "/ckpt/manifest.json";
  FILE* f = std::fopen(manifest.c_str(), "wb");
  if (f == nullptr) Fail("cannot write " + manifest);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) Fail("short write of " + manifest);
  std::fclose(f);
  WriteListedFiles(*world, text);
  auto loaded = Job::LoadFrom(
      /*id=*/8, world->checkpoint_fd, "fuzz-ckpt", "", /*new_owner=*/1000,
      [](std::optional<uint32_t>) { return absl::OkStatus(); }, world->services());
  if (loaded.ok()) Discard(std::move(*loaded));
  return 0;
}
