#include "swap/aligned_buffer.h"

#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(AlignedBufferTest, SmallAndLargeBuffersAreAlignedAndZeroed) {
  for (size_t size : {size_t{1}, size_t{4096}, size_t{100000}, size_t{3} << 20}) {
    absl::StatusOr<AlignedBuffer> b = AlignedBuffer::Allocate(size, 4096);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
    for (size_t i = 0; i < size; i += 997) EXPECT_EQ(b->data()[i], std::byte{0});
    b->data()[size - 1] = std::byte{7};  // writable to the end
  }
}

TEST(AlignedBufferTest, NonPowerOfTwoAlignmentIsRejected) {
  EXPECT_TRUE(absl::IsInvalidArgument(AlignedBuffer::Allocate(4096, 3000).status()));
}

TEST(AlignedBufferTest, MoveTransfersOwnership) {
  AlignedBuffer a = *AlignedBuffer::Allocate(8192);
  std::byte* p = a.data();
  AlignedBuffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  a = std::move(b);
  EXPECT_EQ(a.data(), p);
}

TEST(AlignedBufferTest, ZeroSizeIsEmpty) {
  AlignedBuffer b = *AlignedBuffer::Allocate(0);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_TRUE(b.span().empty());
}

}  // namespace
}  // namespace strata
