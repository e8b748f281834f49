// One contract, three engines: every test here runs on UringEngine, AioEngine
// and PsyncEngine. An engine the kernel lacks is skipped with the reason.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "swap/aligned_buffer.h"
#include "swap/direct_io.h"
#include "swap/io_engine.h"
#include "swap/testing/fault_injector.h"
#include "swap/testing/test_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

struct UringKind {
  static constexpr IoEngineKind kKind = IoEngineKind::kUring;
};
struct AioKind {
  static constexpr IoEngineKind kKind = IoEngineKind::kAio;
};
struct PsyncKind {
  static constexpr IoEngineKind kKind = IoEngineKind::kPsync;
};

constexpr uint64_t kFileBytes = 16 << 20;

template <typename T>
class IoEngineConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TestDir> dir = TestDir::Create("io_engine_conformance");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<TestDir>(std::move(*dir));
    path_ = dir_->File("data");
    absl::StatusOr<OpenedFile> f = OpenForIo(path_, /*create=*/true, /*direct=*/true,
                                             /*allow_buffered_fallback=*/false);
    if (!f.ok() && absl::IsInvalidArgument(f.status())) {
      GTEST_SKIP() << "the test directory's file system refuses O_DIRECT: " << f.status();
    }
    ASSERT_TRUE(f.ok()) << f.status();
    fd_ = f->fd;
    ASSERT_EQ(ftruncate(fd_, kFileBytes), 0);
  }

  void TearDown() override {
    engine_.reset();
    if (fd_ >= 0) close(fd_);
  }

  // Builds the engine under test, or skips when this kernel lacks it.
  bool MakeEngine(IoEngineOptions options) {
    absl::StatusOr<std::unique_ptr<IoEngine>> e = NewIoEngine(T::kKind, options);
    if (absl::IsUnimplemented(e.status())) {
      skip_reason_ = e.status().ToString();
      return false;
    }
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return false;
    engine_ = std::move(*e);
    absl::StatusOr<IoFileId> id = engine_->RegisterFile(fd_, path_);
    EXPECT_TRUE(id.ok()) << id.status();
    file_ = *id;
    return true;
  }

  static IoEngineOptions SmallOptions() {
    IoEngineOptions o;
    o.queue_depth = 8;
    o.block_size_bytes = 64 << 10;
    return o;
  }

  AlignedBuffer Buffer(size_t bytes) {
    absl::StatusOr<AlignedBuffer> b = AlignedBuffer::Allocate(bytes, 4096);
    STRATA_TEST_CHECK(b.ok());
    return std::move(*b);
  }

  static void Fill(absl::Span<std::byte> s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i + 8 <= s.size(); i += 8) {
      uint64_t v = rng();
      std::memcpy(s.data() + i, &v, 8);
    }
  }

  // Submits everything and reaps until all completions are in.
  std::vector<IoCompletion> RunAll(const std::vector<IoRequest>& requests) {
    std::vector<IoCompletion> done;
    size_t submitted = 0;
    while (submitted < requests.size()) {
      absl::StatusOr<size_t> n = engine_->Submit(
          absl::MakeConstSpan(requests).subspan(submitted));
      EXPECT_TRUE(n.ok()) << n.status();
      if (!n.ok()) return done;
      submitted += *n;
      if (submitted < requests.size()) {
        EXPECT_TRUE(engine_->Reap(1, absl::InfiniteDuration(), &done).ok());
      }
    }
    while (engine_->outstanding() > 0) {
      absl::Status s = engine_->Reap(engine_->outstanding(), absl::InfiniteDuration(), &done);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) break;
    }
    return done;
  }

  // Writes `buf` at `offset` in `chunk`-byte requests and checks every
  // completion is OK and full length.
  void WriteAll(const AlignedBuffer& buf, uint64_t offset, uint64_t chunk) {
    std::vector<IoRequest> reqs;
    for (uint64_t o = 0; o < buf.size(); o += chunk) {
      reqs.push_back(IoRequest{IoOp::kWrite, file_, offset + o, buf.data() + o, chunk, o});
    }
    for (const IoCompletion& c : RunAll(reqs)) {
      EXPECT_TRUE(c.status.ok()) << c.status;
      EXPECT_EQ(c.transferred_bytes, chunk);
    }
  }

  void ReadAll(const AlignedBuffer& buf, uint64_t offset, uint64_t chunk) {
    std::vector<IoRequest> reqs;
    for (uint64_t o = 0; o < buf.size(); o += chunk) {
      reqs.push_back(IoRequest{IoOp::kRead, file_, offset + o, buf.data() + o, chunk, o});
    }
    for (const IoCompletion& c : RunAll(reqs)) {
      EXPECT_TRUE(c.status.ok()) << c.status;
      EXPECT_EQ(c.transferred_bytes, chunk);
    }
  }

  // Not a gtest assertion: used where a value must be returned.
  static void STRATA_TEST_CHECK(bool ok) {
    if (!ok) std::abort();
  }

  std::unique_ptr<TestDir> dir_;
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<IoEngine> engine_;
  IoFileId file_;
  std::string skip_reason_;
};

