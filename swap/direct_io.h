// O_DIRECT rules: opening files for direct I/O and finding the alignment the
// kernel demands of buffers, offsets and lengths.
//
// The alignment comes from statx(STATX_DIOALIGN) where the kernel and file
// system report it (Linux 6.1+ on ext4/xfs/btrfs), else the logical block size
// of the device under the file (/sys/dev/block/M:m/queue/logical_block_size),
// else 4096. Offsets and lengths use the offset alignment and buffer
// addresses the memory alignment; callers get the larger of the two, which
// keeps one rule to state.
#ifndef STRATA_SWAP_DIRECT_IO_H_
#define STRATA_SWAP_DIRECT_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

struct DirectIoAlignment {
  uint32_t memory_bytes = 4096;  // buffer address
  uint32_t offset_bytes = 4096;  // file offset and length
  // "statx" or "logical_block_size" or "default".
  const char* source = "default";
  uint32_t required() const { return memory_bytes > offset_bytes ? memory_bytes : offset_bytes; }
};

// Probes the alignment for direct I/O on the open file `fd` (`path` names it
// in errors).
absl::StatusOr<DirectIoAlignment> ProbeDirectIoAlignment(int fd, absl::string_view path);

// True when `fd` was opened with O_DIRECT.
absl::StatusOr<bool> IsDirectIo(int fd, absl::string_view path);

struct OpenedFile {
  int fd = -1;          // owned by the caller
  bool direct = false;  // O_DIRECT in effect
  // Non-empty when a buffered fallback happened: says why, for a warning.
  std::string warning;
};

// Opens `path` read-write (creating it with mode 0600 when `create`), with
// O_DIRECT when `direct`. A file system that refuses O_DIRECT (EINVAL, e.g.
// tmpfs on older kernels) is InvalidArgument naming the path and the fix,
// unless `allow_buffered_fallback`, which opens it buffered and sets
// `warning`.
absl::StatusOr<OpenedFile> OpenForIo(const std::string& path, bool create, bool direct,
                                     bool allow_buffered_fallback);

// "offset 4097 is not a multiple of 512, the O_DIRECT alignment of /x: align
// buffer addresses, offsets and lengths to 512 bytes", or OK.
absl::Status CheckDirectIoAlignment(absl::string_view path, uint32_t alignment,
                                    const void* buffer, uint64_t offset_bytes,
                                    uint64_t length_bytes);

}  // namespace strata

#endif  // STRATA_SWAP_DIRECT_IO_H_
