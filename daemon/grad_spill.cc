#include "daemon/grad_spill.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "swap/extent_store.h"

namespace strata {

absl::StatusOr<std::unique_ptr<GradSpill>> GradSpill::Create(uint64_t job_id, ExtentStore* store,
                                                             uint64_t largest_bytes) {
  if (store == nullptr) return absl::FailedPreconditionError("spilling gradients needs the NVMe tier");
  std::unique_ptr<GradSpill> spill(new GradSpill(job_id, store, std::max<uint64_t>(largest_bytes, 4096)));
  for (AlignedBuffer* b : {&spill->buffers_[0], &spill->buffers_[1], &spill->write_buffers_[0],
                           &spill->write_buffers_[1]}) {
    auto buffer = AlignedBuffer::Allocate(spill->buffer_bytes_, store->alignment());
    if (!buffer.ok()) return buffer.status();
    *b = std::move(*buffer);
  }
  return spill;
}

GradSpill::~GradSpill() {
  EndReadback();
  (void)Flush();
}

ShardKey GradSpill::Key(uint64_t job_id, uint32_t rank, uint32_t index) {
  return ShardKey{JobId(job_id), Rank(rank), TensorId(index), TensorKind::kGrad, 0};
}

absl::Status GradSpill::Flush() {
  for (auto& w : writes_) {
    if (!w.valid()) continue;
    absl::Status s = w.get();
    if (!s.ok() && write_error_.ok()) write_error_ = s;
  }
  absl::Status error = write_error_;
  write_error_ = absl::OkStatus();
  return error;
}

absl::Status GradSpill::Spill(uint32_t rank, uint32_t index, absl::Span<const std::byte> grad) {
  if (grad.size() > buffer_bytes_) {
    return absl::InternalError(absl::StrCat("a gradient of ", grad.size(), " bytes exceeds the spill buffer of ",
                                            buffer_bytes_));
  }
  const size_t mine = writes_started_ % 2;
  // This buffer's last write ended before the previous one started.
  if (writes_[mine].valid()) {
    absl::Status s = writes_[mine].get();
    if (!s.ok() && write_error_.ok()) write_error_ = s;
  }
  std::memcpy(write_buffers_[mine].data(), grad.data(), grad.size());
  // In spill order, one at a time: a re-spilled shard's last copy wins.
  std::future<absl::Status>& previous = writes_[1 - mine];
  if (previous.valid()) {
    absl::Status s = previous.get();
    if (!s.ok() && write_error_.ok()) write_error_ = s;
  }
  if (!write_error_.ok()) return write_error_;
  const ShardKey key = Key(job_id_, rank, index);
  const absl::Span<const std::byte> copy(write_buffers_[mine].data(), grad.size());
  writes_[mine] = std::async(std::launch::async, [this, key, copy, rank, index]() -> absl::Status {
    absl::Status s = store_->Write(key, copy);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("spilling the gradient of shard ", index, " of rank ", rank,
                                               " to NVMe: ", s.message()));
  });
  ++writes_started_;
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
  // The spilled copies are read back only once all are written.
  readback_error_ = Flush();
  order_ = std::move(order);
  next_ = 0;
  if (!order_.empty() && readback_error_.ok()) StartRead(0);
}

absl::StatusOr<const std::byte*> GradSpill::Next(const ShardId& id) {
  if (next_ >= order_.size() || order_[next_].first.rank != id.rank || order_[next_].first.index != id.index) {
    return absl::InternalError(absl::StrCat("the step asked for the spilled gradient of shard ", id.index,
                                            " of rank ", id.rank, " out of order"));
  }
  if (!readback_error_.ok()) return readback_error_;
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
  (void)Flush();  // a write still running would outlive its delete
  for (const auto& [rank, index] : written_) (void)store_->Delete(Key(job_id_, rank, index));
  written_.clear();
}

}  // namespace strata
