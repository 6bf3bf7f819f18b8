// GradSync's compression schemes against references computed in the test:
// every rank simulates every rank's gradients, residuals and selections,
// densifies what each would send and reduces it in the canonical order.
// - f16 / bf16: rounded on send, summed in f32, rounded once more;
// - threshold: |g| < t stays home (with and without error feedback);
// - top-k with error feedback, per parameter, over steps across the rebuild;
//   the residual is exactly what was not sent;
// - the bytes reported on the wire.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "grad/codec.h"
#include "grad/grad_reference.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using gradtest::Round16;
using gradtest::SameBits;
using gradtest::Tree;
using gradtest::Value;

const std::vector<size_t> kSizes = {300, 1, 77, 1024, 5};

// Registers kSizes, runs `steps` steps, and checks each against `expect`,
// which returns rank r's densified contribution to element i of param p
// (advancing its own simulated state when called with r == -1 first).
struct Sim {
  int n;
  std::vector<std::vector<std::vector<float>>> res;  // [rank][param][i]
  explicit Sim(int ranks) : n(ranks), res(static_cast<size_t>(ranks)) {
    for (auto& r : res) {
      for (size_t s : kSizes) r.emplace_back(s, 0.0f);
    }
  }
};

void RunScheme(int n, const CompressionOptions& c, int steps) {
  Group::RunInProcess(n, [&](Group& g) {
    GradSyncOptions o;
    o.bucket_cap_bytes = 2048;
    o.first_bucket_cap_bytes = 512;
    o.compression = c;
    GradSync sync(g, o);
    for (size_t p = 0; p < kSizes.size(); ++p)
      sync.Register("w" + std::to_string(p), kSizes[p], DType::kF32);
    sync.Finalize();
    Sim sim(n);
    for (int step = 0; step < steps; ++step) {
      // The dense contribution of each rank this step: [rank][param][i].
      std::vector<std::vector<std::vector<float>>> sent(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        auto& res = sim.res[static_cast<size_t>(r)];
        auto& out = sent[static_cast<size_t>(r)];
        for (size_t p = 0; p < kSizes.size(); ++p) {
          out.emplace_back(kSizes[p], 0.0f);
        }
        if (c.scheme == Compression::kF16 || c.scheme == Compression::kBF16) {
          const DType t = c.scheme == Compression::kBF16 ? DType::kBF16 : DType::kF16;
          for (size_t p = 0; p < kSizes.size(); ++p)
            for (size_t i = 0; i < kSizes[p]; ++i)
              out[p][i] = Round16(t, Value(7, step, r, static_cast<int>(p), i));
        } else if (c.scheme == Compression::kThreshold) {
          for (size_t p = 0; p < kSizes.size(); ++p) {
            for (size_t i = 0; i < kSizes[p]; ++i) {
              float acc = Value(7, step, r, static_cast<int>(p), i);
              if (c.error_feedback) acc += res[p][i];
              const bool send = std::fabs(acc) >= c.threshold;
              out[p][i] = send ? acc : 0.0f;
              if (c.error_feedback) res[p][i] = send ? 0.0f : acc;
            }
          }
        } else {  // top-k of each parameter
          for (size_t p = 0; p < kSizes.size(); ++p) {
            std::vector<float> acc;
            for (size_t i = 0; i < kSizes[p]; ++i) {
              acc.push_back(Value(7, step, r, static_cast<int>(p), i) + res[p][i]);
            }
            const size_t k = std::max<size_t>(
                1, static_cast<size_t>(std::ceil(c.topk_ratio * static_cast<double>(acc.size()))));
            std::vector<size_t> idx(acc.size());
            std::iota(idx.begin(), idx.end(), 0);
            std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t bb) {
              return std::fabs(acc[a]) > std::fabs(acc[bb]);
            });
            std::vector<char> chosen(acc.size(), 0);
            for (size_t j = 0; j < std::min(k, acc.size()); ++j) chosen[idx[j]] = 1;
            for (size_t i = 0; i < acc.size(); ++i) {
              out[p][i] = chosen[i] ? acc[i] : 0.0f;
              res[p][i] = chosen[i] ? 0.0f : acc[i];
            }
          }
        }
      }
      sync.ZeroGrad();
      std::vector<int> order(kSizes.size());
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(static_cast<unsigned>(g.rank() * 31 + step));
      std::shuffle(order.begin(), order.end(), rng);
      for (int p : order) {
        float* v = sync.GradAs<float>(p);
        for (size_t i = 0; i < kSizes[p]; ++i) v[i] = Value(7, step, g.rank(), p, i);
        sync.MarkReady(p);
      }
      sync.Finish();
      const DType t16 = c.scheme == Compression::kBF16 ? DType::kBF16 : DType::kF16;
      const bool cast = c.scheme == Compression::kF16 || c.scheme == Compression::kBF16;
      for (size_t p = 0; p < kSizes.size(); ++p) {
        const float* got = sync.GradAs<float>(static_cast<int>(p));
        for (size_t i = 0; i < kSizes[p]; ++i) {
          float want =
              Tree<float>([&](int r) { return sent[static_cast<size_t>(r)][p][i]; }, 0, n) /
              static_cast<float>(n);
          if (cast) want = Round16(t16, want);
          ASSERT_TRUE(SameBits(got[i], want))
              << CompressionName(c.scheme) << " step " << step << " p " << p << " i " << i << ": "
              << got[i] << " vs " << want;
        }
        // The residual is this rank's simulated one, bit for bit.
        std::span<const float> res = sync.Residual(static_cast<int>(p));
        const bool feedback = c.error_feedback && (c.scheme == Compression::kThreshold ||
                                                   c.scheme == Compression::kTopK);
        ASSERT_EQ(res.size(), feedback ? kSizes[p] : 0u);
        for (size_t i = 0; i < res.size(); ++i) {
          ASSERT_TRUE(SameBits(res[i], sim.res[static_cast<size_t>(g.rank())][p][i]))
              << p << " " << i;
        }
      }
      // What moved: the dense all-reduce for comparison.
      const GradSyncStats& st = sync.stats();
      if (n > 1) {
        size_t total = 0;
        for (size_t s : kSizes) total += s;
        EXPECT_GE(st.dense_bytes,
                  2 * (static_cast<size_t>(n) - 1) * total * 4 / static_cast<size_t>(n) - 64);
        if (cast) {
          EXPECT_LT(st.wire_bytes, st.dense_bytes * 6 / 10);
        }
        if (c.scheme == Compression::kTopK) {
          EXPECT_LT(st.wire_bytes, st.dense_bytes / 4);
        }
      }
    }
    Barrier(g).Wait();
  });
}

