#include "swap/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// Below this, posix_memalign is cheaper than a mapping of its own.
constexpr size_t kMmapThreshold = size_t{1} << 20;
constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(size_t size_bytes, size_t alignment,
                                                      bool huge_pages, bool prefault) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AlignedBuffer: alignment ", alignment, " is not a power of two"));
  }
  if (size_bytes == 0) return AlignedBuffer();
  if (size_bytes >= kMmapThreshold && alignment <= 4096) {
    // Over-map by one huge page so the buffer can start 2 MiB aligned (THP
    // then backs it with huge pages, fewer TLB misses for the DMA mapping),
    // and trim the slack.
    size_t map_len = size_bytes + kHugePage;
    void* p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("AlignedBuffer: mmap of ", size_bytes, " bytes failed"));
    }
    auto* raw = static_cast<std::byte*>(p);
    uintptr_t start = (reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) & ~(kHugePage - 1);
    auto* data = reinterpret_cast<std::byte*>(start);
    size_t head = data - raw;
    size_t len = (size_bytes + 4095) & ~size_t{4095};
    if (head > 0) munmap(raw, head);
    size_t tail = map_len - head - len;
    if (tail > 0) munmap(data + len, tail);
    if (huge_pages) {
      madvise(data, len, MADV_HUGEPAGE);
    } else if (prefault) {
      madvise(data, len, MADV_NOHUGEPAGE);
    }
    if (!prefault) return AlignedBuffer(data, size_bytes, /*mapped_bytes=*/len);
    // Pre-fault now: a first touch costs ~14 us per 4 KiB page, which must not
    // land inside timed I/O.
#ifdef MADV_POPULATE_WRITE
    if (madvise(data, len, MADV_POPULATE_WRITE) != 0)
#endif
    {
      for (size_t off = 0; off < len; off += 4096) data[off] = std::byte{0};
    }
    return AlignedBuffer(data, size_bytes, /*mapped_bytes=*/len);
  }
  void* p = nullptr;
  size_t align = alignment < sizeof(void*) ? sizeof(void*) : alignment;
  size_t len = (size_bytes + align - 1) & ~(align - 1);
  if (posix_memalign(&p, align, len) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("AlignedBuffer: posix_memalign of ", size_bytes, " bytes failed"));
  }
  std::memset(p, 0, len);
  return AlignedBuffer(static_cast<std::byte*>(p), size_bytes, /*mapped_bytes=*/0);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { Release(); }

void AlignedBuffer::Release() {
  if (data_ == nullptr) return;
  if (mapped_bytes_ != 0) {
    munmap(data_, mapped_bytes_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
  mapped_bytes_ = 0;
}

}  // namespace strata
