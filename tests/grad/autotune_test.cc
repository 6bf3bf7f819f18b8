// GradSync's autotuner: the tuner's bookkeeping (src/grad/autotune.h) on
// made-up step times, and GradSync tuning its bucket cap on two ranks under
// an injected clock whose step times differ per rank, so that only the
// agreement over ranks (max of medians) gives one answer. The expected
// choice is computed here from the injected times. Real speed is never
// asserted.
#include "grad/autotune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <vector>

#include "mc2/mc2.h"

namespace mc2 {
namespace {

using grad::Autotuner;
using Next = grad::Autotuner::Next;

TEST(Autotuner, VisitsEveryCandidateAndPicksTheLowestMedian) {
  Autotuner t({{1, 0}, {2, 0}, {3, 0}}, /*warmup=*/1, /*steps=*/3);
  // Candidate 0: median 5 (mean 20); 1: median 6 (mean 6); 2: median 7.
  const std::vector<std::vector<double>> times = {{100, 5, 5, 50}, {100, 6, 6, 6}, {100, 7, 1, 9}};
  for (size_t c = 0; c < times.size(); ++c) {
    EXPECT_EQ(t.current(), c);
    for (size_t s = 0; s < times[c].size(); ++s) {
      const Next want = s + 1 < times[c].size() ? Next::kContinue
                        : c + 1 < times.size()  ? Next::kSwitch
                                                : Next::kDecide;
      EXPECT_EQ(t.OnStep(times[c][s]), want) << c << " " << s;
    }
  }
  EXPECT_EQ(t.medians(), (std::vector<double>{5, 6, 7}));
  EXPECT_TRUE(t.tuning());
  // Another rank was slower with candidate 0: the agreed medians decide.
  EXPECT_EQ(t.Decide({8, 6, 7}), 1u);
  EXPECT_FALSE(t.tuning());
  EXPECT_EQ(t.OnStep(1), Next::kContinue);
  EXPECT_EQ(t.current(), 1u);
}

TEST(Autotuner, TiesGoToTheEarlierCandidateAndUnmeasuredStepsDoNotCount) {
  Autotuner t({{1, 0}, {2, 0}}, /*warmup=*/0, /*steps=*/1);
  EXPECT_EQ(t.OnStep(-1), Next::kContinue);  // not measured
  EXPECT_EQ(t.OnStep(4), Next::kSwitch);
  EXPECT_EQ(t.OnStep(4), Next::kDecide);
  EXPECT_EQ(t.Decide({4, 4}), 0u);
}

// Step time (made-up seconds) of `rank` with bucket cap `cap`: rank 0 alone
// would pick 256 KiB, rank 1 alone 64 KiB; the slowest rank's times pick
// 1 MiB. Rank 0's second timed step with 1 MiB is an outlier that a mean
// would not survive.
double StepCost(int rank, size_t cap, int timed_step) {
  static const std::map<size_t, double> r0 = {{64 << 10, 3.0}, {256 << 10, 1.0}, {1 << 20, 2.0}};
  static const std::map<size_t, double> r1 = {{64 << 10, 1.5}, {256 << 10, 2.5}, {1 << 20, 2.0}};
  if (rank == 0 && cap == (1 << 20) && timed_step == 1) return 100.0;
  return (rank == 0 ? r0 : r1).at(cap);
}

TEST(GradSyncAutotune, RanksAgreeOnTheCandidateTheMeasurementsSupport) {
  const std::vector<size_t> caps = {64 << 10, 256 << 10, 1 << 20};
  std::atomic<size_t> chosen[2] = {0, 0};
  Group::RunInProcess(2, [&](Group& g) {
    const int me = g.rank();
    double fake_now = 0;
    GradSyncOptions o;
    o.bucket_cap_bytes = 1;  // replaced by the candidates
    o.first_bucket_cap_bytes = 32 << 10;
    o.autotune.enabled = true;
    o.autotune.bucket_caps = caps;
    o.autotune.warmup_steps = 1;
    o.autotune.steps_per_candidate = 3;
    o.autotune.clock = [&fake_now] { return fake_now; };
    GradSync sync(g, o);
    const size_t n = 30000;  // 120 KB per parameter
    std::vector<int> ids;
    for (int p = 0; p < 6; ++p) {
      std::string name = "p";  // not "p" + ...: GCC 12 warns falsely (-Wrestrict)
      name += std::to_string(p);
      ids.push_back(sync.Register(name, n, DType::kF32));
    }
    sync.Finalize();
    EXPECT_EQ(sync.tuning().bucket_cap_bytes, caps[0]);
    EXPECT_TRUE(sync.tuning().tuning);
    int steps_on_cap = 0;
    size_t last_cap = caps[0];
    const int total_steps = 1 + 3 * (1 + 3) + 2;
    for (int step = 0; step < total_steps; ++step) {
      const size_t cap = sync.tuning().bucket_cap_bytes;
      if (cap != last_cap) steps_on_cap = 0;
      last_cap = cap;
      // The first step of a candidate is its warmup; timed steps follow.
      fake_now += StepCost(me, cap, steps_on_cap - 1);
      ++steps_on_cap;
      sync.ZeroGrad();
      for (int p : ids) {
        float* v = sync.GradAs<float>(p);
        for (size_t i = 0; i < n; i += 997) v[i] = static_cast<float>(me + p + step);
        sync.MarkReady(p);
      }
      sync.Finish();
      for (int p : ids) {  // the mean of (0 + p + step) and (1 + p + step)
        const float* v = sync.GradAs<float>(p);
        for (size_t i = 0; i < n; i += 997) ASSERT_EQ(v[i], p + step + 0.5f) << step;
        ASSERT_EQ(v[1], 0.f);
      }
    }
    const GradSyncTuning t = sync.tuning();
    EXPECT_TRUE(t.decided);
    EXPECT_FALSE(t.tuning);
    EXPECT_EQ(t.candidate_caps, caps);
    // The reference: per candidate the median of each rank's timed steps,
    // the max over ranks, the lowest of those.
    std::vector<double> agreed;
    for (size_t cap : caps) {
      double worst = 0;
      for (int r = 0; r < 2; ++r) {
        std::vector<double> v = {StepCost(r, cap, 0), StepCost(r, cap, 1), StepCost(r, cap, 2)};
        std::sort(v.begin(), v.end());
        worst = std::max(worst, v[1]);
      }
      agreed.push_back(worst);
    }
    EXPECT_EQ(t.median_seconds, agreed);
    const size_t best = std::min_element(agreed.begin(), agreed.end()) - agreed.begin();
    EXPECT_EQ(t.bucket_cap_bytes, caps[best]);
    EXPECT_EQ(caps[best], size_t{1} << 20);
    chosen[me] = t.bucket_cap_bytes;
    // The buckets follow the chosen cap.
    for (const auto& b : sync.Buckets())
      EXPECT_LE(b.size() * n * 4, std::max<size_t>(caps[best], n * 4));
  });
  EXPECT_EQ(chosen[0].load(), chosen[1].load());
}

TEST(GradSyncAutotune, ThresholdCandidatesAndBadOptions) {
  Group::RunInProcess(1, [](Group& g) {
    GradSyncOptions o;
    o.autotune.enabled = true;
    o.autotune.steps_per_candidate = 0;
    EXPECT_THROW(GradSync(g, o), Error);
    o.autotune.steps_per_candidate = 1;
    o.autotune.thresholds = {1e-3f};
    try {
      GradSync s(g, o);
      ADD_FAILURE() << "thresholds without threshold compression";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
    o.autotune.bucket_caps = {};
    o.autotune.thresholds = {};
    EXPECT_THROW(GradSync(g, o), Error);
    // Cap x threshold candidates, in that order.
    o.autotune.bucket_caps = {1 << 20, 4 << 20};
    o.autotune.thresholds = {0.f, 1e-3f};
    o.compression.scheme = Compression::kThreshold;
    GradSync s(g, o);
    s.Register("w", 16, DType::kF32);
    s.Finalize();
    const GradSyncTuning t = s.tuning();
    EXPECT_EQ(t.candidate_caps, (std::vector<size_t>{1 << 20, 1 << 20, 4 << 20, 4 << 20}));
    EXPECT_EQ(t.candidate_thresholds, (std::vector<float>{0.f, 1e-3f, 0.f, 1e-3f}));
    EXPECT_EQ(t.threshold, 0.f);
  });
}

}  // namespace
}  // namespace mc2
