#include "bench/offload_parts.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "bench/sample_stats.h"
#include "core/byte_size.h"
#include "core/shard_key.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;
constexpr TensorKind kStreams[] = {TensorKind::kMaster32, TensorKind::kExpAvg, TensorKind::kExpAvgSq};
constexpr uint64_t kNumStreams = 3;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Gradients in fp16 as a trainer sends them: finite, mixed signs, small
// (bit patterns of values around 2^-7 .. 2^-6).
uint16_t GradBits(uint64_t i) { return static_cast<uint16_t>(((i & 1) << 15) | (0x2000 + ((i * 13) & 0x3ff))); }

ShardKey StateKey(uint32_t shard, TensorKind kind, uint32_t tile) {
  return ShardKey{JobId(1), Rank(0), TensorId(shard), kind, tile};
}

double Seconds(int64_t from_ns) { return static_cast<double>(MonotonicNanos() - from_ns) / 1e9; }

}  // namespace

uint64_t StepShape::total_elements() const {
  uint64_t total = 0;
  for (uint64_t n : shard_elements) total += n;
  return total;
}

std::vector<StepShape::Piece> StepShape::Pieces() const {
  std::vector<Piece> pieces;
  for (uint32_t s = 0; s < shard_elements.size(); ++s) {
    const uint64_t n = shard_elements[s];
    const uint64_t tile = tile_elements == 0 ? std::max<uint64_t>(n, 1) : tile_elements;
    uint32_t t = 0;
    for (uint64_t off = 0; off < n; off += tile, ++t) pieces.push_back(Piece{s, t, off, std::min(tile, n - off)});
  }
  return pieces;
}

OptimizerPart::OptimizerPart(StepShape shape, std::unique_ptr<CpuOptimizer> optimizer, OptimizerHyperparams hp,
                             float grad_scale)
    : shape_(std::move(shape)), optimizer_(std::move(optimizer)), hp_(hp), grad_scale_(grad_scale) {}

absl::StatusOr<std::unique_ptr<OptimizerPart>> OptimizerPart::Create(const StepShape& shape, int threads,
                                                                     const OptimizerHyperparams& hyperparams,
                                                                     float grad_scale) {
  CpuOptimizerOptions options;
  options.num_threads = threads;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<CpuOptimizer> optimizer, CpuOptimizer::Create(options));
  std::unique_ptr<OptimizerPart> part(new OptimizerPart(shape, std::move(optimizer), hyperparams, grad_scale));
  const uint64_t n = shape.total_elements();
  part->master_.reset(new float[n]);
  part->exp_avg_.reset(new float[n]);
  part->exp_avg_sq_.reset(new float[n]);
  part->grad_.reset(new uint16_t[n]);
  part->param_out_.reset(new uint16_t[n]);
  // Touch every page now: a first-touch fault inside the timed step would
  // measure the kernel's page allocator, not the optimizer.
  for (uint64_t i = 0; i < n; ++i) {
    part->master_[i] = 0.01f * static_cast<float>((i * 7) % 1000) / 1000.0f;
    part->exp_avg_[i] = 0;
    part->exp_avg_sq_[i] = 0;
    part->grad_[i] = GradBits(i);
    part->param_out_[i] = 0;
  }
  return part;
}

absl::StatusOr<double> OptimizerPart::Step() {
  ++step_;
  std::vector<uint64_t> shard_base(shape_.shard_elements.size(), 0);
  for (size_t s = 1; s < shard_base.size(); ++s) shard_base[s] = shard_base[s - 1] + shape_.shard_elements[s - 1];
  const std::vector<StepShape::Piece> pieces = shape_.Pieces();
  const int64_t start = MonotonicNanos();
  for (const StepShape::Piece& p : pieces) {
    const uint64_t at = shard_base[p.shard] + p.offset;
    StepSpans spans;
    spans.size = p.size;
    spans.params = master_.get() + at;
    spans.exp_avg = exp_avg_.get() + at;
    spans.exp_avg_sq = exp_avg_sq_.get() + at;
    spans.grad = grad_.get() + at;
    spans.grad_dtype = DType::kFp16;
    spans.param_out = param_out_.get() + at;
    spans.param_out_dtype = DType::kFp16;
    STRATA_RETURN_IF_ERROR(optimizer_->Step(hp_, step_, spans, grad_scale_));
  }
  return Seconds(start);
}

absl::StatusOr<double> OptimizerPart::Inspect() {
  const int64_t start = MonotonicNanos();
  uint64_t at = 0;
  for (uint64_t n : shape_.shard_elements) {
    GradView grad{grad_.get() + at, DType::kFp16, n};
    STRATA_ASSIGN_OR_RETURN(bool overflow, optimizer_->HasInfOrNan(grad));
    STRATA_ASSIGN_OR_RETURN(double norm, optimizer_->SquaredL2Norm(grad));
    if (overflow || norm < 0) return absl::InternalError("the benchmark's gradients overflowed");
    at += n;
  }
  return Seconds(start);
}

