// CompressedAllReduce (one compressed exchange outside GradSync) against
// references computed in the test: every rank simulates every rank's data
// and residual, selects or rounds, and reduces in the canonical tree order.
// - top-k over segments, with the caller's residual, over several calls:
//   results bitwise, the residual exactly what was not sent;
// - bf16: rounded on send, summed in f32, rounded once more;
// - bad arguments throw kInvalidArgument before any communication.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "grad/grad_reference.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using gradtest::Round16;
using gradtest::SameBits;
using gradtest::Tree;
using gradtest::Value;

constexpr size_t kCount = 257;
const std::vector<size_t> kSegments = {0, 100, 101, 200};

// g with the top-k of each segment kept, the rest zero (ties to the lower index).
std::vector<float> TopK(const std::vector<float>& g, double ratio) {
  std::vector<float> sent(g.size(), 0.0f);
  for (size_t s = 0; s < kSegments.size(); ++s) {
    size_t a = kSegments[s], b = s + 1 < kSegments.size() ? kSegments[s + 1] : g.size();
    std::vector<size_t> idx(b - a);
    std::iota(idx.begin(), idx.end(), a);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t x, size_t y) { return std::fabs(g[x]) > std::fabs(g[y]); });
    size_t k = std::max<size_t>(1, static_cast<size_t>(std::ceil(ratio * static_cast<double>(b - a))));
    for (size_t j = 0; j < k && j < idx.size(); ++j) sent[idx[j]] = g[idx[j]];
  }
  return sent;
}

TEST(CompressedAllReduce, TopKWithTheCallersResidual) {
  const int n = 3;
  const double ratio = 0.05;
  Group::RunInProcess(n, [&](Group& g) {
    std::vector<std::vector<float>> res(n, std::vector<float>(kCount, 0.0f));
    std::vector<float> mine_res(kCount, 0.0f);
    for (int call = 0; call < 3; ++call) {
      std::vector<std::vector<float>> sent(n);
      for (int r = 0; r < n; ++r) {
        std::vector<float> x(kCount);
        for (size_t i = 0; i < kCount; ++i) x[i] = Value(7, call, r, 0, i) + res[r][i];
        sent[r] = TopK(x, ratio);
        for (size_t i = 0; i < kCount; ++i) res[r][i] = x[i] - sent[r][i];
      }
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = Value(7, call, g.rank(), 0, i);
      CompressionOptions c;
      c.scheme = Compression::kTopK;
      c.topk_ratio = ratio;
      CompressedAllReduce op(g, data.data(), kCount, c, /*average=*/true, mine_res, kSegments);
      op.Start();
      op.Finish();
      for (size_t i = 0; i < kCount; ++i) {
        float want = Tree<float>([&](int r) { return sent[r][i]; }, 0, n) / static_cast<float>(n);
        ASSERT_TRUE(SameBits(data[i], want)) << "call " << call << " element " << i;
        ASSERT_TRUE(SameBits(mine_res[i], res[g.rank()][i])) << "residual " << i;
      }
      size_t k = 0;
      for (float v : sent[g.rank()]) k += v != 0.0f;
      EXPECT_EQ(op.stats().wire_bytes, (n - 1) * op.stats().sent_elements * 8);
      EXPECT_GE(op.stats().sent_elements, k);
    }
  });
}

TEST(CompressedAllReduce, Bf16SumsInF32) {
  const int n = 3;
  Group::RunInProcess(n, [&](Group& g) {
    std::vector<float> data(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = Value(9, 0, g.rank(), 0, i);
    CompressionOptions c;
    c.scheme = Compression::kBF16;
    CompressedAllReduce op(g, data.data(), kCount, c, /*average=*/false);
    op.Start();
    op.Finish();
    for (size_t i = 0; i < kCount; ++i) {
      float sum = Tree<float>([&](int r) { return Round16(DType::kBF16, Value(9, 0, r, 0, i)); },
                              0, n);
      ASSERT_TRUE(SameBits(data[i], Round16(DType::kBF16, sum))) << i;
    }
  });
}

TEST(CompressedAllReduce, BadArgumentsThrowBeforeCommunicating) {
  Group::RunInProcess(2, [&](Group& g) {
    std::vector<float> data(8, 1.0f), res(8, 0.0f), short_res(7, 0.0f);
    CompressionOptions topk;
    topk.scheme = Compression::kTopK;
    CompressionOptions bf16;
    bf16.scheme = Compression::kBF16;
    auto code = [&](auto&& make) {
      try {
        make();
      } catch (const Error& e) {
        return e.code();
      }
      return ErrorCode::kInternal;
    };
    EXPECT_EQ(code([&] { CompressedAllReduce(g, data.data(), 8, bf16, true, res); }),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(code([&] { CompressedAllReduce(g, data.data(), 8, topk, true, short_res); }),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(code([&] { CompressedAllReduce(g, data.data(), 8, topk, true, {}, {0, 8}); }),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(code([&] { CompressedAllReduce(g, data.data(), 8, topk, true, {}, {1}); }),
              ErrorCode::kInvalidArgument);
    topk.topk_ratio = 0;
    EXPECT_EQ(code([&] { CompressedAllReduce(g, data.data(), 8, topk, true); }),
              ErrorCode::kInvalidArgument);
    // The group still works.
    CompressedAllReduce ok(g, data.data(), 8, bf16, false);
    ok.Start();
    ok.Finish();
    EXPECT_EQ(data[0], 2.0f);
  });
}

}  // namespace
}  // namespace mc2
