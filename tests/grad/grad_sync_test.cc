// GradSync (include/mc2/grad.h) without compression, at 1-4 ranks:
// - bucketed results bitwise equal to one all-reduce per tensor (f32, f64,
//   f16, bf16; mean and sum), for caps from a few bytes to everything in one
//   bucket, gradients marked in a different random order on every rank;
// - the same against the canonical order computed in the test (a world
//   without deterministic reductions: nondeterministic_world_test.cc);
// - the first bucket's smaller cap, the rebuild from rank 0's ready order
//   (values carried over), accumulation over micro-batches with sync off,
//   parameters that get no gradient, expert parameters over a sub-group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "grad/grad_reference.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using gradtest::SameBits;
using gradtest::Tree;
using gradtest::Value;

const std::vector<size_t> kSizes = {1, 7, 1000, 33, 0, 4099, 64, 3};

// Writes Value(...) converted to `t` into dst.
void Fill(DType t, void* dst, size_t n, uint64_t seed, int step, int rank, int p) {
  for (size_t i = 0; i < n; ++i) {
    const float v = Value(seed, step, rank, p, i);
    switch (t) {
      case DType::kF32:
        static_cast<float*>(dst)[i] = v;
        break;
      case DType::kF64:
        static_cast<double*>(dst)[i] = static_cast<double>(v) * (1 + 1e-9 * i);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(dst)[i] = core::F32ToF16(v);
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(dst)[i] = core::F32ToBF16(v);
        break;
      default:
        FAIL();
    }
  }
}

// A random permutation of [0, n), different per rank and step.
std::vector<int> Shuffled(int n, int rank, int step) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  std::mt19937 rng(static_cast<unsigned>(1000 * rank + step + 17));
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

struct Case {
  int ranks;
  DType dtype;
  size_t cap;
  bool average;
};

TEST(GradSync, BucketedEqualsOneAllReducePerTensorBitwise) {
  std::vector<Case> cases;
  for (int n : {1, 2, 3, 4}) {
    for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (size_t cap : {size_t{8}, size_t{4096}, size_t{1} << 30}) {
        cases.push_back({n, t, cap, (cap & 4096) == 0});
      }
    }
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(DTypeName(c.dtype)) + " ranks=" + std::to_string(c.ranks) +
                 " cap=" + std::to_string(c.cap));
    Group::RunInProcess(c.ranks, [&](Group& g) {
      GradSyncOptions o;
      o.bucket_cap_bytes = c.cap;
      o.first_bucket_cap_bytes = std::max<size_t>(c.cap / 4, 1);
      o.average = c.average;
      GradSync sync(g, o);
      const size_t esz = DTypeSize(c.dtype);
      for (size_t p = 0; p < kSizes.size(); ++p) {
        sync.Register("p" + std::to_string(p), kSizes[p], c.dtype);
      }
      sync.Finalize();
      for (int step = 0; step < 2; ++step) {  // step 1 runs on the rebuilt buckets
        sync.ZeroGrad();
        std::vector<std::vector<char>> ref(kSizes.size());
        for (int p : Shuffled(static_cast<int>(kSizes.size()), g.rank(), step)) {
          Fill(c.dtype, sync.Grad(p), kSizes[p], 42, step, g.rank(), p);
          ref[p].assign(static_cast<char*>(sync.Grad(p)),
                        static_cast<char*>(sync.Grad(p)) + kSizes[p] * esz);
          sync.MarkReady(p);
        }
        sync.Finish();
        for (size_t p = 0; p < kSizes.size(); ++p) {
          AllReduce(g, ref[p].data(), ref[p].data(), kSizes[p], c.dtype,
                    c.average ? ReduceOp::kAvg : ReduceOp::kSum)
              .Wait();
          // (An empty parameter has no storage: memcmp may not see its null.)
          ASSERT_TRUE(kSizes[p] == 0 ||
                      std::memcmp(ref[p].data(), sync.Grad(static_cast<int>(p)),
                                  kSizes[p] * esz) == 0)
              << "param " << p << " step " << step;
        }
        if (c.dtype == DType::kF32) {  // and against the canonical order itself
          for (size_t p = 0; p < kSizes.size(); ++p) {
            const float* got = sync.GradAs<float>(static_cast<int>(p));
            for (size_t i = 0; i < kSizes[p]; ++i) {
              float want = Tree<float>(
                  [&](int r) { return Value(42, step, r, static_cast<int>(p), i); }, 0, c.ranks);
              if (c.average) want /= static_cast<float>(c.ranks);
              ASSERT_TRUE(SameBits(got[i], want)) << p << " " << i;
            }
          }
        }
      }
      Barrier(g).Wait();
    });
  }
}

