// The reference transformer with context parallelism (ProcessGrid::cp,
// include/mc2/models.h): heads across the TP ranks, the sequence across the
// CP ranks (ring attention). Training on cp x tp grids gives the losses of
// the same model without CP, within a stated tolerance; invalid CP grids
// and configurations fail with kInvalidArgument.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/rank_errors.h"
#include "common/reference_model.h"
#include "mc2/mc2.h"
#include "mc2/models.h"

namespace mc2::models {
namespace {

TransformerConfig Config() {
  TransformerConfig c = TinyConfig();
  c.seq_len = 16;  // 2 * cp chunks for cp 2 and 4, each a multiple of tp 2
  c.task = Task::kCopy;
  c.task_param = 5;  // targets copy the token 5 back: attention across chunks matters
  return c;
}

// Losses of `steps` training steps on ranks = dp * cp * tp, from rank 0
// (every rank computes the same global loss).
std::vector<double> Train(const TransformerConfig& c, int tp, int cp, int dp, int steps) {
  std::vector<double> losses;
  Group::RunInProcess(tp * cp * dp, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, tp, /*ep=*/1, cp);
    EXPECT_EQ(grid.cp_size, cp);
    EXPECT_EQ(grid.cp.size(), cp);
    EXPECT_EQ(grid.dp_size, dp);
    Transformer model(grid, c);
    std::vector<double> mine;
    for (int step = 0; step < steps; ++step) mine.push_back(model.TrainStep(step).loss);
    if (world.rank() == 0) losses = mine;
  });
  return losses;
}

TEST(TransformerCp, TrainingMatchesTheModelWithoutCp) {
  // The same model, weights and batches: CP changes only the order of f32
  // sums (the online softmax of the ring, dK/dV added along the ring,
  // weight gradients summed over more ranks), so each step's loss moves by
  // rounding, of order 1e-7 relative per step, which AdamW's normalised
  // updates (lr 3e-3) carry into the next steps' weights without
  // amplifying past a few times that. Over 6 steps 1e-6 relative bounds
  // it; a wrong position (RoPE, data) or a missed block changes the loss
  // by far more (the copy task needs attention across the chunks).
  const TransformerConfig c = Config();
  const int steps = 6;
  const std::vector<double> base = Train(c, /*tp=*/2, /*cp=*/1, /*dp=*/1, steps);
  ASSERT_EQ(base.size(), static_cast<size_t>(steps));
  EXPECT_LT(base.back(), base.front());  // it learns
  struct Grid {
    int tp, cp, dp;
  };
  for (Grid g : {Grid{2, 2, 1}, Grid{1, 2, 1}, Grid{1, 4, 1}, Grid{2, 2, 2}}) {
    const std::vector<double> got = Train(c, g.tp, g.cp, g.dp, steps);
    ASSERT_EQ(got.size(), base.size());
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(got[i], base[i], 1e-6 * base[i])
          << "tp " << g.tp << " cp " << g.cp << " dp " << g.dp << " step " << i;
    }
  }
}

TEST(TransformerCp, InvalidGridsAndConfigsFail) {
  // seq_len 12 over cp 4: 8 chunks do not divide it (on every rank, before
  // any communication).
  TransformerConfig c = Config();
  c.seq_len = 12;
  const std::vector<int> codes = test::ErrorCodes(
      [&](Group& world) {
        ProcessGrid grid = MakeGrid(world, /*tp=*/1, /*ep=*/1, /*cp=*/4);
        Transformer model(grid, c);
      },
      4);
  for (int code : codes) EXPECT_EQ(code, static_cast<int>(ErrorCode::kInvalidArgument));
  // cp that does not divide the world; cp with ep > 1; cp with MoE layers.
  for (auto [ranks, tp, ep, cp] : {std::tuple{3, 1, 1, 2}, std::tuple{4, 1, 2, 2}}) {
    const std::vector<int> grid_codes =
        test::ErrorCodes([&](Group& world) { MakeGrid(world, tp, ep, cp); }, ranks);
    for (int code : grid_codes)
      EXPECT_EQ(code, static_cast<int>(ErrorCode::kInvalidArgument)) << "cp " << cp;
  }
  TransformerConfig moe = Config();
  moe.moe_experts = 2;
  try {
    ValidateConfig(moe, 1, 1, 1, 2);
    ADD_FAILURE() << "MoE with cp 2 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cp (2)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mc2::models
