// The device tier against a real stratad (issue 10 item 3): --device and
// --device_capacity are live, device budgets are admitted against the
// capacity and come back when a job goes, the emulated arena is handed to a
// job's trainer once per session (read-only), and the new RPCs (Acquire's
// tier, ParkJob, ResumeJob) refuse what an attacker would try. Raw gRPC stubs
// send what the client library never would.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "strata/v1/strata.grpc.pb.h"
#include "tests/daemon_fixture.h"
#include "tests/infinity_job.h"

namespace strata {
namespace {

namespace v1 = strata::v1;

class Raw {
 public:
  explicit Raw(const std::string& socket)
      : stub_(v1::Strata::NewStub(
            grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()))) {}

  template <typename Req, typename Resp, typename Method>
  grpc::Status Call(Method method, const Req& request, Resp* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ((*stub_).*method)(&context, request, response);
  }
  grpc::Status Park(const std::string& job, int tier, v1::ParkJobResponse* out = nullptr) {
    v1::ParkJobRequest r;
    r.set_job(job);
    r.set_tier(static_cast<v1::Tier>(tier));
    v1::ParkJobResponse ignored;
    return Call(&v1::Strata::Stub::ParkJob, r, out != nullptr ? out : &ignored);
  }
  grpc::Status Resume(const std::string& job) {
    v1::ResumeJobRequest r;
    r.set_job(job);
    v1::ResumeJobResponse out;
    return Call(&v1::Strata::Stub::ResumeJob, r, &out);
  }
  uint64_t Attach(const std::string& job, uint32_t rank) {
    v1::AttachRankRequest r;
    r.set_job(job);
    r.set_rank(rank);
    v1::AttachRankResponse out;
    grpc::Status s = Call(&v1::Strata::Stub::AttachRank, r, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out.session_id();
  }
  grpc::Status Acquire(uint64_t session, std::vector<uint32_t> indices, int tier) {
    v1::AcquireRequest r;
    r.set_session_id(session);
    for (uint32_t i : indices) r.add_indices(i);
    r.set_tier(static_cast<v1::Tier>(tier));
    v1::AcquireResponse out;
    return Call(&v1::Strata::Stub::Acquire, r, &out);
  }

 private:
  std::unique_ptr<v1::Strata::Stub> stub_;
};

// The metrics endpoint's text (GET /metrics on loopback).
std::string Metrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return body;
}

JobSpec DeviceSpec(const std::string& name, uint64_t device_budget) {
  JobSpec spec = SmallInfinitySpec(name);
  spec.device_budget_bytes = device_budget;
  return spec;
}

uint64_t DeviceCapacity(StrataClient& client, uint64_t* used = nullptr) {
  auto tiers = client.Tiers();
  EXPECT_TRUE(tiers.ok()) << tiers.status();
  if (!tiers.ok()) return 0;
  for (const TierUsage& t : *tiers) {
    if (t.tier == "device") {
      if (used != nullptr) *used = t.used_bytes;
      return t.capacity_bytes;
    }
  }
  return 0;
}

TEST(DaemonDeviceTest, ADeviceBudgetWithoutADeviceTierNamesTheFlag) {
  CleanDaemon daemon(MakeTestDir("device", "none"));
  ASSERT_TRUE(daemon.Start({"--device", "none"}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<uint64_t> job = client->CreateJob(DeviceSpec("wants-device", 64 << 10));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition) << job.status();
  EXPECT_NE(job.status().message().find("--device"), std::string::npos) << job.status();
  // No device tier is reported, and a job without a budget still runs.
  EXPECT_EQ(DeviceCapacity(*client), 0u);
  EXPECT_TRUE(client->CreateJob(DeviceSpec("no-device", 0)).ok());
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonDeviceTest, BadDeviceSettingsStopTheDaemonAtStartup) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--device", "tpu"}, {"--device_capacity", "0"}, {"--device_capacity", "1000"},
        {"--device_capacity", "-5"}, {"--device_capacity", "99999PiB"}}) {
    CleanDaemon daemon(MakeTestDir("device", "badflags"));
    EXPECT_FALSE(daemon.Start(flags)) << flags[0] << " " << flags[1];
  }
}