TYPED_TEST_SUITE_P(IoEngineConformanceTest);

#define STRATA_MAKE_ENGINE_OR_SKIP(options)                    \
  if (!this->MakeEngine(options)) {                            \
    if (!this->skip_reason_.empty()) GTEST_SKIP() << this->skip_reason_; \
    return;                                                    \
  }

TYPED_TEST_P(IoEngineConformanceTest, ManyRequestsInFlightRoundTrip) {
  STRATA_MAKE_ENGINE_OR_SKIP(this->SmallOptions());
  // 64 requests of 256 KiB, each split into four 64 KiB pieces, all submitted
  // at once with queue depth 8.
  AlignedBuffer out = this->Buffer(16 << 20);
  this->Fill(out.span(), 1);
  std::vector<IoRequest> reqs;
  for (uint64_t i = 0; i < 64; ++i) {
    reqs.push_back(IoRequest{IoOp::kWrite, this->file_, i * (256 << 10),
                             out.data() + i * (256 << 10), 256 << 10, 1000 + i});
  }
  std::vector<IoCompletion> done = this->RunAll(reqs);
  ASSERT_EQ(done.size(), 64u);
  absl::flat_hash_set<uint64_t> seen;
  for (const IoCompletion& c : done) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(c.transferred_bytes, 256u << 10);
    seen.insert(c.user_data);
  }
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_TRUE(seen.contains(1000) && seen.contains(1063));

  AlignedBuffer in = this->Buffer(16 << 20);
  this->ReadAll(in, 0, 1 << 20);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
  EXPECT_EQ(this->engine_->outstanding(), 0u);
}

