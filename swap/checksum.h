// Checksums for NVMe extents: XXH3-64 (libxxhash) or CRC32C (the SSE4.2
// instruction where the CPU has it, a table otherwise).
//
// Both run well above NVMe speed (XXH3 >10 GB/s, CRC32C with SSE4.2 several
// GB/s), and both are streaming, so ExtentStore checksums pieces as
// their I/O completes instead of in a pass after the whole shard has arrived.
// The seed binds a checksum to a generation: the same bytes written as a
// different generation do not verify.
#ifndef STRATA_SWAP_CHECKSUM_H_
#define STRATA_SWAP_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/types/span.h"
#include "swap/extent_store.h"

namespace strata {

// Thread-compatible.
class StreamingChecksum {
 public:
  StreamingChecksum(ChecksumKind kind, uint64_t seed);
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Update(const void* data, size_t size);
  // The checksum of everything passed to Update so far.
  uint64_t Digest() const;

 private:
  ChecksumKind kind_;
  void* xxh_state_ = nullptr;  // XXH3_state_t*, kept out of the header
  uint32_t crc_ = 0;
};

uint64_t ComputeChecksum(ChecksumKind kind, uint64_t seed, const void* data, size_t size);

// CRC32C (Castagnoli) continuing from `crc` (0 to start), hardware where
// available. Exposed for tests against known vectors.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);
// The portable table version, the oracle for the hardware path.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);
bool Crc32cIsHardwareAccelerated();

}  // namespace strata

#endif  // STRATA_SWAP_CHECKSUM_H_
