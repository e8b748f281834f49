// AlignedBuffer: an owned, aligned, pre-faulted block of host memory for
// O_DIRECT I/O.
//
// Large buffers come from mmap (page aligned, optionally 2 MiB aligned and
// backed by transparent huge pages) and are populated up front: a first-touch
// page fault costs ~14 us per 4 KiB page on our machines, which would
// otherwise land inside the first timed I/O. Small ones come from
// posix_memalign and are zero-filled, which touches them.
//
// Move-only RAII. Thread-compatible.
#ifndef STRATA_SWAP_ALIGNED_BUFFER_H_
#define STRATA_SWAP_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace strata {

class AlignedBuffer {
 public:
  // `alignment` must be a power of two (InvalidArgument otherwise). A size of
  // zero gives an empty buffer. Out of memory is ResourceExhausted.
  // The contents are zero. `huge_pages`: ask for transparent huge pages on
  // buffers of 1 MiB and more (MADV_HUGEPAGE). Physically contiguous 2 MiB
  // pages let a 1 MiB O_DIRECT request travel as one DMA segment instead of
  // 256, which matters on devices with a low max_segments (virtio-blk: 254,
  // so a 1 MiB request of 4 KiB pages is split in two).
  // `prefault` false leaves large buffers untouched, so their pages are
  // faulted in by whoever touches them first (e.g. io_uring buffer
  // registration), as with a plain malloc; `huge_pages` false then also
  // leaves the kernel's default page policy alone. Used by the bench to give
  // our engines exactly the memory fio gets.
  static absl::StatusOr<AlignedBuffer> Allocate(size_t size_bytes,
                                                size_t alignment = 4096,
                                                bool huge_pages = true,
                                                bool prefault = true);

  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<std::byte> span() const { return absl::MakeSpan(data_, size_); }

 private:
  AlignedBuffer(std::byte* data, size_t size, size_t mapped_bytes)
      : data_(data), size_(size), mapped_bytes_(mapped_bytes) {}
  void Release();

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_bytes_ = 0;  // non-zero: from mmap, this long
};

}  // namespace strata

#endif  // STRATA_SWAP_ALIGNED_BUFFER_H_