TYPED_TEST_P(IoEngineConformanceTest, RequestLargerThanBlockSizeCompletesOnce) {
  IoEngineOptions o = this->SmallOptions();
  o.queue_depth = 4;
  STRATA_MAKE_ENGINE_OR_SKIP(o);
  AlignedBuffer out = this->Buffer(8 << 20);
  this->Fill(out.span(), 2);
  std::vector<IoCompletion> done =
      this->RunAll({IoRequest{IoOp::kWrite, this->file_, 4 << 20, out.data(), 8 << 20, 7}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(done[0].user_data, 7u);
  EXPECT_EQ(done[0].transferred_bytes, 8u << 20);
  AlignedBuffer in = this->Buffer(8 << 20);
  this->ReadAll(in, 4 << 20, 8 << 20);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

TYPED_TEST_P(IoEngineConformanceTest, ShortTransfersAreResubmittedUntilComplete) {
  FaultPolicy policy;
  policy.rules.push_back(FaultRule::Randomly(FaultKind::kShortTransfer, 0.7));
  FaultInjector injector(policy);
  IoEngineOptions o = this->SmallOptions();
  o.result_hook = &injector;
  STRATA_MAKE_ENGINE_OR_SKIP(o);
  AlignedBuffer out = this->Buffer(4 << 20);
  this->Fill(out.span(), 3);
  this->WriteAll(out, 0, 512 << 10);
  AlignedBuffer in = this->Buffer(4 << 20);
  this->ReadAll(in, 0, 512 << 10);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
  EXPECT_GT(injector.schedule().fired(FaultKind::kShortTransfer), 20u);
}

TYPED_TEST_P(IoEngineConformanceTest, EagainAndEintrAreRetried) {
  FaultPolicy policy;
  policy.rules.push_back(FaultRule::Randomly(FaultKind::kEagain, 0.3));
  policy.rules.push_back(FaultRule::Randomly(FaultKind::kEintr, 0.3));
  FaultInjector injector(policy);
  IoEngineOptions o = this->SmallOptions();
  o.result_hook = &injector;
  STRATA_MAKE_ENGINE_OR_SKIP(o);
  AlignedBuffer out = this->Buffer(2 << 20);
  this->Fill(out.span(), 4);
  this->WriteAll(out, 1 << 20, 256 << 10);
  AlignedBuffer in = this->Buffer(2 << 20);
  this->ReadAll(in, 1 << 20, 256 << 10);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
  EXPECT_GT(injector.schedule().fired(FaultKind::kEagain), 0u);
  EXPECT_GT(injector.schedule().fired(FaultKind::kEintr), 0u);
}

TYPED_TEST_P(IoEngineConformanceTest, EioIsReportedWithFileOffsetAndLength) {
  FaultPolicy policy;
  policy.rules.push_back(FaultRule::OnNth(FaultKind::kEio, 3, IoOp::kRead));
  FaultInjector injector(policy);
  IoEngineOptions o = this->SmallOptions();
  o.queue_depth = 1;  // pieces run in submission order, so the 3rd is known
  o.result_hook = &injector;
  STRATA_MAKE_ENGINE_OR_SKIP(o);
  AlignedBuffer in = this->Buffer(4 * (64 << 10));
  std::vector<IoRequest> reqs;
  for (uint64_t i = 0; i < 4; ++i) {
    reqs.push_back(IoRequest{IoOp::kRead, this->file_, (1 << 20) + i * (64 << 10),
                             in.data() + i * (64 << 10), 64 << 10, i});
  }
  std::vector<IoCompletion> done = this->RunAll(reqs);
  ASSERT_EQ(done.size(), 4u);
  for (const IoCompletion& c : done) {
    if (c.user_data == 2) {
      EXPECT_TRUE(absl::IsDataLoss(c.status)) << c.status;
      EXPECT_THAT(c.status.message(), HasSubstr(this->path_));
      EXPECT_THAT(c.status.message(), HasSubstr(absl::StrCat("offset ", (1 << 20) + 2 * (64 << 10))));
      EXPECT_THAT(c.status.message(), HasSubstr("65536 bytes"));
      EXPECT_THAT(c.status.message(), HasSubstr("EIO"));
    } else {
      EXPECT_TRUE(c.status.ok()) << c.status;
    }
  }
}

TYPED_TEST_P(IoEngineConformanceTest, EnospcOnWriteIsResourceExhausted) {
  FaultPolicy policy;
  policy.rules.push_back(FaultRule::OnNth(FaultKind::kEnospc, 2, IoOp::kWrite));
  FaultInjector injector(policy);
  IoEngineOptions o = this->SmallOptions();
  o.result_hook = &injector;
  STRATA_MAKE_ENGINE_OR_SKIP(o);
  // One request of four pieces; its second piece fails, so the request fails
  // as a whole, once, after all its pieces are out of the kernel.
  AlignedBuffer out = this->Buffer(256 << 10);
  std::vector<IoCompletion> done =
      this->RunAll({IoRequest{IoOp::kWrite, this->file_, 0, out.data(), 256 << 10, 9}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(absl::IsResourceExhausted(done[0].status)) << done[0].status;
  EXPECT_THAT(done[0].status.message(), HasSubstr("writing " + this->path_));
  EXPECT_THAT(done[0].status.message(), HasSubstr("ENOSPC"));
  EXPECT_THAT(done[0].status.message(), HasSubstr("part of a 262144-byte request at offset 0"));
  EXPECT_EQ(this->engine_->outstanding(), 0u);
}

TYPED_TEST_P(IoEngineConformanceTest, MisalignmentIsRejectedWithTheRule) {
  STRATA_MAKE_ENGINE_OR_SKIP(this->SmallOptions());
  absl::StatusOr<uint32_t> align = this->engine_->RequiredAlignment(this->file_);
  ASSERT_TRUE(align.ok());
  ASSERT_GT(*align, 1u);
  AlignedBuffer buf = this->Buffer(1 << 20);
  const std::string rule = absl::StrCat("align buffer addresses, offsets and lengths to ", *align);
  struct Case {
    const char* what;
    IoRequest req;
  } cases[] = {
      {"buffer address", IoRequest{IoOp::kRead, this->file_, 0, buf.data() + 1, 4096, 0}},
      {"offset", IoRequest{IoOp::kRead, this->file_, *align + 1, buf.data(), 4096, 0}},
      {"length", IoRequest{IoOp::kWrite, this->file_, 0, buf.data(), 4096 + 1, 0}},
  };
  for (const Case& c : cases) {
    // A good request in the same batch is not queued either.
    IoRequest good{IoOp::kRead, this->file_, 0, buf.data() + 8192, 4096, 1};
    absl::StatusOr<size_t> n = this->engine_->Submit({good, c.req});
    EXPECT_TRUE(absl::IsInvalidArgument(n.status())) << c.what << ": " << n.status();
    EXPECT_THAT(n.status().message(), HasSubstr(c.what));
    EXPECT_THAT(n.status().message(), HasSubstr(rule));
    EXPECT_EQ(this->engine_->outstanding(), 0u);
  }
}

TYPED_TEST_P(IoEngineConformanceTest, BadRequestsAreInvalidArgument) {
  STRATA_MAKE_ENGINE_OR_SKIP(this->SmallOptions());
  AlignedBuffer buf = this->Buffer(4096);
  EXPECT_TRUE(absl::IsInvalidArgument(
      this->engine_->Submit({IoRequest{IoOp::kRead, IoFileId{77}, 0, buf.data(), 4096, 0}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      this->engine_->Submit({IoRequest{IoOp::kRead, this->file_, 0, nullptr, 4096, 0}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      this->engine_->Submit({IoRequest{IoOp::kRead, this->file_, 0, buf.data(), 0, 0}}).status()));
}

TYPED_TEST_P(IoEngineConformanceTest, ReadPastEndOfFileFailsInsteadOfPassingShort) {
  STRATA_MAKE_ENGINE_OR_SKIP(this->SmallOptions());
  AlignedBuffer buf = this->Buffer(128 << 10);
  // Straddles the end of the file: the first 64 KiB exist, the rest do not.
  std::vector<IoCompletion> done = this->RunAll(
      {IoRequest{IoOp::kRead, this->file_, kFileBytes - (64 << 10), buf.data(), 128 << 10, 1}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].status.ok());
  EXPECT_THAT(done[0].status.message(), HasSubstr("end of file"));
  EXPECT_LT(done[0].transferred_bytes, 128u << 10);
}

TYPED_TEST_P(IoEngineConformanceTest, ShutdownCancelsQueuedRequestsAndReportsAll) {
  IoEngineOptions o = this->SmallOptions();
  o.queue_depth = 2;
  STRATA_MAKE_ENGINE_OR_SKIP(o);
  AlignedBuffer buf = this->Buffer(64 * (64 << 10));
  std::vector<IoRequest> reqs;
  for (uint64_t i = 0; i < 64; ++i) {
    reqs.push_back(IoRequest{IoOp::kRead, this->file_, i * (64 << 10), buf.data() + i * (64 << 10),
                             64 << 10, i});
  }
  absl::StatusOr<size_t> n = this->engine_->Submit(reqs);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 64u);
  this->engine_->Shutdown();
  std::vector<IoCompletion> done;
  ASSERT_TRUE(this->engine_->Reap(64, absl::ZeroDuration(), &done).ok());
  // Everything is accounted for at once: no buffer is still in the kernel.
  ASSERT_EQ(done.size(), 64u);
  size_t cancelled = 0;
  for (const IoCompletion& c : done) {
    if (absl::IsCancelled(c.status)) {
      ++cancelled;
      EXPECT_THAT(c.status.message(), HasSubstr("cancelled by engine shutdown"));
    } else {
      EXPECT_TRUE(c.status.ok()) << c.status;
    }
  }
  // At most queue_depth pieces had reached the kernel.
  EXPECT_GE(cancelled, 62u);
  EXPECT_EQ(this->engine_->outstanding(), 0u);
  EXPECT_TRUE(absl::IsFailedPrecondition(this->engine_->Submit({reqs[0]}).status()));
}

TYPED_TEST_P(IoEngineConformanceTest, RegisteredBuffersRoundTrip) {
  IoEngineOptions o = this->SmallOptions();
  o.register_buffers = true;
  o.register_files = true;
  STRATA_MAKE_ENGINE_OR_SKIP(o);
  AlignedBuffer out = this->Buffer(2 << 20);
  AlignedBuffer in = this->Buffer(2 << 20);
  this->Fill(out.span(), 5);
  ASSERT_TRUE(this->engine_
                  ->RegisterBuffers({IoEngine::BufferRegion{out.data(), out.size()},
                                     IoEngine::BufferRegion{in.data(), in.size()}})
                  .ok());
  if (TypeParam::kKind == IoEngineKind::kUring) {
    // We run as a user allowed to pin 4 MiB (or root); a note says otherwise.
    EXPECT_TRUE(this->engine_->info().registered_buffers ||
                !this->engine_->info().notes.empty());
  } else {
    EXPECT_FALSE(this->engine_->info().registered_buffers);
  }
  this->WriteAll(out, 0, 1 << 20);
  this->ReadAll(in, 0, 512 << 10);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

TYPED_TEST_P(IoEngineConformanceTest, BufferedFileAcceptsUnalignedIo) {
  STRATA_MAKE_ENGINE_OR_SKIP(this->SmallOptions());
  std::string path = this->dir_->File("buffered");
  int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  absl::StatusOr<IoFileId> id = this->engine_->RegisterFile(fd, path);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*this->engine_->RequiredAlignment(*id), 1u);
  std::string text = "not aligned at all";
  std::vector<char> back(text.size());
  std::vector<IoCompletion> done =
      this->RunAll({IoRequest{IoOp::kWrite, *id, 3, text.data(), text.size(), 1}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  done = this->RunAll({IoRequest{IoOp::kRead, *id, 3, back.data(), back.size(), 2}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(std::string(back.begin(), back.end()), text);
  ASSERT_TRUE(this->engine_->UnregisterFile(*id).ok());
  close(fd);
}

TYPED_TEST_P(IoEngineConformanceTest, ReapWithZeroTimeoutDoesNotBlock) {
  STRATA_MAKE_ENGINE_OR_SKIP(this->SmallOptions());
  std::vector<IoCompletion> done;
  EXPECT_TRUE(this->engine_->Reap(1, absl::ZeroDuration(), &done).ok());
  EXPECT_TRUE(done.empty());
  EXPECT_TRUE(this->engine_->Reap(0, absl::InfiniteDuration(), &done).ok());
  EXPECT_TRUE(done.empty());
}

REGISTER_TYPED_TEST_SUITE_P(IoEngineConformanceTest, ManyRequestsInFlightRoundTrip,
                            RequestLargerThanBlockSizeCompletesOnce,
                            ShortTransfersAreResubmittedUntilComplete, EagainAndEintrAreRetried,
                            EioIsReportedWithFileOffsetAndLength, EnospcOnWriteIsResourceExhausted,
                            MisalignmentIsRejectedWithTheRule, BadRequestsAreInvalidArgument,
                            ReadPastEndOfFileFailsInsteadOfPassingShort,
                            ShutdownCancelsQueuedRequestsAndReportsAll, RegisteredBuffersRoundTrip,
                            BufferedFileAcceptsUnalignedIo, ReapWithZeroTimeoutDoesNotBlock);

using EngineKinds = ::testing::Types<UringKind, AioKind, PsyncKind>;
INSTANTIATE_TYPED_TEST_SUITE_P(All, IoEngineConformanceTest, EngineKinds);

}  // namespace
}  // namespace strata
