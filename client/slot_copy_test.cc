// CopyToSlot copies every byte, whatever the alignment and length, on both
// sides of the streaming threshold.
#include "client/slot_copy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(SlotCopyTest, CopiesExactlyTheBytesAtAnyAlignmentAndLength) {
  const size_t big = kStreamingCopyMinBytes + 4096 + 77;
  std::vector<uint8_t> src(big + 64), dst(big + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t dst_off : {0, 1, 17, 32, 63}) {
    for (size_t src_off : {0, 3, 32}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, kStreamingCopyMinBytes - 1, kStreamingCopyMinBytes,
                       kStreamingCopyMinBytes + 63, big}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        CopyToSlot(dst.data() + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote before the destination";
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst[dst_off + i], src[src_off + i]) << "byte " << i << " of " << n << " dst+" << dst_off;
        }
        for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote past the end";
      }
    }
  }
}

}  // namespace
}  // namespace strata
