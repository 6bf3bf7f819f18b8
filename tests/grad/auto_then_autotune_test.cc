// GradSync with both `auto` compression and the bucket-cap autotuner: the
// compression is decided first, from its own steps, and the autotuner
// measures the caps after it, with the chosen scheme. Step times come from
// an injected clock; the schedule and the expected choices are computed
// here from the documented protocol. Real speed is never asserted.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "mc2/mc2.h"

namespace mc2 {
namespace {

TEST(GradSyncAutoThenAutotune, CompressionIsDecidedFirstThenTheCap) {
  const std::vector<size_t> caps = {64 << 10, 256 << 10};
  // auto: step 0 rebuilds; steps 1-4 dense (1 warm-up, 3 timed), 5-8
  // lossy; decided after step 8. Autotune: steps 9-12 the first cap (1
  // warm-up, 3 timed), 13-16 the second; decided after step 16.
  const int auto_done = 9, tune_done = 17;
  std::atomic<int> agreed_cap[2] = {0, 0};
  Group::RunInProcess(2, [&](Group& g) {
    const int me = g.rank();
    double fake_now = 0;
    GradSyncOptions o;
    o.first_bucket_cap_bytes = 32 << 10;
    o.compression.scheme = Compression::kAuto;  // bf16 against dense
    o.autotune.enabled = true;
    o.autotune.bucket_caps = caps;
    o.autotune.clock = [&fake_now] { return fake_now; };
    GradSync sync(g, o);
    const size_t n = 20000;
    std::vector<int> ids;
    for (int p = 0; p < 4; ++p) {
      std::string name = "p";
      name += std::to_string(p);
      ids.push_back(sync.Register(name, n, DType::kF32));
    }
    sync.Finalize();
    for (int step = 0; step < tune_done + 2; ++step) {
      const bool lossy = step >= 5;  // measured from 5 on, then kept
      double cost;
      if (step < auto_done) {
        cost = lossy ? 1.0 : 2.0;  // bf16 pays
      } else {
        // The cap in use for this step: the slower first cap on both ranks.
        cost = sync.tuning().bucket_cap_bytes == caps[0] ? 3.0 + me : 1.0;
      }
      fake_now += cost;
      sync.ZeroGrad();
      for (int p : ids) {
        float* v = sync.GradAs<float>(p);
        for (size_t i = 0; i < n; i += 101) v[i] = static_cast<float>(me + p + step);
        sync.MarkReady(p);
      }
      sync.Finish();
      ASSERT_EQ(sync.stats().scheme, lossy ? Compression::kBF16 : Compression::kNone) << step;
      for (int p : ids) {  // exact in bf16
        const float* v = sync.GradAs<float>(p);
        for (size_t i = 0; i < n; i += 101) ASSERT_EQ(v[i], p + step + 0.5f) << step;
      }
      const GradSyncTuning t = sync.tuning();
      ASSERT_EQ(t.compression_deciding, step + 1 < auto_done) << step;
      ASSERT_EQ(t.tuning, step + 1 < tune_done) << step;
    }
    const GradSyncTuning t = sync.tuning();
    EXPECT_EQ(t.compression, Compression::kBF16);
    EXPECT_EQ(t.dense_step_seconds, 2.0);
    EXPECT_EQ(t.lossy_step_seconds, 1.0);
    // Medians per cap, max over the ranks: {3 + 1, 1}.
    EXPECT_EQ(t.median_seconds, (std::vector<double>{4.0, 1.0}));
    EXPECT_EQ(t.bucket_cap_bytes, caps[1]);
    agreed_cap[me] = static_cast<int>(t.bucket_cap_bytes);
  });
  EXPECT_EQ(agreed_cap[0].load(), agreed_cap[1].load());
}

}  // namespace
}  // namespace mc2
