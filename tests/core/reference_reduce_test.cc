// The shared reference that the collective tests, `mc2 soak` and `mc2 bench`
// check results against: its conversions on known bit patterns, and its
// reduction and averaging rules on hand-computed values.
#include "reference/reference_reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/reduce.h"

namespace mc2 {
namespace {

float Bits(uint32_t x) { return std::bit_cast<float>(x); }

TEST(ReferenceReduce, F16KnownValues) {
  EXPECT_EQ(reference::F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(reference::F32ToF16(-2.0f), 0xC000);
  EXPECT_EQ(reference::F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(reference::F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(reference::F32ToF16(65504.0f), 0x7BFF);  // the largest finite half
  EXPECT_EQ(reference::F32ToF16(65520.0f), 0x7C00);  // halfway to 2^16: rounds to infinity
  EXPECT_EQ(reference::F32ToF16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(reference::F32ToF16(std::ldexp(1.0f, -25)), 0x0000);         // tie: to even (0)
  EXPECT_EQ(reference::F32ToF16(std::ldexp(3.0f, -25)), 0x0002);         // tie: to even (2)
  EXPECT_EQ(reference::F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie: to even
  EXPECT_EQ(reference::F32ToF16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie: to even
  EXPECT_EQ(reference::F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  const uint16_t nan = reference::F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(ReferenceReduce, BF16KnownValues) {
  EXPECT_EQ(reference::F32ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(reference::F32ToBF16(-1.0f), 0xBF80);
  EXPECT_EQ(reference::F32ToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie: to even
  EXPECT_EQ(reference::F32ToBF16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // tie: to even
  EXPECT_EQ(reference::F32ToBF16(Bits(0x3F80FFFF)), 0x3F81);
  const uint16_t nan = reference::F32ToBF16(Bits(0x7F800001));  // NaN stays NaN
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0);
}

// Both are round-to-nearest-even: the reference and the library agree on
// every non-NaN float of a stride through all bit patterns.
TEST(ReferenceReduce, ConversionsAgreeWithTheLibraryOnASweep) {
  for (uint64_t x = 0; x <= 0xFFFFFFFFu; x += 4093) {
    const float f = Bits(static_cast<uint32_t>(x));
    if (std::isnan(f)) continue;
    ASSERT_EQ(reference::F32ToF16(f), core::F32ToF16(f)) << std::hex << x;
    ASSERT_EQ(reference::F32ToBF16(f), core::F32ToBF16(f)) << std::hex << x;
  }
}

TEST(ReferenceReduce, ReduceIntsInRankOrderWithWrap) {
  auto vals = [](int r) -> int64_t { return (r == 0) ? 6 : (r == 1 ? -3 : 5); };
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kSum, 3, vals), 8);
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kAvg, 3, vals), 8);  // the sum; Store divides
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kProd, 3, vals), -90);
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kMin, 3, vals), -3);
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kMax, 3, vals), 6);
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kBand, 3, vals), 6 & -3 & 5);
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kBor, 3, vals), 6 | -3 | 5);
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kBxor, 3, vals), 6 ^ -3 ^ 5);
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kSum, 1, vals), 6);
  auto big = [](int) { return std::numeric_limits<int64_t>::max(); };
  EXPECT_EQ(reference::ReduceInts(ReduceOp::kSum, 2, big), -2);  // two's complement
}

template <typename T>
T Stored(DType t, ReduceOp op, int n, int64_t acc) {
  T out{};
  reference::StoreReduction(t, op, n, acc, &out);
  return out;
}

TEST(ReferenceReduce, StoreReductionFollowsTheDocumentedRules) {
  // Integers wrap, and averages truncate toward zero.
  EXPECT_EQ(Stored<int8_t>(DType::kI8, ReduceOp::kSum, 2, 200), -56);
  EXPECT_EQ(Stored<uint8_t>(DType::kU8, ReduceOp::kSum, 2, 261), 5);
  EXPECT_EQ(Stored<int32_t>(DType::kI32, ReduceOp::kAvg, 2, -7), -3);
  EXPECT_EQ(Stored<int64_t>(DType::kI64, ReduceOp::kMax, 2, int64_t{1} << 60), int64_t{1} << 60);
  // Floats: f64 divides in f64, the others in f32, 16-bit types round once.
  EXPECT_EQ(Stored<double>(DType::kF64, ReduceOp::kAvg, 3, 1), 1.0 / 3.0);
  EXPECT_EQ(Stored<float>(DType::kF32, ReduceOp::kAvg, 3, 1), 1.0f / 3.0f);
  EXPECT_EQ(Stored<uint16_t>(DType::kF16, ReduceOp::kAvg, 3, 1), 0x3555);
  EXPECT_EQ(Stored<uint16_t>(DType::kBF16, ReduceOp::kAvg, 3, 1), 0x3EAB);
  EXPECT_EQ(Stored<float>(DType::kF32, ReduceOp::kProd, 4, -24), -24.0f);
  EXPECT_EQ(reference::Wrap(DType::kI32, int64_t{1} << 32), 0);
  EXPECT_EQ(reference::Wrap(DType::kF32, int64_t{1} << 32), int64_t{1} << 32);
}

}  // namespace
}  // namespace mc2
