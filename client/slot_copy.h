// Copying a gradient bucket into the shared exchange region.
//
// A bucket is copied once and read next by the daemon (on another core, after
// the trainer has moved on), so for large copies the trainer's caches gain
// nothing from holding it: streaming (non-temporal) stores write whole lines
// to memory without first reading them in, where glibc's memcpy, at these
// sizes on the machines measured, does ordinary stores that read every
// destination line first. Measured on a 2-core AMD EPYC (AVX-512), 64 MiB:
// memcpy 14-16 ms, streaming stores 9-10 ms (docs/DAEMON.md).
#ifndef STRATA_CLIENT_SLOT_COPY_H_
#define STRATA_CLIENT_SLOT_COPY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace strata {

// Copies `bytes` from `src` to `dst` (non-overlapping); streaming stores from
// kStreamingCopyMinBytes on (x86-64: AVX2 where the CPU has it, else SSE2),
// plain memcpy below and elsewhere. Ends with a store fence, so the bytes are
// visible before whatever the caller publishes next.
inline constexpr size_t kStreamingCopyMinBytes = size_t{1} << 20;
void CopyToSlot(void* dst, const void* src, size_t bytes);

// Copies `bytes` from `src` to `dst`, which maps byte `file_offset` of the
// shared region's memfd `fd`. Where the region holds no memory at `dst` yet
// (a ZeRO-Infinity slot the daemon discarded: a hole in the memfd) and the
// copy is large, the bytes go in with pwrite(2) on the memfd instead of
// through the mapping: a store into a hole faults once per 4 KiB page
// (shmem has no huge pages on the machines measured), which costs more than
// the copy itself -- 20 MB into a hole: memcpy 21-25 ms, pwrite 12-15 ms;
// into resident pages memcpy 3 ms, pwrite 8-9 ms (medians of 11, 2-core AMD
// EPYC VM, docs/DAEMON.md). Either way the bytes are in the memfd's pages,
// which the daemon's mapping and this one share. Otherwise (resident, small,
// or no fd) CopyToSlot. An error is pwrite's, naming errno.
absl::Status CopyIntoRegion(int fd, void* dst, uint64_t file_offset, const void* src, size_t bytes);

}  // namespace strata

#endif  // STRATA_CLIENT_SLOT_COPY_H_
