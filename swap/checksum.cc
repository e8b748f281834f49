#include "swap/checksum.h"

#include <nmmintrin.h>
#include <xxhash.h>
// Debian's libxxhash carries runtime-dispatched AVX2/AVX-512 variants of XXH3;
// this header routes XXH3_64bits_update & co. to them (same digests, ~2x the
// SSE2 rate here), which keeps checksums hidden behind the I/O.
#include <xxh_x86dispatch.h>

#include <array>
#include <cstring>

namespace strata {
namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78;  // reflected Castagnoli

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrc32cPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

const std::array<uint32_t, 256>& CrcTable() {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  return table;
}

// One crc32 instruction per 8 bytes, 3-cycle latency: ~8 GB/s per core at
// 3 GHz, several times NVMe speed. Interleaving three streams would triple it
// but needs a CRC shift-combine step; not worth it at these rates.
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const void* data,
                                                         size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    size -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (size > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --size;
  }
  return ~c32;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  const auto& t = CrcTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

bool Crc32cIsHardwareAccelerated() { return HaveSse42(); }

uint32_t Crc32c(uint32_t crc, const void* data, size_t size) {
  return HaveSse42() ? Crc32cSse42(crc, data, size) : Crc32cPortable(crc, data, size);
}

StreamingChecksum::StreamingChecksum(ChecksumKind kind, uint64_t seed) : kind_(kind) {
  if (kind_ == ChecksumKind::kXxh3) {
    XXH3_state_t* s = XXH3_createState();
    XXH3_64bits_reset_withSeed(s, seed);
    xxh_state_ = s;
  } else {
    // Fold the seed into the initial value so generations differ.
    crc_ = Crc32c(0, &seed, sizeof(seed));
  }
}

StreamingChecksum::~StreamingChecksum() {
  if (xxh_state_ != nullptr) XXH3_freeState(static_cast<XXH3_state_t*>(xxh_state_));
}

void StreamingChecksum::Update(const void* data, size_t size) {
  if (size == 0) return;
  if (kind_ == ChecksumKind::kXxh3) {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(xxh_state_), data, size);
  } else {
    crc_ = Crc32c(crc_, data, size);
  }
}

uint64_t StreamingChecksum::Digest() const {
  if (kind_ == ChecksumKind::kXxh3) return XXH3_64bits_digest(static_cast<XXH3_state_t*>(xxh_state_));
  return crc_;
}

uint64_t ComputeChecksum(ChecksumKind kind, uint64_t seed, const void* data, size_t size) {
  StreamingChecksum c(kind, seed);
  c.Update(data, size);
  return c.Digest();
}

}  // namespace strata
