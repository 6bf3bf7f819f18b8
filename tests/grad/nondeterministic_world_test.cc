// GradSync's deterministic mode on a world whose reductions are not
// deterministic, with the classic ring forced for every all-reduce the
// library picks itself (MC2_ALGO, read once per process: hence a binary of
// its own). The ring's plain all-reduce differs from the canonical order;
// GradSync's buckets still equal it bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "grad/grad_reference.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

// Before main, so before the selector first reads it.
const bool kRingForced = setenv("MC2_ALGO", "all_reduce=ring", 1) == 0;

using gradtest::SameBits;
using gradtest::Tree;
using gradtest::Value;

TEST(GradSyncNondeterministicWorld, BucketsFollowTheCanonicalOrderAnyway) {
  ASSERT_TRUE(kRingForced);
  for (int n : {3, 4}) {
    Group::RunInProcess(
        n,
        [&](Group& g) {
          ASSERT_FALSE(g.deterministic());
          GradSyncOptions o;
          o.bucket_cap_bytes = 8192;
          o.first_bucket_cap_bytes = 2048;
          GradSync sync(g, o);
          const std::vector<size_t> sizes = {7000, 1, 513, 2000};
          for (size_t p = 0; p < sizes.size(); ++p) {
            sync.Register("w" + std::to_string(p), sizes[p], DType::kF32);
          }
          sync.Finalize();
          sync.ZeroGrad();
          std::vector<int> order(sizes.size());
          std::iota(order.begin(), order.end(), 0);
          std::mt19937 rng(static_cast<unsigned>(g.rank() + 5));
          std::shuffle(order.begin(), order.end(), rng);
          std::vector<std::vector<float>> plain(sizes.size());
          for (int p : order) {
            float* v = sync.GradAs<float>(p);
            for (size_t i = 0; i < sizes[p]; ++i) v[i] = Value(9, 0, g.rank(), p, i);
            plain[p].assign(v, v + sizes[p]);
            sync.MarkReady(p);
          }
          sync.Finish();
          size_t ring_differs = 0;
          for (size_t p = 0; p < sizes.size(); ++p) {
            AllReduce(g, plain[p].data(), plain[p].data(), sizes[p], DType::kF32, ReduceOp::kAvg)
                .Wait();
            const float* got = sync.GradAs<float>(static_cast<int>(p));
            for (size_t i = 0; i < sizes[p]; ++i) {
              const float want =
                  Tree<float>([&](int r) { return Value(9, 0, r, static_cast<int>(p), i); }, 0, n) /
                  static_cast<float>(n);
              ASSERT_TRUE(SameBits(got[i], want)) << p << " " << i;
              ring_differs += SameBits(plain[p][i], want) ? 0 : 1;
            }
          }
          // Else this test could not tell the two orders apart.
          EXPECT_GT(ring_differs, 0u);
          Barrier(g).Wait();
        },
        WorldOptions{.deterministic = 0});
  }
}

}  // namespace
}  // namespace mc2
