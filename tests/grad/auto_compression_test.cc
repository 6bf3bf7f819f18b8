// GradSync's `auto` compression (Compression::kAuto): the decision's
// bookkeeping (src/grad/auto_compression.h) on made-up times, and GradSync
// deciding on two ranks under an injected clock whose step times differ per
// rank and per scheme, so that only the agreement over ranks (max of the
// medians) gives the expected answer. The schedule of dense and lossy
// steps and the expected choice are computed here from the documented
// protocol and the injected times. Real speed is never asserted.
#include "grad/auto_compression.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <ostream>
#include <string>
#include <vector>

#include "mc2/mc2.h"

namespace mc2 {
namespace {

using grad::AutoCompression;
using Next = grad::Autotuner::Next;

TEST(AutoCompression, MeasuresDenseThenLossyAndKeepsLossyOnlyWhenItPays) {
  AutoCompression a(Compression::kBF16, /*warmup=*/1, /*steps=*/2, /*min_speedup=*/1.25);
  EXPECT_FALSE(a.lossy_now());
  EXPECT_EQ(a.OnStep(50), Next::kContinue);  // dense warm-up
  EXPECT_EQ(a.OnStep(4), Next::kContinue);
  EXPECT_EQ(a.OnStep(6), Next::kSwitch);
  EXPECT_TRUE(a.lossy_now());
  EXPECT_EQ(a.chosen(), Compression::kNone);  // not decided yet
  EXPECT_EQ(a.OnStep(50), Next::kContinue);   // lossy warm-up
  EXPECT_EQ(a.OnStep(3), Next::kContinue);
  EXPECT_EQ(a.OnStep(5), Next::kDecide);
  EXPECT_EQ(a.medians(), (std::vector<double>{5, 4}));
  // 5 is not more than 1.25 x 4: compression does not earn its cost.
  EXPECT_EQ(a.Decide(5, 4), Compression::kNone);
  EXPECT_FALSE(a.deciding());
  EXPECT_FALSE(a.lossy_now());
  EXPECT_EQ(a.OnStep(1), Next::kContinue);

  AutoCompression b(Compression::kTopK, 0, 1, 1.25);
  EXPECT_EQ(b.OnStep(9), Next::kSwitch);
  EXPECT_EQ(b.OnStep(2), Next::kDecide);
  EXPECT_EQ(b.Decide(5.01, 4), Compression::kTopK);
  EXPECT_TRUE(b.lossy_now());
  EXPECT_EQ(b.dense_seconds(), 5.01);
  EXPECT_EQ(b.lossy_seconds(), 4);
  EXPECT_NE(b.Describe().find("topk"), std::string::npos);
}

struct Case {
  const char* name;
  Compression lossy;
  int warmup;           // CompressionOptions::warmup_steps
  double cost[2][2];    // [rank][0 dense, 1 lossy]: made-up step seconds
  Compression expected;
};

// Rank 0 alone would keep the lossy scheme in every case; the slowest
// rank's medians decide. Dyadic costs: the clock's differences are exact.
const Case kCases[] = {
    {"pays", Compression::kBF16, 0, {{2.0, 1.0}, {2.5, 1.25}}, Compression::kBF16},
    {"ranks_disagree", Compression::kBF16, 2, {{2.0, 1.0}, {1.0, 3.0}}, Compression::kNone},
    {"marginal", Compression::kTopK, 0, {{2.0, 1.0}, {2.0, 1.9375}}, Compression::kNone},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class GradSyncAuto : public ::testing::TestWithParam<Case> {};

TEST_P(GradSyncAuto, RanksAgreeOnTheChoiceTheMeasurementsSupport) {
  const Case c = GetParam();
  // The documented schedule: step 0 rebuilds the buckets and steps before
  // warmup_steps are uncompressed, neither measured; from step
  // first = max(1, warmup): 1 dense warm-up step, 3 dense timed steps, 1
  // lossy warm-up step, 3 lossy timed steps, then the choice.
  const int first = std::max(1, c.warmup);
  const int decided_after = first + 8;
  auto lossy_step = [&](int s) { return s >= first + 4 && s < decided_after; };
  std::atomic<int> chosen[2] = {-1, -1};
  Group::RunInProcess(2, [&](Group& g) {
    const int me = g.rank();
    double fake_now = 0;
    GradSyncOptions o;
    o.first_bucket_cap_bytes = 64 << 10;
    o.bucket_cap_bytes = 64 << 10;
    o.compression.scheme = Compression::kAuto;
    o.compression.auto_scheme = c.lossy;
    o.compression.topk_ratio = 1.0;  // every element travels: results stay exact
    o.compression.warmup_steps = c.warmup;
    o.compression.auto_min_speedup = 1.05;
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
    EXPECT_TRUE(sync.tuning().compression_deciding);
    EXPECT_EQ(sync.tuning().compression, Compression::kNone);
    for (int step = 0; step < decided_after + 3; ++step) {
      const bool lossy = step >= decided_after ? c.expected != Compression::kNone : lossy_step(step);
      // A lossy step's time; the second timed step of each candidate on
      // rank 0 is an outlier that a mean would not survive.
      double cost = c.cost[me][lossy ? 1 : 0];
      if (me == 0 && (step == first + 2 || step == first + 6)) cost += 100;
      fake_now += cost;
      sync.ZeroGrad();
      for (int p : ids) {
        float* v = sync.GradAs<float>(p);
        for (size_t i = 0; i < n; i += 101) v[i] = static_cast<float>(me + p + step);
        sync.MarkReady(p);
      }
      sync.Finish();
      const GradSyncStats& st = sync.stats();
      ASSERT_EQ(st.scheme, lossy ? c.lossy : Compression::kNone) << "step " << step;
      if (st.scheme == Compression::kBF16) {
        ASSERT_EQ(2 * st.wire_bytes, st.dense_bytes);
      } else if (st.scheme == Compression::kNone) {
        ASSERT_EQ(st.wire_bytes, st.dense_bytes);
      }
      for (int p : ids) {  // the mean of (0 + p + step) and (1 + p + step), exact in bf16
        const float* v = sync.GradAs<float>(p);
        for (size_t i = 0; i < n; i += 101) ASSERT_EQ(v[i], p + step + 0.5f) << step;
        ASSERT_EQ(v[1], 0.f);
      }
      ASSERT_EQ(sync.tuning().compression_deciding, step + 1 < decided_after) << step;
    }
    const GradSyncTuning t = sync.tuning();
    EXPECT_TRUE(t.compression_decided);
    EXPECT_EQ(t.compression, c.expected);
    // The reference: each rank's median of 3 (the outlier is the middle
    // step, so the median is the plain cost), the max over ranks.
    EXPECT_EQ(t.dense_step_seconds, std::max(c.cost[0][0], c.cost[1][0]));
    EXPECT_EQ(t.lossy_step_seconds, std::max(c.cost[0][1], c.cost[1][1]));
    chosen[me] = static_cast<int>(t.compression);
  });
  EXPECT_EQ(chosen[0].load(), chosen[1].load());
  EXPECT_EQ(chosen[0].load(), static_cast<int>(c.expected));
}

INSTANTIATE_TEST_SUITE_P(Cases, GradSyncAuto, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GradSyncAutoOptions, BadOptionsAndMismatchesAreRefused) {
  Group::RunInProcess(1, [](Group& g) {
    auto code = [&](const GradSyncOptions& o) {
      try {
        GradSync s(g, o);
        return 0;
      } catch (const Error& e) {
        return static_cast<int>(e.code());
      }
    };
    const int kInvalid = static_cast<int>(ErrorCode::kInvalidArgument);
    GradSyncOptions o;
    o.compression.scheme = Compression::kAuto;
    EXPECT_EQ(code(o), 0);
    GradSyncOptions bad = o;
    bad.compression.auto_scheme = Compression::kNone;
    EXPECT_EQ(code(bad), kInvalid);
    bad.compression.auto_scheme = Compression::kAuto;
    EXPECT_EQ(code(bad), kInvalid);
    bad = o;
    bad.compression.auto_steps = 0;
    EXPECT_EQ(code(bad), kInvalid);
    bad = o;
    bad.compression.auto_min_speedup = 0.5;
    EXPECT_EQ(code(bad), kInvalid);
    bad = o;
    bad.autotune.enabled = true;
    bad.autotune.thresholds = {1e-3f};
    EXPECT_EQ(code(bad), kInvalid);
    GradSync s(g, o);
    try {
      s.Register("w", 8, DType::kF64);
      ADD_FAILURE() << "f64 with auto compression";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("auto (bf16)"), std::string::npos) << e.what();
    }
    EXPECT_EQ(ParseCompression("auto"), Compression::kAuto);
    EXPECT_STREQ(CompressionName(Compression::kAuto), "auto");
  });
  // auto on one rank, its lossy scheme on the other: kMismatch on both.
  std::atomic<int> mismatches = 0;
  Group::RunInProcess(2, [&](Group& g) {
    GradSyncOptions o;
    o.compression.scheme = g.rank() == 0 ? Compression::kAuto : Compression::kBF16;
    GradSync s(g, o);
    s.Register("w", 8, DType::kF32);
    try {
      s.Finalize();
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kMismatch) ++mismatches;
    }
  });
  EXPECT_EQ(mismatches.load(), 2);
}

}  // namespace
}  // namespace mc2