TEST(GradSync, FirstBucketSmallerAndRebuiltFromRankZerosReadyOrder) {
  Group::RunInProcess(2, [&](Group& g) {
    GradSyncOptions o;
    o.bucket_cap_bytes = 400;        // 100 floats
    o.first_bucket_cap_bytes = 160;  // 40 floats
    GradSync sync(g, o);
    for (int p = 0; p < 6; ++p) sync.Register("p" + std::to_string(p), 30, DType::kF32);
    sync.Finalize();
    // Reverse registration order; the first bucket holds one 30-float
    // parameter (two would pass 40 floats), the later ones three.
    EXPECT_EQ(sync.Buckets(), (std::vector<std::vector<int>>{{5}, {4, 3, 2}, {1, 0}}));
    EXPECT_EQ(sync.layout_version(), 0);
    // Rank 0 marks in the order 0..5, rank 1 in another one: rank 0's wins.
    std::vector<int> order = {0, 1, 2, 3, 4, 5};
    if (g.rank() == 1) order = {3, 1, 4, 0, 5, 2};
    sync.ZeroGrad();
    for (int p : order) {
      std::fill_n(sync.GradAs<float>(p), 30, static_cast<float>(p + 10 * g.rank()));
      sync.MarkReady(p);
    }
    sync.Finish();
    EXPECT_EQ(sync.Buckets(), (std::vector<std::vector<int>>{{0}, {1, 2, 3}, {4, 5}}));
    EXPECT_EQ(sync.layout_version(), 1);
    for (int p = 0; p < 6; ++p) {  // the step's result, carried into the new views
      for (int i = 0; i < 30; ++i) ASSERT_EQ(sync.GradAs<float>(p)[i], p + 5.0f);
    }
    // No second rebuild.
    sync.ZeroGrad();
    for (int p : {5, 4, 3, 2, 1, 0}) sync.MarkReady(p);
    sync.Finish();
    EXPECT_EQ(sync.layout_version(), 1);
    Barrier(g).Wait();
  });
}

TEST(GradSync, AccumulatesMicroBatchesWithSyncOff) {
  for (int n : {1, 2, 3}) {
    Group::RunInProcess(n, [&](Group& g) {
      GradSyncOptions o;
      o.bucket_cap_bytes = 1024;
      GradSync sync(g, o);
      const std::vector<size_t> sizes = {300, 5, 77};
      for (size_t p = 0; p < sizes.size(); ++p)
        sync.Register("w" + std::to_string(p), sizes[p], DType::kF32);
      sync.Finalize();
      for (int step = 0; step < 2; ++step) {
        sync.ZeroGrad();
        const int micro = 3;
        for (int m = 0; m < micro; ++m) {
          sync.set_sync(m == micro - 1);
          for (int p : Shuffled(3, g.rank(), m)) {
            std::vector<float> gr(sizes[p]);
            Fill(DType::kF32, gr.data(), sizes[p], 5, 10 * step + m, g.rank(), p);
            sync.MarkReady(p, gr.data());
          }
          sync.Finish();
        }
        for (size_t p = 0; p < sizes.size(); ++p) {
          const float* got = sync.GradAs<float>(static_cast<int>(p));
          for (size_t i = 0; i < sizes[p]; ++i) {
            auto local = [&](int r) {
              float acc = 0.0f;  // the view starts at zero and adds each micro-batch
              for (int m = 0; m < micro; ++m)
                acc += Value(5, 10 * step + m, r, static_cast<int>(p), i);
              return acc;
            };
            const float want = Tree<float>(local, 0, n) / static_cast<float>(n);
            ASSERT_TRUE(SameBits(got[i], want)) << "step " << step << " p " << p << " i " << i;
          }
        }
      }
      Barrier(g).Wait();
    });
  }
}

