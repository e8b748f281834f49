#include "client/slot_copy.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata {
namespace {

#if defined(__x86_64__)
// dst is 32-byte aligned and n a multiple of 64.
__attribute__((target("avx2"))) void StreamAvx2(std::byte* dst, const std::byte* src, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
}

// dst is 16-byte aligned and n a multiple of 64 (SSE2 is part of x86-64).
void StreamSse2(std::byte* dst, const std::byte* src, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    for (size_t k = 0; k < 64; k += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + k));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + k), v);
    }
  }
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace

void CopyToSlot(void* dst_void, const void* src_void, size_t bytes) {
  auto* dst = static_cast<std::byte*>(dst_void);
  const auto* src = static_cast<const std::byte*>(src_void);
#if defined(__x86_64__)
  if (bytes >= kStreamingCopyMinBytes) {
    // Ordinary stores up to a 64-byte boundary of dst, streaming stores for
    // the whole lines, ordinary stores for the rest.
    const size_t head = (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64;
    std::memcpy(dst, src, head);
    const size_t body = (bytes - head) / 64 * 64;
    if (HasAvx2()) {
      StreamAvx2(dst + head, src + head, body);
    } else {
      StreamSse2(dst + head, src + head, body);
    }
    std::memcpy(dst + head + body, src + head + body, bytes - head - body);
    _mm_sfence();  // streaming stores are weakly ordered
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

namespace {

// pwrite's piece: a shmem write holds the memfd's inode lock throughout, and
// the daemon's punches (the slots and params it discards) wait for it; whole
// 20 MB slots let the window run 100-135 MiB over its budget (docs/DAEMON.md).
constexpr size_t kRegionWritePiece = size_t{2} << 20;

// Whether the memfd has a page under `addr` (mincore on a shared file
// mapping reports the file's page cache, not this process's page tables).
bool Resident(const void* addr) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(addr) & ~(page - 1));
  unsigned char vec = 0;
  // Unknown (an error): the mapping's path, which is always right.
  if (mincore(start, 1, &vec) != 0) return true;
  return (vec & 1) != 0;
}

}  // namespace

absl::Status CopyIntoRegion(int fd, void* dst, uint64_t file_offset, const void* src, size_t bytes) {
  if (fd < 0 || bytes < kStreamingCopyMinBytes || Resident(dst)) {
    CopyToSlot(dst, src, bytes);
    return absl::OkStatus();
  }
  const std::byte* from = static_cast<const std::byte*>(src);
  size_t done = 0;
  while (done < bytes) {
    const size_t piece = std::min(bytes - done, kRegionWritePiece);
    const ssize_t n = pwrite(fd, from + done, piece, static_cast<off_t>(file_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat("writing ", bytes, " bytes into the shared region at offset ", file_offset,
                                              ": pwrite failed: errno ", n < 0 ? errno : 0));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace strata
