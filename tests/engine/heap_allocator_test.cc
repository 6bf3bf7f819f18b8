// The first-fit allocator of a rank's heap (engine/heap_allocator.h),
// checked against a model: a byte map of which pages are in use.
#include "engine/heap_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>
#include <vector>

#include "mc2/error.h"

namespace mc2::engine {
namespace {

constexpr uint64_t kPage = HeapAllocator::kAlignment;

TEST(HeapAllocator, OffsetsAreAlignedAndSizesRoundUpToPages) {
  HeapAllocator a(100, 100 + 10 * kPage);  // the start rounds up to a page
  std::optional<uint64_t> x = a.Allocate(1), y = a.Allocate(kPage + 1), z = a.Allocate(0);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, kPage);
  EXPECT_EQ(*y, 2 * kPage);      // x took one page
  EXPECT_EQ(*z, 4 * kPage);      // y took two; a 0-byte request still gets a page
  // The heap is [kPage, 100 + 10 pages): 9 pages and 100 bytes, 4 pages used.
  EXPECT_EQ(a.free_bytes(), 100 + 10 * kPage - kPage - 4 * kPage);
}

TEST(HeapAllocator, FirstFitReusesTheLowestHoleThatFits) {
  HeapAllocator a(0, 8 * kPage);
  auto p0 = a.Allocate(kPage), p1 = a.Allocate(2 * kPage), p2 = a.Allocate(kPage);
  ASSERT_TRUE(p0 && p1 && p2);
  a.Free(*p1);                            // a 2-page hole at 1
  EXPECT_EQ(a.Allocate(3 * kPage), 4 * kPage);  // does not fit the hole
  EXPECT_EQ(a.Allocate(kPage), *p1);      // the lowest hole that fits
  EXPECT_EQ(a.Allocate(kPage), *p1 + kPage);
}

TEST(HeapAllocator, FreedNeighboursCoalesceIntoOneRange) {
  HeapAllocator a(0, 6 * kPage);
  std::vector<uint64_t> p;
  for (int i = 0; i < 6; ++i) p.push_back(*a.Allocate(kPage));
  EXPECT_FALSE(a.Allocate(1).has_value());  // full
  EXPECT_EQ(a.largest_free(), 0u);
  for (int i : {1, 3, 2, 4}) a.Free(p[i]);  // merges with the left, then both sides
  EXPECT_EQ(a.largest_free(), 4 * kPage);
  EXPECT_EQ(a.Allocate(4 * kPage), p[1]);
}

TEST(HeapAllocator, FreeingAnOffsetNotHandedOutIsAnError) {
  HeapAllocator a(0, 4 * kPage);
  auto p = a.Allocate(kPage);
  EXPECT_THROW(a.Free(*p + kPage), Error);
  a.Free(*p);
  EXPECT_THROW(a.Free(*p), Error);  // twice
}

// Random allocations and frees against a model of the pages in use: no two
// live allocations overlap, every one lies inside the heap, and once all
// are freed the heap is one range again.
TEST(HeapAllocator, RandomTrafficMatchesAModelOfThePages) {
  constexpr uint64_t kPages = 64;
  HeapAllocator a(0, kPages * kPage);
  std::vector<bool> used(kPages, false);
  std::map<uint64_t, uint64_t> live;  // offset -> pages
  std::mt19937 rng(5);
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const size_t bytes = rng() % (5 * kPage);
      std::optional<uint64_t> off = a.Allocate(bytes);
      const uint64_t pages = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage;
      // The model: first fit is the lowest run of `pages` free pages.
      std::optional<uint64_t> want;
      for (uint64_t s = 0; s + pages <= kPages && !want; ++s) {
        bool free = true;
        for (uint64_t i = s; i < s + pages && free; ++i) free = !used[i];
        if (free) want = s * kPage;
      }
      ASSERT_EQ(off, want) << "step " << step << ", " << bytes << " bytes";
      if (!off) continue;
      for (uint64_t i = *off / kPage; i < *off / kPage + pages; ++i) used[i] = true;
      live[*off] = pages;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Free(it->first);
      for (uint64_t i = it->first / kPage; i < it->first / kPage + it->second; ++i) used[i] = false;
      live.erase(it);
    }
  }
  for (auto& [off, pages] : live) a.Free(off);
  EXPECT_EQ(a.free_bytes(), kPages * kPage);
  EXPECT_EQ(a.largest_free(), kPages * kPage);
}

TEST(HeapAllocator, ConcurrentCallersNeverGetOverlappingRanges) {
  HeapAllocator a(0, 256 * kPage);
  constexpr int kThreads = 4;
  std::vector<std::vector<uint64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        if (auto off = a.Allocate(kPage)) got[t].push_back(*off);
        if (got[t].size() > 20) {
          a.Free(got[t].front());
          got[t].erase(got[t].begin());
        }
      }
    });
  for (auto& th : threads) th.join();
  std::map<uint64_t, int> owner;
  for (int t = 0; t < kThreads; ++t)
    for (uint64_t off : got[t]) EXPECT_TRUE(owner.emplace(off, t).second) << "offset " << off;
}

}  // namespace
}  // namespace mc2::engine