TEST(DaemonDeviceTest, DeviceBudgetsAreAdmittedAgainstTheCapacityAndComeBack) {
  CleanDaemon daemon(MakeTestDir("device", "budgets"));
  const int port = 20000 + (getpid() + 7919) % 20000;
  ASSERT_TRUE(daemon.Start({"--device_capacity", "256KiB", "--metrics_port", std::to_string(port)}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(DeviceCapacity(*client), 256u << 10);
  ASSERT_TRUE(client->CreateJob(DeviceSpec("a", 192 << 10)).ok());
  // 128 KiB does not fit beside a's 192: the error names the numbers.
  absl::StatusOr<uint64_t> b = client->CreateJob(DeviceSpec("b", 128 << 10));
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  for (const char* number : {"131072 bytes", "65536 bytes", "262144 bytes"}) {
    EXPECT_NE(b.status().message().find(number), std::string::npos) << number << ": " << b.status();
  }
  // Hostile sizes: the largest budget, and ones that would wrap a sum.
  for (uint64_t huge : {std::numeric_limits<uint64_t>::max(), std::numeric_limits<uint64_t>::max() - (64 << 10) + 1,
                        uint64_t{1} << 63}) {
    absl::StatusOr<uint64_t> h = client->CreateJob(DeviceSpec("huge", huge));
    EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted) << huge << ": " << h.status();
  }
  // What is left fits exactly; then nothing more.
  ASSERT_TRUE(client->CreateJob(DeviceSpec("c", 64 << 10)).ok());
  EXPECT_EQ(client->CreateJob(DeviceSpec("d", 1)).status().code(), absl::StatusCode::kResourceExhausted);
  // A deleted job's budget comes back.
  ASSERT_TRUE(client->DeleteJob("a").ok());
  EXPECT_TRUE(client->CreateJob(DeviceSpec("b", 128 << 10)).ok());
  auto stats = client->StatsText();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("device       used 0 of 262144 bytes"), std::string::npos) << *stats;
  EXPECT_NE(stats->find("device   0 of 131072 B  hits 0  misses 0"), std::string::npos) << *stats;
  const std::string metrics = Metrics(port);
  for (const char* line : {"strata_tier_capacity_bytes{tier=\"device\"} 262144\n",
                           "strata_tier_used_bytes{tier=\"device\"} 0\n",
                           "strata_tier_free_bytes{tier=\"device\"} 262144\n",
                           "strata_device_budgets_bytes 196608\n",  // b's 128 KiB + c's 64 KiB
                           "strata_job_device_budget_bytes{job=\"b\"} 131072\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << metrics;
  }
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonDeviceTest, TheEmulatedArenaIsMappedOnceReadOnlyAndOnlyByJobsWithABudget) {
  CleanDaemon daemon(MakeTestDir("device", "arena"));
  ASSERT_TRUE(daemon.Start({"--device_capacity", "256KiB"}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateJob(DeviceSpec("with", 96 << 10)).ok());
  ASSERT_TRUE(client->CreateJob(DeviceSpec("without", 0)).ok());
  const std::vector<TensorDesc> tensors = {{"w", 4096}, {"b", 64}};

  auto with = client->Attach("with", 0);
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_TRUE((*with)->RegisterTensors(tensors).ok());
  const DeviceArenaView& arena = (*with)->device_arena();
  ASSERT_EQ(arena.kind, DeviceArenaView::Kind::kMemfd) << (*with)->device_error();
  // The job's own arena (exactly its budget: no fragmentation headroom, the
  // store evicts for contiguity instead), not the daemon's capacity.
  EXPECT_EQ(arena.bytes, 96u << 10);
  ASSERT_NE(arena.host, nullptr);
  // Read-only: the descriptor itself is, so even mprotect cannot make the
  // mapping writable (a trainer cannot write shards behind the daemon).
  EXPECT_NE(mprotect(const_cast<std::byte*>(arena.host), arena.bytes, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(errno, EACCES);
  // A place outside the arena is refused, not read.
  ShardPlace outside{0, TierKind::kDevice, arena.bytes - 8, 16};
  EXPECT_EQ((*with)->PlacedBytes(outside).status().code(), absl::StatusCode::kOutOfRange);
  ShardPlace wrap{0, TierKind::kDevice, std::numeric_limits<uint64_t>::max() - 4, 16};
  EXPECT_EQ((*with)->PlacedBytes(wrap).status().code(), absl::StatusCode::kOutOfRange);

  auto without = client->Attach("without", 0);
  ASSERT_TRUE(without.ok()) << without.status();
  ASSERT_TRUE((*without)->RegisterTensors(tensors).ok());
  EXPECT_EQ((*without)->device_arena().kind, DeviceArenaView::Kind::kNone);
  // Acquire into the device tier needs a device budget; nvme is not a place
  // to read from; the window works as before and says where.
  absl::StatusOr<std::vector<ShardPlace>> device = (*without)->Acquire({0}, TierKind::kDevice);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
  EXPECT_NE(device.status().message().find("no device budget"), std::string::npos) << device.status();
  EXPECT_EQ((*without)->Acquire({0}, TierKind::kNvme).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

// A one-rank Infinity job with a device budget whose params are
// `base + tensor * 8192 + element` (exact in fp32), initialized and its two
// shards acquired into the device tier.
struct DeviceJob {
  std::unique_ptr<RankSession> rank;
  std::vector<ShardPlace> places;
};

const std::vector<TensorDesc>& ArenaTensors() {
  static const std::vector<TensorDesc> tensors = {{"w", 4096}, {"b", 64}};
  return tensors;
}

void StartDeviceJob(StrataClient& client, const std::string& name, uint64_t budget, float base, DeviceJob* out) {
  JobSpec spec = DeviceSpec(name, budget);
  spec.world_size = 1;
  ASSERT_TRUE(client.CreateJob(spec).ok()) << name;
  auto rank = client.Attach(name, 0);
  ASSERT_TRUE(rank.ok()) << rank.status();
  out->rank = std::move(*rank);
  ASSERT_TRUE(out->rank->RegisterTensors(ArenaTensors()).ok());
  for (ShardView& shard : out->rank->shards()) {
    FillOwned(shard, shard.param, [base](uint64_t t, uint64_t e) { return base + static_cast<float>(t * 8192 + e); });
  }
  ASSERT_TRUE(out->rank->InitParams().ok());
  std::vector<uint32_t> all;
  for (uint32_t i = 0; i < out->rank->shards().size(); ++i) all.push_back(i);
  auto places = out->rank->Acquire(all, TierKind::kDevice);
  ASSERT_TRUE(places.ok()) << places.status();
  out->places = *places;
}

// How many fp32 words of `bytes` hold a param of the job whose values start
// at `base` (values base .. base + 2 * 8192).
uint64_t WordsOf(absl::Span<const std::byte> bytes, float base) {
  uint64_t n = 0;
  for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
    float f;
    std::memcpy(&f, bytes.data() + i, sizeof(f));
    n += (f >= base && f < base + 2 * 8192) ? 1 : 0;
  }
  return n;
}

TEST(DaemonDeviceTest, EachTrainerMapsOnlyItsOwnJobsArena) {
  CleanDaemon daemon(MakeTestDir("device", "isolation"));
  ASSERT_TRUE(daemon.Start({"--device_capacity", "256KiB"}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  constexpr float kAlpha = 1'000'000.0f;
  constexpr float kBeta = 2'000'000.0f;
  DeviceJob alpha, beta;
  StartDeviceJob(*client, "alpha", 64 << 10, kAlpha, &alpha);
  StartDeviceJob(*client, "beta", 96 << 10, kBeta, &beta);
  if (HasFatalFailure()) return;
  const DeviceArenaView& a = alpha.rank->device_arena();
  const DeviceArenaView& b = beta.rank->device_arena();
  ASSERT_EQ(a.kind, DeviceArenaView::Kind::kMemfd) << alpha.rank->device_error();
  ASSERT_EQ(b.kind, DeviceArenaView::Kind::kMemfd) << beta.rank->device_error();
  // Each arena is its own job's, exactly its budget (the store keeps what is
  // resident within it and evicts the job's own copies when it fragments).
  EXPECT_EQ(a.bytes, 64u << 10);
  EXPECT_EQ(b.bytes, 96u << 10);
  // Each job's shards are where the daemon said, in its own arena, bit for bit.
  for (DeviceJob* job : {&alpha, &beta}) {
    const float base = job == &alpha ? kAlpha : kBeta;
    for (const ShardPlace& place : job->places) {
      ASSERT_EQ(place.tier, TierKind::kDevice);
      auto bytes = job->rank->PlacedBytes(place);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      const ShardView& shard = job->rank->shards()[place.index];
      for (const OwnedRange& r : shard.ranges) {
        float f;
        std::memcpy(&f, bytes->data() + r.shard_offset * sizeof(float), sizeof(f));
        EXPECT_EQ(f, base + static_cast<float>(r.tensor.value() * 8192 + r.tensor_offset));
      }
    }
  }
  // The attacker's view: every byte a trainer can map holds its own job's
  // params or nothing -- never a word of the other job's.
  const absl::Span<const std::byte> a_all(a.host, a.bytes), b_all(b.host, b.bytes);
  EXPECT_GT(WordsOf(a_all, kAlpha), 4000u);
  EXPECT_GT(WordsOf(b_all, kBeta), 4000u);
  EXPECT_EQ(WordsOf(a_all, kBeta), 0u);
  EXPECT_EQ(WordsOf(b_all, kAlpha), 0u);
  // Raw AttachRank: the share names the caller's job's arena only.
  Raw raw(daemon.socket());
  v1::AttachRankRequest request;
  request.set_job("beta");
  request.set_rank(0);
  v1::AttachRankResponse response;
  ASSERT_TRUE(raw.Call(&v1::Strata::Stub::AttachRank, request, &response).ok());
  EXPECT_EQ(response.device().kind(), "memfd");
  EXPECT_EQ(response.device().bytes(), 96u << 10);

  // A deleted job's arena is freed and its budget comes back: 256 - 96 KiB
  // fits only once alpha's 64 KiB is returned.
  JobSpec big = DeviceSpec("gamma", 160 << 10);
  big.world_size = 1;
  EXPECT_EQ(client->CreateJob(big).status().code(), absl::StatusCode::kResourceExhausted);
  alpha.rank.reset();
  ASSERT_TRUE(client->DeleteJob("alpha").ok());
  auto gamma = client->CreateJob(big);
  EXPECT_TRUE(gamma.ok()) << gamma.status();
  EXPECT_TRUE(daemon.running());
  beta.rank.reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonDeviceTest, ARestartedJobGetsAFreshArenaFilledFromNvme) {
  CleanDaemon daemon(MakeTestDir("device", "restart"));
  ASSERT_TRUE(daemon.Start({"--device_capacity", "256KiB"}));
  constexpr float kBase = 3'000'000.0f;
  {
    auto client = daemon.Connect();
    ASSERT_NE(client, nullptr);
    DeviceJob job;
    StartDeviceJob(*client, "phoenix", 64 << 10, kBase, &job);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(job.rank->Release({0, 1}).ok());
  }
  ASSERT_EQ(daemon.Stop(), 0);
  ASSERT_TRUE(daemon.Start({"--device_capacity", "256KiB"}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto rank = client->Attach("phoenix", 0);
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE((*rank)->RegisterTensors(ArenaTensors()).ok());
  const DeviceArenaView& arena = (*rank)->device_arena();
  ASSERT_EQ(arena.kind, DeviceArenaView::Kind::kMemfd) << (*rank)->device_error();
  EXPECT_EQ(arena.bytes, 64u << 10);  // exactly its budget
  // Fresh: nothing of the old daemon's arena before anything is acquired.
  EXPECT_EQ(WordsOf(absl::Span<const std::byte>(arena.host, arena.bytes), kBase), 0u);
  auto places = (*rank)->Acquire({0, 1}, TierKind::kDevice);
  ASSERT_TRUE(places.ok()) << places.status();
  for (const ShardPlace& place : *places) {
    auto bytes = (*rank)->PlacedBytes(place);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    for (const OwnedRange& r : (*rank)->shards()[place.index].ranges) {
      float f;
      std::memcpy(&f, bytes->data() + r.shard_offset * sizeof(float), sizeof(f));
      EXPECT_EQ(f, kBase + static_cast<float>(r.tensor.value() * 8192 + r.tensor_offset));
    }
  }
  rank->reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

// The job's row of GetStats for `tier`, or null.
const v1::JobTierStats* TierRow(const v1::GetStatsResponse& stats, const std::string& job, const std::string& tier) {
  for (const v1::JobStats& j : stats.jobs()) {
    if (j.job().name() != job) continue;
    for (const v1::JobTierStats& t : j.tiers()) {
      if (t.tier() == tier) return &t;
    }
  }
  return nullptr;
}

// Issue 10 item 4: `strata stats` and the metrics show a job's device tier:
// what it holds there, and its device acquires' hits, misses, stall and
// prefetches -- the same numbers in GetStats, the text and the metrics.
TEST(DaemonDeviceTest, StatsAndMetricsShowEachJobsDeviceTier) {
  CleanDaemon daemon(MakeTestDir("device", "stats"));
  const int port = 20000 + (getpid() + 104729) % 20000;
  ASSERT_TRUE(daemon.Start({"--device_capacity", "256KiB", "--metrics_port", std::to_string(port)}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  // Eight 16 KiB shards (128 KiB of params) under a 64 KiB device budget.
  constexpr uint64_t kBudget = 64 << 10;
  std::vector<TensorDesc> tensors;
  for (int i = 0; i < 8; ++i) tensors.push_back({absl::StrCat("t", i), 4096});
  JobSpec spec = DeviceSpec("dev", kBudget);
  spec.world_size = 1;
  ASSERT_TRUE(client->CreateJob(spec).ok());
  JobSpec plain_spec = DeviceSpec("plain", 0);
  plain_spec.world_size = 1;
  ASSERT_TRUE(client->CreateJob(plain_spec).ok());
  auto rank = client->Attach("dev", 0);
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE((*rank)->RegisterTensors(tensors).ok());
  ASSERT_EQ((*rank)->shards().size(), tensors.size());
  for (ShardView& shard : (*rank)->shards()) {
    FillOwned(shard, shard.param, [](uint64_t t, uint64_t e) { return static_cast<float>(t * 8192 + e); });
  }
  ASSERT_TRUE((*rank)->InitParams().ok());
  auto plain = client->Attach("plain", 0);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE((*plain)->RegisterTensors(tensors).ok());
  // Two passes of a forward walk, one shard at a time, into the device.
  uint64_t device_acquires = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t i = 0; i < tensors.size(); ++i) {
      auto places = (*rank)->Acquire({i}, TierKind::kDevice);
      ASSERT_TRUE(places.ok()) << places.status();
      ++device_acquires;
      ASSERT_TRUE((*rank)->Release({i}).ok());
    }
    ASSERT_TRUE((*rank)->IterationBoundary().ok());
  }

  Raw raw(daemon.socket());
  v1::GetStatsResponse stats;
  ASSERT_TRUE(raw.Call(&v1::Strata::Stub::GetStats, v1::GetStatsRequest(), &stats).ok());
  const v1::JobTierStats* device = TierRow(stats, "dev", "device");
  ASSERT_NE(device, nullptr) << stats.DebugString();
  EXPECT_GT(device->bytes(), 0u);
  EXPECT_LE(device->bytes(), kBudget);
  EXPECT_EQ(device->budget_bytes(), kBudget);
  EXPECT_EQ(device->hits() + device->misses(), device_acquires);
  EXPECT_GT(device->misses(), 0u);
  EXPECT_GT(device->stall_s(), 0.0);
  EXPECT_LE(device->prefetches_unused(), device->prefetches());
  // The window row counts the window's acquires only: this job made none.
  const v1::JobTierStats* pinned = TierRow(stats, "dev", "pinned");
  ASSERT_NE(pinned, nullptr) << stats.DebugString();
  EXPECT_EQ(pinned->hits() + pinned->misses(), 0u) << stats.DebugString();
  // A job without a device budget has no device row.
  EXPECT_NE(TierRow(stats, "plain", "pinned"), nullptr) << stats.DebugString();
  EXPECT_EQ(TierRow(stats, "plain", "device"), nullptr) << stats.DebugString();

  // `strata stats` prints the same row.
  auto text = client->StatsText();
  ASSERT_TRUE(text.ok()) << text.status();
  std::printf("%s", text->c_str());
  const std::string device_line =
      absl::StrFormat("    device   %d of %d B  hits %d  misses %d  stall %.4f s  prefetches %d (%d unused)\n",
                      device->bytes(), kBudget, device->hits(), device->misses(), device->stall_s(),
                      device->prefetches(), device->prefetches_unused());
  const size_t dev_at = text->find("  dev ");
  const size_t plain_at = text->find("  plain ");
  ASSERT_NE(dev_at, std::string::npos) << *text;
  ASSERT_NE(plain_at, std::string::npos) << *text;
  const std::string dev_text = dev_at < plain_at ? text->substr(dev_at, plain_at - dev_at) : text->substr(dev_at);
  const std::string plain_text = dev_at < plain_at ? text->substr(plain_at) : text->substr(plain_at, dev_at - plain_at);
  EXPECT_NE(dev_text.find(device_line), std::string::npos) << device_line << *text;
  EXPECT_EQ(plain_text.find("device"), std::string::npos) << *text;

  // The metrics endpoint: the same numbers, labelled by job and tier.
  const std::string metrics = Metrics(port);
  const std::string dev = "{job=\"dev\",tier=\"device\"} ";
  for (const std::string& line :
       {absl::StrCat("strata_job_tier_bytes", dev, device->bytes(), "\n"),
        absl::StrCat("strata_job_tier_budget_bytes", dev, kBudget, "\n"),
        absl::StrCat("strata_job_tier_hits_total", dev, device->hits(), "\n"),
        absl::StrCat("strata_job_tier_misses_total", dev, device->misses(), "\n"),
        absl::StrCat("strata_job_tier_stall_seconds_total", dev, device->stall_s(), "\n"),
        absl::StrCat("strata_job_tier_prefetches_total", dev, device->prefetches(), "\n"),
        absl::StrCat("strata_job_tier_prefetches_unused_total", dev, device->prefetches_unused(), "\n"),
        absl::StrCat("strata_job_tier_hits_total{job=\"dev\",tier=\"pinned\"} 0\n"),
        absl::StrCat("strata_job_tier_bytes{job=\"plain\",tier=\"pinned\"} ")}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << metrics;
  }
  EXPECT_EQ(metrics.find("{job=\"plain\",tier=\"device\"}"), std::string::npos) << metrics;
  EXPECT_TRUE(daemon.running());
  rank->reset();
  plain->reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonDeviceTest, HostileTiersAndJobsAreRefusedNamingTheProblem) {
  CleanDaemon daemon(MakeTestDir("device", "hostile"));
  ASSERT_TRUE(daemon.Start({"--device_capacity", "256KiB"}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateJob(DeviceSpec("job", 96 << 10)).ok());
  auto rank = client->Attach("job", 0);
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE((*rank)->RegisterTensors({{"w", 4096}}).ok());
  Raw raw(daemon.socket());
  // Tier values outside the enum (proto3 carries any int32).
  const uint64_t session = raw.Attach("job", 1);
  ASSERT_NE(session, 0u);
  for (int tier : {-1, 4, 99, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()}) {
    grpc::Status a = raw.Acquire(session, {0}, tier);
    EXPECT_EQ(a.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << tier << ": " << a.error_message();
    EXPECT_NE(a.error_message().find("tier"), std::string::npos) << a.error_message();
    grpc::Status p = raw.Park("job", tier);
    EXPECT_EQ(p.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << tier << ": " << p.error_message();
    EXPECT_NE(p.error_message().find("tier"), std::string::npos) << p.error_message();
  }
  // An unknown (or another uid's) session is refused before anything is read.
  EXPECT_EQ(raw.Acquire(session + 1, {0}, v1::TIER_DEVICE).error_code(), grpc::StatusCode::NOT_FOUND);
  // A hostile index list: longer than any job's tensor count.
  std::vector<uint32_t> many(65537, 0);
  grpc::Status too_many = raw.Acquire(session, many, v1::TIER_DEVICE);
  EXPECT_EQ(too_many.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << too_many.error_message();
  // Park needs a tier below the device: none given, or the device itself.
  EXPECT_EQ(raw.Park("job", v1::TIER_UNSPECIFIED).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(raw.Park("job", v1::TIER_DEVICE).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Unknown jobs, and names no job can have.
  for (const std::string& name : {std::string("nope"), std::string(""), std::string("job\0x", 5)}) {
    EXPECT_EQ(raw.Park(name, v1::TIER_NVME).error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(raw.Resume(name).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // A name longer than any job's is refused before the lookup, naming the cap.
  const std::string long_name(1 << 16, 'x');
  grpc::Status p = raw.Park(long_name, v1::TIER_NVME);
  EXPECT_EQ(p.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(p.error_message().find("max_name_length"), std::string::npos) << p.error_message();
  EXPECT_EQ(raw.Resume(long_name).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