TEST(GradCompression, SixteenBitCastsReduceInF32) {
  for (int n : {1, 2, 3, 4}) {
    for (Compression s : {Compression::kF16, Compression::kBF16}) {
      SCOPED_TRACE(n);
      RunScheme(n, {.scheme = s}, 2);
    }
  }
}

TEST(GradCompression, ThresholdDropsSmallValues) {
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(n);
    RunScheme(n, {.scheme = Compression::kThreshold, .error_feedback = false}, 2);
    RunScheme(n, {.scheme = Compression::kThreshold, .threshold = 1e-2f}, 3);
  }
}

TEST(GradCompression, TopKWithErrorFeedbackAcrossTheRebuild) {
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(n);
    RunScheme(n, {.scheme = Compression::kTopK, .topk_ratio = 0.05}, 4);
  }
}

TEST(GradCompression, TheDefaultThresholdIsTheReferenceSystems) {
  EXPECT_EQ(CompressionOptions{}.threshold, 1e-6f);
  for (Compression c : {Compression::kNone, Compression::kF16, Compression::kBF16,
                        Compression::kThreshold, Compression::kTopK, Compression::kPowerSgd}) {
    EXPECT_EQ(ParseCompression(CompressionName(c)), c);
  }
  EXPECT_FALSE(ParseCompression("lowrank").has_value());
}

// The merge of sparse lists equals the dense canonical sum, bit for bit,
// signed zeros included.
TEST(GradCodec, MergeSparseEqualsTheDenseTree) {
  std::mt19937 rng(3);
  for (int n = 1; n <= 7; ++n) {
    const size_t len = 50;
    std::vector<std::vector<float>> dense(static_cast<size_t>(n), std::vector<float>(len, 0.0f));
    std::vector<std::vector<grad::Pair>> lists(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (uint32_t i = 0; i < len; ++i) {
        if (rng() % 3 == 0) continue;
        float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 7.0f;
        if (rng() % 10 == 0) v = -0.0f;
        dense[static_cast<size_t>(r)][i] = v;
        lists[static_cast<size_t>(r)].push_back({i, v});
      }
    }
    std::vector<std::span<const grad::Pair>> spans(lists.begin(), lists.end());
    for (bool avg : {false, true}) {
      std::vector<float> out(len, 1.0f);
      grad::MergeSparse(spans, out.data(), len, avg);
      for (size_t i = 0; i < len; ++i) {
        float want = Tree<float>([&](int r) { return dense[static_cast<size_t>(r)][i]; }, 0, n);
        if (avg) want /= static_cast<float>(n);
        // A one-rank "tree" leaves -0 alone, as ReduceTree does.
        ASSERT_TRUE(SameBits(out[i], want)) << n << " " << i << " " << out[i] << " " << want;
      }
    }
  }
}

}  // namespace
}  // namespace mc2
