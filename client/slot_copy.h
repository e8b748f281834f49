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

namespace strata {

// Copies `bytes` from `src` to `dst` (non-overlapping); streaming stores from
// kStreamingCopyMinBytes on (x86-64: AVX2 where the CPU has it, else SSE2),
// plain memcpy below and elsewhere. Ends with a store fence, so the bytes are
// visible before whatever the caller publishes next.
inline constexpr size_t kStreamingCopyMinBytes = size_t{1} << 20;
void CopyToSlot(void* dst, const void* src, size_t bytes);

}  // namespace strata

#endif  // STRATA_CLIENT_SLOT_COPY_H_