// Buckets that started while sync was on complete even when sync is turned
// off before Finish: every rank runs them.
TEST(GradSync, SyncTurnedOffAfterBucketsStartedStillFinishesThem) {
  Group::RunInProcess(2, [&](Group& g) {
    GradSync sync(g, {.bucket_cap_bytes = 16, .first_bucket_cap_bytes = 16});
    sync.Register("a", 4, DType::kF32);
    sync.Register("b", 4, DType::kF32);
    sync.Finalize();
    for (int step = 0; step < 2; ++step) {
      sync.ZeroGrad();
      for (int p : {1, 0}) {
        std::fill_n(sync.GradAs<float>(p), 4, float(g.rank() + 1));
        sync.MarkReady(p);
      }
      sync.set_sync(false);
      sync.Finish();
      sync.set_sync(true);
      for (int p : {0, 1}) {
        for (int i = 0; i < 4; ++i) ASSERT_EQ(sync.GradAs<float>(p)[i], 1.5f);
      }
    }
    Barrier(g).Wait();
  });
}

TEST(GradSync, ParametersWithoutAGradientContributeZero) {
  Group::RunInProcess(3, [&](Group& g) {
    GradSyncOptions o;
    o.bucket_cap_bytes = 64;
    o.first_bucket_cap_bytes = 64;
    o.average = false;
    GradSync sync(g, o);
    for (int p = 0; p < 4; ++p) sync.Register("w" + std::to_string(p), 10, DType::kF32);
    sync.Finalize();
    for (int step = 0; step < 3; ++step) {
      sync.ZeroGrad();
      // Parameter 3 is never used; parameter 1 only on rank 2; parameter 0
      // everywhere.
      for (int p : {0, 1, 2}) {
        if (p == 1 && g.rank() != 2) continue;
        std::fill_n(sync.GradAs<float>(p), 10, static_cast<float>(g.rank() + 1));
        sync.MarkReady(p);
      }
      sync.Finish();
      for (int i = 0; i < 10; ++i) {
        ASSERT_EQ(sync.GradAs<float>(0)[i], 6.0f);
        ASSERT_EQ(sync.GradAs<float>(1)[i], 3.0f);
        ASSERT_EQ(sync.GradAs<float>(2)[i], 6.0f);
        ASSERT_EQ(sync.GradAs<float>(3)[i], 0.0f);
      }
    }
    Barrier(g).Wait();
  });
}

TEST(GradSync, ExpertParametersReduceOverTheirGroup) {
  Group::RunInProcess(4, [&](Group& g) {
    // Experts: ranks {0, 2} hold expert set 0, ranks {1, 3} set 1.
    Group edp = g.Split(g.rank() % 2, g.rank());
    GradSyncOptions o;
    o.bucket_cap_bytes = 256;
    o.first_bucket_cap_bytes = 128;
    GradSync sync(g, o);
    const int e = sync.AddGroup(edp);
    const int dense = sync.Register("dense", 50, DType::kF32);
    const int expert = sync.Register("experts", 90, DType::kF32, e);
    const int dense2 = sync.Register("dense2", 20, DType::kF32);
    sync.Finalize();
    for (int step = 0; step < 2; ++step) {
      sync.ZeroGrad();
      for (int p : Shuffled(3, g.rank(), step)) {
        Fill(DType::kF32, sync.Grad(p),
             p == expert  ? 90
             : p == dense ? 50
                          : 20,
             3, step, g.rank(), p);
        sync.MarkReady(p);
      }
      sync.Finish();
      for (int p : {dense, expert, dense2}) {
        const size_t n = p == expert ? 90 : p == dense ? 50 : 20;
        const float* got = sync.GradAs<float>(p);
        for (size_t i = 0; i < n; ++i) {
          float want;
          if (p == expert) {  // members of this rank's edp: world ranks r%2 + 2j
            want = Tree<float>([&](int j) { return Value(3, step, g.rank() % 2 + 2 * j, p, i); }, 0,
                               2) /
                   2.0f;
          } else {
            want = Tree<float>([&](int r) { return Value(3, step, r, p, i); }, 0, 4) / 4.0f;
          }
          ASSERT_TRUE(SameBits(got[i], want)) << p << " " << i;
        }
      }
    }
    Barrier(g).Wait();
  });
}

}  // namespace
}  // namespace mc2
