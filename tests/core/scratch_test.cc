#include "core/scratch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>

#include "mc2/error.h"

namespace mc2::core {
namespace {

class ScratchTest : public ::testing::Test {
 protected:
  void SetUp() override { ScratchTrim(); }
  void TearDown() override { ScratchTrim(); }
};

TEST_F(ScratchTest, ReleasedBlockIsReusedBySameSizedRequest) {
  void* first;
  {
    Scratch<float> a(1 << 20);
    first = a.data();
    std::memset(a.data(), 1, (1 << 20) * sizeof(float));
  }
  EXPECT_GE(ScratchCachedBytes(), (1u << 20) * sizeof(float));
  Scratch<float> b(1 << 20);
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(ScratchCachedBytes(), 0u);
}

TEST_F(ScratchTest, SlightlyDifferentSizesShareABlock) {
  void* first;
  {
    Scratch<char> a(1000000);
    first = a.data();
  }
  Scratch<char> b(1000000 + 4099);  // within the 1/8 rounding step
  EXPECT_EQ(b.data(), first);
}

TEST_F(ScratchTest, LiveBlocksAreDistinctAndAligned) {
  Scratch<double> a(10000), b(10000), c(3);
  EXPECT_NE(a.data(), b.data());
  EXPECT_NE(b.data(), c.data());
  for (const void* p : {static_cast<const void*>(a.data()), static_cast<const void*>(b.data()),
                        static_cast<const void*>(c.data())}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  }
  // Writing one does not disturb another.
  for (int i = 0; i < 10000; ++i) a.data()[i] = i, b.data()[i] = -i;
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(a.data()[i], i);
}

TEST_F(ScratchTest, SmallRequestDoesNotTakeAMuchLargerBlock) {
  void* big;
  {
    Scratch<char> a(64 << 20);
    big = a.data();
  }
  Scratch<char> small(4096);
  EXPECT_NE(small.data(), big);
  EXPECT_GE(ScratchCachedBytes(), size_t{64} << 20);
}

TEST_F(ScratchTest, CacheNeverHoldsMoreThanItsLimit) {
  {
    Scratch<char> a(kScratchCacheBytes / 2 + 1), b(kScratchCacheBytes / 2 + 1),
        c(kScratchCacheBytes / 2 + 1);
  }
  EXPECT_LE(ScratchCachedBytes(), kScratchCacheBytes);
  EXPECT_GT(ScratchCachedBytes(), 0u);
}

TEST_F(ScratchTest, ResizeToZeroReturnsTheBlockAndEmptyHasNoData) {
  Scratch<int> a(5000);
  EXPECT_NE(a.data(), nullptr);
  a.Resize(0);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_GT(ScratchCachedBytes(), 0u);
  Scratch<int> none;
  EXPECT_EQ(none.data(), nullptr);
}

TEST_F(ScratchTest, BlockFreedOnAnotherThreadJoinsThatThreadsCache) {
  core::ScratchBlock block(1 << 16);
  size_t other_cached = 0;
  std::thread t([&] {
    { core::ScratchBlock moved(std::move(block)); }
    other_cached = ScratchCachedBytes();
    ScratchTrim();
  });
  t.join();
  EXPECT_GE(other_cached, size_t{1} << 16);
  EXPECT_EQ(ScratchCachedBytes(), 0u);
}

// ASan and TSan refuse such a request themselves (allocation-size-too-big)
// before the allocator could fail, so the case runs without them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MC2_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MC2_UNDER_SANITIZER 1
#endif
#endif

TEST_F(ScratchTest, BlockLargerThanMemoryIsAnErrorNamingItsSize) {
#ifdef MC2_UNDER_SANITIZER
  GTEST_SKIP() << "the sanitizers abort on allocations this large";
#else
  core::ScratchBlock cached(1 << 20);
  { core::ScratchBlock drop(std::move(cached)); }
  ASSERT_GT(ScratchCachedBytes(), 0u);
  const size_t huge = size_t{1} << 60;
  try {
    core::ScratchBlock block(huge);
    FAIL() << "a block of 2^60 bytes was allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kSystem);
    EXPECT_NE(std::string(e.what()).find(std::to_string(huge)), std::string::npos) << e.what();
  }
  // The failed attempt gave the cached blocks back first.
  EXPECT_EQ(ScratchCachedBytes(), 0u);
#endif
}

}  // namespace
}  // namespace mc2::core
