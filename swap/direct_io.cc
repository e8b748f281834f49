#include "swap/direct_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/errno_status.h"

namespace strata {
namespace {

#ifndef STATX_DIOALIGN
// Linux 6.1 added it; Debian 12's glibc headers may predate it.
constexpr unsigned kStatxDioAlign = 0x00002000U;
#else
constexpr unsigned kStatxDioAlign = STATX_DIOALIGN;
#endif

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The logical block size of the device holding the file, from sysfs. Partitions
// have no queue/ directory of their own, so the parent device is tried too.
uint32_t LogicalBlockSize(dev_t dev) {
  for (const char* suffix : {"queue/logical_block_size", "../queue/logical_block_size"}) {
    std::string path = absl::StrCat("/sys/dev/block/", major(dev), ":", minor(dev), "/", suffix);
    FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) continue;
    char buf[32] = {0};
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    uint32_t v = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)), &v) && IsPowerOfTwo(v)) {
      return v;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<DirectIoAlignment> ProbeDirectIoAlignment(int fd, absl::string_view path) {
  DirectIoAlignment a;
  struct statx sx {};
  if (statx(fd, "", AT_EMPTY_PATH, kStatxDioAlign, &sx) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("statx on ", path));
  }
  if ((sx.stx_mask & kStatxDioAlign) != 0 && sx.stx_dio_mem_align != 0 &&
      sx.stx_dio_offset_align != 0) {
    a.memory_bytes = sx.stx_dio_mem_align;
    a.offset_bytes = sx.stx_dio_offset_align;
    a.source = "statx";
    return a;
  }
  // No STATX_DIOALIGN (older kernel, or a file system such as tmpfs that does
  // not report it): the device's logical block size is the classic rule.
  uint32_t lbs = LogicalBlockSize(makedev(sx.stx_dev_major, sx.stx_dev_minor));
  if (lbs != 0) {
    a.memory_bytes = lbs;
    a.offset_bytes = lbs;
    a.source = "logical_block_size";
    return a;
  }
  a.memory_bytes = 4096;
  a.offset_bytes = 4096;
  a.source = "default";
  return a;
}

absl::StatusOr<bool> IsDirectIo(int fd, absl::string_view path) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoToStatus(errno, absl::StrCat("fcntl(F_GETFL) on ", path));
  return (flags & O_DIRECT) != 0;
}

absl::StatusOr<OpenedFile> OpenForIo(const std::string& path, bool create, bool direct,
                                     bool allow_buffered_fallback) {
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
  OpenedFile out;
  if (direct) {
    int fd = open(path.c_str(), flags | O_DIRECT, 0600);
    if (fd >= 0) {
      out.fd = fd;
      out.direct = true;
      return out;
    }
    int err = errno;
    if (err != EINVAL) return ErrnoToStatus(err, absl::StrCat("opening ", path, " with O_DIRECT"));
    if (!allow_buffered_fallback) {
      return absl::InvalidArgumentError(absl::StrCat(
          "opening ", path,
          ": the file system refuses O_DIRECT (EINVAL; tmpfs on older kernels does). Put the "
          "NVMe path on ext4/xfs, or allow buffered I/O (allow_buffered_fallback) and accept the "
          "page-cache copies"));
    }
    out.warning = absl::StrCat(path,
                               ": the file system refuses O_DIRECT; using buffered I/O (slower, "
                               "and it competes with the page cache for memory)");
  }
  int fd = open(path.c_str(), flags, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", path));
  out.fd = fd;
  out.direct = false;
  return out;
}

absl::Status CheckDirectIoAlignment(absl::string_view path, uint32_t alignment, const void* buffer,
                                    uint64_t offset_bytes, uint64_t length_bytes) {
  if (alignment <= 1) return absl::OkStatus();
  auto rule = [&] {
    return absl::StrCat(", the O_DIRECT alignment of ", path, ": align buffer addresses, offsets ",
                        "and lengths to ", alignment, " bytes");
  };
  uintptr_t addr = reinterpret_cast<uintptr_t>(buffer);
  if (addr % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("buffer address 0x", absl::Hex(addr),
                                                   " is not a multiple of ", alignment, rule()));
  }
  if (offset_bytes % alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", offset_bytes, " is not a multiple of ", alignment, rule()));
  }
  if (length_bytes % alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", length_bytes, " is not a multiple of ", alignment, rule()));
  }
  return absl::OkStatus();
}

}  // namespace strata
