#include "daemon/grad_spill.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "swap/extent_store.h"

namespace strata {

absl::StatusOr<std::unique_ptr<GradSpill>> GradSpill::Create(uint64_t job_id, ExtentStore* store,
                                                             uint64_t largest_bytes) {
  if (store == nullptr) return absl::FailedPreconditionError("spilling gradients needs the NVMe tier");
  std::unique_ptr<GradSpill> spill(new GradSpill(job_id, store, std::max<uint64_t>(largest_bytes, 4096)));
  for (AlignedBuffer& b : spill->buffers_) {
    auto buffer = AlignedBuffer::Allocate(spill->buffer_bytes_, store->alignment());
    if (!buffer.ok()) return buffer.status();
    b = std::move(*buffer);
  }
  return spill;
}

GradSpill::~GradSpill() { EndReadback(); }

ShardKey GradSpill::Key(uint64_t job_id, uint32_t rank, uint32_t index) {
  return ShardKey{JobId(job_id), Rank(rank), TensorId(index), TensorKind::kGrad, 0};
}

absl::Status GradSpill::Spill(uint32_t rank, uint32_t index, absl::Span<const std::byte> grad) {
  const ShardKey key = Key(job_id_, rank, index);
  if (absl::Status s = store_->Write(key, grad); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("spilling the gradient of shard ", index, " of rank ", rank,
                                               " to NVMe: ", s.message()));
  }
  if (std::find(written_.begin(), written_.end(), std::make_pair(rank, index)) == written_.end()) {
    written_.emplace_back(rank, index);
  }
  spilled_bytes_ += grad.size();
  return absl::OkStatus();
}

void GradSpill::StartRead(size_t pos) {
  const auto [id, bytes] = order_[pos];
  std::byte* into = buffers_[pos % 2].data();
  reads_[pos % 2] = std::async(std::launch::async, [this, id = id, bytes = bytes, into]() -> absl::Status {
    if (bytes > buffer_bytes_) {
      return absl::InternalError(absl::StrCat("a spilled gradient of ", bytes, " bytes exceeds the staging of ",
                                              buffer_bytes_));
    }
    const ShardKey key = Key(job_id_, id.rank, id.index);
    absl::StatusOr<uint64_t> got = store_->Read(key, absl::Span<std::byte>(into, buffer_bytes_));
    if (!got.ok()) {
      return absl::Status(got.status().code(), absl::StrCat("reading the spilled gradient of shard ", id.index,
                                                            " of rank ", id.rank, " back: ", got.status().message()));
    }
    if (*got != bytes) {
      return absl::DataLossError(absl::StrCat("the spilled gradient of shard ", id.index, " of rank ", id.rank,
                                              " is ", *got, " bytes on NVMe, expected ", bytes));
    }
    return absl::OkStatus();
  });
}

void GradSpill::BeginReadback(std::vector<std::pair<ShardId, uint64_t>> order) {
  EndReadback();
  order_ = std::move(order);
  next_ = 0;
  if (!order_.empty()) StartRead(0);
}

absl::StatusOr<const std::byte*> GradSpill::Next(const ShardId& id) {
  if (next_ >= order_.size() || order_[next_].first.rank != id.rank || order_[next_].first.index != id.index) {
    return absl::InternalError(absl::StrCat("the step asked for the spilled gradient of shard ", id.index,
                                            " of rank ", id.rank, " out of order"));
  }
  const size_t pos = next_++;
  absl::Status s = reads_[pos % 2].get();
  if (!s.ok()) return s;
  read_back_bytes_ += order_[pos].second;
  // The other buffer held the shard before this one, which the step is done with.
  if (next_ < order_.size()) StartRead(next_);
  return buffers_[pos % 2].data();
}

void GradSpill::EndReadback() {
  for (auto& r : reads_) {
    if (r.valid()) (void)r.get();
  }
  order_.clear();
  next_ = 0;
}

void GradSpill::DeleteAll() {
  for (const auto& [rank, index] : written_) (void)store_->Delete(Key(job_id_, rank, index));
  written_.clear();
}

}  // namespace strata