absl::StatusOr<std::unique_ptr<NvmeIoPart>> NvmeIoPart::Create(const StepShape& shape,
                                                              const NvmeIoPartOptions& options) {
  if (shape.tile_elements == 0) return absl::InvalidArgumentError("NvmeIoPart needs a staging tile size");
  std::unique_ptr<NvmeIoPart> part(new NvmeIoPart(shape, options));
  IoEngineOptions io;
  io.queue_depth = options.queue_depth;
  io.block_size_bytes = options.block_size_bytes;
  STRATA_ASSIGN_OR_RETURN(part->engine_, OpenIoEngine(io, std::nullopt, &part->notes_));
  ExtentStoreOptions store;
  store.paths = {options.dir};
  store.capacity_bytes_per_path = options.capacity_bytes;
  store.allow_buffered_fallback = true;  // as the daemon opens its store
  store.sync_policy = options.sync_policy;
  STRATA_ASSIGN_OR_RETURN(part->store_, ExtentStore::Open(store, part->engine_.get()));
  for (const std::string& w : part->store_->warnings()) part->notes_.push_back(w);
  uint64_t largest = 0;
  for (uint64_t n : shape.shard_elements) largest = std::max(largest, RoundUp(n * 2, kPage));
  part->param_slot_bytes_ = largest;
  PinnedArenaOptions arena;
  arena.name = "strata-bench-io-staging";
  arena.size_bytes = kNumStreams * shape.tile_elements * 4 + largest + RoundUp(options.record_bytes, kPage);
  arena.size_bytes = RoundUp(arena.size_bytes, kPage);
  STRATA_ASSIGN_OR_RETURN(part->staging_, PinnedArena::Create(arena));
  // Non-zero contents, so no layer below can shortcut zero pages.
  for (uint64_t i = 0; i < part->staging_.size_bytes(); ++i) {
    part->staging_.data()[i] = std::byte(static_cast<uint8_t>(i * 31 + 7));
  }
  STRATA_RETURN_IF_ERROR(part->WriteAll(/*states=*/true));
  STRATA_RETURN_IF_ERROR(part->store_->Commit());
  // Two untimed steps, as the daemon's store has seen InitParams and the
  // warm-up step before its measured steps. The store writes copy-on-write
  // into a fallocated file, and the first write into each extent converts
  // it from unwritten to written (file-system metadata); without these
  // rounds the part would pay that and the daemon would not.
  for (int i = 0; i < 2; ++i) STRATA_RETURN_IF_ERROR(part->Step().status());
  return part;
}

NvmeIoPart::~NvmeIoPart() {
  store_.reset();  // before the engine it borrows
  engine_.reset();
}

absl::Status NvmeIoPart::WriteAll(bool states) {
  std::byte* base = staging_.data();
  const uint64_t tile_bytes = shape_.tile_elements * 4;
  if (states) {
    for (const StepShape::Piece& p : shape_.Pieces()) {
      for (uint64_t s = 0; s < kNumStreams; ++s) {
        STRATA_RETURN_IF_ERROR(store_->Write(StateKey(p.shard, kStreams[s], p.tile),
                                             absl::Span<const std::byte>(base + s * tile_bytes, p.size * 4)));
      }
    }
  }
  std::byte* params = base + kNumStreams * tile_bytes;
  for (uint32_t s = 0; s < shape_.shard_elements.size(); ++s) {
    const uint64_t bytes = RoundUp(shape_.shard_elements[s] * 2, kPage);
    STRATA_RETURN_IF_ERROR(store_->Write(ShardKey{JobId(1), Rank(0), TensorId(s), TensorKind::kParam16, 0},
                                         absl::Span<const std::byte>(params, bytes)));
  }
  // The job record (settings, tensors, step count), rewritten with each step.
  return store_->Write(ShardKey{JobId(1), Rank(UINT32_MAX), TensorId(UINT32_MAX), TensorKind::kParam16, 0},
                       absl::Span<const std::byte>(params + param_slot_bytes_, options_.record_bytes));
}

absl::StatusOr<double> NvmeIoPart::Step() {
  std::byte* base = staging_.data();
  const uint64_t tile_bytes = shape_.tile_elements * 4;
  const std::vector<StepShape::Piece> pieces = shape_.Pieces();
  const int64_t start = MonotonicNanos();
  for (const StepShape::Piece& p : pieces) {
    for (uint64_t s = 0; s < kNumStreams; ++s) {
      STRATA_ASSIGN_OR_RETURN(uint64_t got, store_->Read(StateKey(p.shard, kStreams[s], p.tile),
                                                         absl::Span<std::byte>(base + s * tile_bytes, tile_bytes)));
      if (got != p.size * 4) return absl::DataLossError("the benchmark's NVMe store returned a wrong size");
    }
    for (uint64_t s = 0; s < kNumStreams; ++s) {
      STRATA_RETURN_IF_ERROR(store_->Write(StateKey(p.shard, kStreams[s], p.tile),
                                           absl::Span<const std::byte>(base + s * tile_bytes, p.size * 4)));
    }
  }
  STRATA_RETURN_IF_ERROR(WriteAll(/*states=*/false));
  STRATA_RETURN_IF_ERROR(store_->Commit());
  return Seconds(start);
}

uint64_t NvmeIoPart::bytes_read_per_step() const { return shape_.total_elements() * 4 * kNumStreams; }

uint64_t NvmeIoPart::bytes_written_per_step() const {
  uint64_t params = 0;
  for (uint64_t n : shape_.shard_elements) params += RoundUp(n * 2, kPage);
  return bytes_read_per_step() + params + options_.record_bytes;
}

std::string NvmeIoPart::Describe() const {
  const IoEngineInfo& info = engine_->info();
  std::string out = absl::StrCat(info.name, " (depth ", info.queue_depth, ", block ",
                                 FormatBytes(info.block_size_bytes), "), fdatasync ",
                                 SyncPolicyName(options_.sync_policy));
  for (const std::string& n : notes_) absl::StrAppend(&out, "; ", n);
  return out;
}

}  // namespace strata
