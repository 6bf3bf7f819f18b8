// The reference transformer with compressed gradient exchanges
// (TransformerConfig::grad_compression) at DP = 2 and DP = 2 x EP = 2:
// - bf16: every gradient within bf16 rounding of the uncompressed one, from
//   the same weights and batch;
// - top-k with error feedback: the exchange changes the training (losses
//   differ from the uncompressed run) and the model still learns;
// - an invalid setting fails when the model is built.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "common/reference_model.h"
#include "mc2/mc2.h"
#include "mc2/models.h"

namespace mc2::models {
namespace {

TEST(TransformerCompression, Bf16GradientsWithinRoundingOfUncompressed) {
  for (int ep : {1, 2}) {
    SCOPED_TRACE(ep);
    TransformerConfig c = TinyConfig();
    if (ep == 2) c.moe_experts = 4;
    Group::RunInProcess(4, [&](Group& world) {
      ProcessGrid grid = MakeGrid(world, 2, ep);  // TP 2 x DP 2
      TransformerConfig cb = c;
      cb.grad_compression.scheme = Compression::kBF16;
      Transformer plain(grid, c), bf(grid, cb);
      plain.ForwardBackward(0);
      bf.ForwardBackward(0);
      auto pa = plain.Parameters(), pb = bf.Parameters();
      ASSERT_EQ(pa.size(), pb.size());
      size_t differ = 0;
      for (size_t t = 0; t < pa.size(); ++t) {
        const size_t n = pa[t].rows * pa[t].cols;
        float scale = 0;
        for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(pa[t].grad[i]));
        for (size_t i = 0; i < n; ++i) {
          // Two roundings to bf16 (8 significant bits) of values at most
          // `scale` in magnitude, summed over 2 or 4 ranks.
          ASSERT_NEAR(pb[t].grad[i], pa[t].grad[i], 4 * scale / 128 + 1e-30f)
              << pa[t].name << " " << i;
          differ += pb[t].grad[i] != pa[t].grad[i];
        }
      }
      EXPECT_GT(differ, 0u);  // the compression did happen
    });
  }
}

TEST(TransformerCompression, TopKWithErrorFeedbackStillLearns) {
  TransformerConfig c = TinyConfig();
  c.lr = 1e-2f;
  std::vector<double> plain, topk;
  std::mutex mu;
  for (bool compress : {false, true}) {
    TransformerConfig cc = c;
    if (compress) {
      cc.grad_compression.scheme = Compression::kTopK;
      cc.grad_compression.topk_ratio = 0.1;
    }
    Group::RunInProcess(2, [&](Group& world) {
      auto st = TrainSteps(world, cc, 1, 30);
      std::lock_guard<std::mutex> lock(mu);
      if (world.rank() != 0) return;
      for (auto& s : st) (compress ? topk : plain).push_back(s.loss);
    });
  }
  ASSERT_EQ(topk.size(), 30u);
  EXPECT_EQ(topk[0], plain[0]);  // the same first forward
  EXPECT_NE(topk.back(), plain.back());
  EXPECT_LT(topk.back(), 0.8 * topk.front());
}

TEST(TransformerCompression, InvalidSettingFailsAtConstruction) {
  Group::RunInProcess(2, [&](Group& world) {
    TransformerConfig c = TinyConfig();
    c.grad_compression.scheme = Compression::kTopK;
    c.grad_compression.topk_ratio = 2.0;
    ProcessGrid grid = MakeGrid(world, 1);
    try {
      Transformer t(grid, c);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("topk_ratio"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace mc2::models
