// GradSync's fusion of small buckets into one Batch exchange: every
// parameter's result must be bitwise the one a separate all-reduce of that
// tensor gives (deterministic mode), with fusion on and off, whatever order
// each rank marks its gradients in (the ranks must still issue the same
// collectives), for f32 and bf16 buckets, with sum and mean.
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

using gradtest::Value;

struct P {
  size_t count;
  DType dtype;
};

std::vector<P> Params() {
  std::vector<P> ps;
  for (size_t i = 0; i < 24; ++i) ps.push_back({1 + (i * 37) % 300, i % 5 == 4 ? DType::kBF16 : DType::kF32});
  ps.push_back({70000, DType::kF32});  // above fuse_bucket_bytes: on its own
  return ps;
}

void Fill(void* v, const P& p, int step, int rank, size_t id) {
  for (size_t i = 0; i < p.count; ++i) {
    const float x = Value(11, step, rank, static_cast<int>(id), i);
    if (p.dtype == DType::kF32)
      static_cast<float*>(v)[i] = x;
    else
      static_cast<uint16_t*>(v)[i] = core::F32ToBF16(x);
  }
}

// Marks every parameter (in a rank-dependent order when `shuffled`, or
// none at all when `tail_in_finish`), finishes, and compares each view
// bitwise with a separate all-reduce of the same tensor.
void RunFused(int n, bool fuse, bool average, bool shuffled, bool tail_in_finish) {
  Group::RunInProcess(n, [&](Group& g) {
    const std::vector<P> ps = Params();
    GradSyncOptions o;
    o.bucket_cap_bytes = 1024;  // many small buckets
    o.first_bucket_cap_bytes = 256;
    o.average = average;
    o.fuse_buckets = fuse;
    o.fuse_bucket_bytes = 4096;
    GradSync sync(g, o);
    for (size_t p = 0; p < ps.size(); ++p)
      sync.Register("p" + std::to_string(p), ps[p].count, ps[p].dtype);
    sync.Finalize();
    int fused = 0;
    for (int step = 0; step < 3; ++step) {
      std::vector<int> order(ps.size());
      std::iota(order.begin(), order.end(), 0);
      std::reverse(order.begin(), order.end());
      if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937(g.rank() * 31 + step));
      sync.ZeroGrad();
      for (int p : order) {
        Fill(sync.Grad(p), ps[p], step, g.rank(), p);
        if (!tail_in_finish) sync.MarkReady(p);
      }
      sync.Finish();
      fused += sync.stats().fused_exchanges;
      for (size_t p = 0; p < ps.size(); ++p) {
        const size_t bytes = ps[p].count * DTypeSize(ps[p].dtype);
        std::vector<char> in(bytes), want(bytes);
        Fill(in.data(), ps[p], step, g.rank(), p);
        AllReduce(g, in.data(), want.data(), ps[p].count, ps[p].dtype,
                  average ? ReduceOp::kAvg : ReduceOp::kSum)
            .Wait();
        ASSERT_EQ(std::memcmp(sync.Grad(static_cast<int>(p)), want.data(), bytes), 0)
            << "parameter " << p << " step " << step;
      }
    }
    if (fuse)
      EXPECT_GT(fused, 0);
    else
      EXPECT_EQ(fused, 0);
  });
}

TEST(FusedBuckets, TailOfBackwardBitwiseEqualsPerTensorAllReduces) {
  RunFused(2, true, true, false, false);
}
TEST(FusedBuckets, ShuffledMarksOnThreeRanksSummed) { RunFused(3, true, false, true, false); }
TEST(FusedBuckets, BucketsStartedByFinish) { RunFused(2, true, true, false, true); }
TEST(FusedBuckets, OffIsOneAllReducePerBucket) { RunFused(2, false, true, true, false); }

TEST(FusedBuckets, ZeroFuseBytesIsRefused) {
  Group::RunInProcess(1, [&](Group& g) {
    GradSyncOptions o;
    o.fuse_bucket_bytes = 0;
    EXPECT_THROW(GradSync(g, o), Error);
    o.fuse_buckets = false;
    GradSync ok(g, o);
  });
}

}  // namespace
}  // namespace mc2
