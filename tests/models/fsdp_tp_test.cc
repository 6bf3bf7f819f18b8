// Sharded data parallelism with tensor parallelism (FsdpTransformer on a
// MakeGrid(world, tp) grid, include/mc2/models.h):
// - DP 2 x TP 2 on 4 ranks: losses and trained parameters bitwise equal to
//   plain DP x TP (shard = false: the same TP blocks, each unit's gradient
//   all-reduced over DP), for prefetch 0, 1 and 2 (serial TP operators)
//   and 1 (chunked);
// - every TP rank starts from exactly its slices of the reference
//   Transformer at tp 2, and training follows the reference Transformer on
//   the same DP x TP grid within a tolerance;
// - invalid grids and configurations fail with kInvalidArgument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/reference_model.h"
#include "mc2/mc2.h"
#include "mc2/models.h"

namespace mc2::models {
namespace {

// TinyConfig (hidden 16, 4 heads, ffn 32, 2 blocks, vocabulary 16) with 8
// sequences (2 per DP rank and micro-step of the chunked pipeline) and
// weight decay on the shards (padding is fsdp_test's: every unit here has
// an even size).
TransformerConfig Config() {
  TransformerConfig c = TinyConfig();
  c.batch = 8;
  c.weight_decay = 0.1f;
  c.fused.pipeline = Pipeline::kSerial;
  return c;
}

struct TrainRun {
  std::vector<double> losses;
  // Per world rank: its TP rank's tensors after training.
  std::vector<std::vector<std::pair<std::string, std::vector<float>>>> params;
};

TrainRun Train(int tp, int dp, const TransformerConfig& c, const FsdpOptions& o, int steps) {
  const int ranks = tp * dp;
  TrainRun out;
  out.params.resize(ranks);
  std::vector<std::vector<double>> per_rank(ranks);
  std::mutex mu;
  Group::RunInProcess(ranks, [&](Group& world) {
    const ProcessGrid grid = MakeGrid(world, tp);
    FsdpTransformer model(grid, c, o);
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) losses.push_back(model.TrainStep(s).loss);
    auto params = model.GatherParameters();
    std::lock_guard<std::mutex> lock(mu);
    per_rank[world.rank()] = losses;
    out.params[world.rank()] = std::move(params);
  });
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(per_rank[r], per_rank[0]) << "rank " << r;
  out.losses = per_rank[0];
  return out;
}

void ExpectBitwise(const TrainRun& got, const TrainRun& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_EQ(std::memcmp(&got.losses[s], &ref.losses[s], sizeof(double)), 0)
        << "step " << s << ": " << got.losses[s] << " vs " << ref.losses[s];
  }
  for (size_t r = 0; r < ref.params.size(); ++r) {
    ASSERT_EQ(got.params[r].size(), ref.params[r].size());
    for (size_t i = 0; i < ref.params[r].size(); ++i) {
      const auto& [name, want] = ref.params[r][i];
      EXPECT_EQ(got.params[r][i].first, name);
      EXPECT_TRUE(want.size() == got.params[r][i].second.size() &&
                  std::memcmp(want.data(), got.params[r][i].second.data(),
                              want.size() * sizeof(float)) == 0)
          << "rank " << r << " " << name;
    }
  }
}

TEST(FsdpTp, BitwiseEqualToPlainDpTimesTp) {
  const int steps = 3;
  for (Pipeline pipeline : {Pipeline::kSerial, Pipeline::kChunked}) {
    TransformerConfig c = Config();
    c.fused.pipeline = pipeline;
    c.fused.splits = 2;
    FsdpOptions plain;
    plain.shard = false;
    const TrainRun ref = Train(/*tp=*/2, /*dp=*/2, c, plain, steps);
    ASSERT_EQ(ref.losses.size(), size_t(steps));
    // Every depth with the serial operators; the chunked ones at depth 1
    // (their arithmetic is the serial one's: deterministic mode).
    for (int depth : pipeline == Pipeline::kSerial ? std::vector<int>{0, 1, 2}
                                                   : std::vector<int>{1}) {
      SCOPED_TRACE(std::string(pipeline == Pipeline::kSerial ? "serial" : "chunked") +
                   ", prefetch " + std::to_string(depth));
      FsdpOptions o;
      o.prefetch = depth;
      ExpectBitwise(Train(2, 2, c, o, steps), ref);
    }
  }
}

// Every TP rank's FSDP model starts from its slices of the reference
// Transformer at tp 2 (bitwise), and training follows the Transformer on
// the same DP 2 x TP 2 grid: not bitwise (the Transformer sums the
// replicated tensors' gradients over the world in one all-reduce and
// buckets the rest differently, FSDP sums over TP then DP per unit, and
// its deferred optimizer splits the same arithmetic differently), so
// within 1e-4 relative over a few AdamW steps, as FSDP without TP against
// the Transformer; a wrong slice, a TP sum missed or a row taken twice
// moves the loss by far more.
TEST(FsdpTp, MatchesTheReferenceTransformerOnTheSameGrid) {
  const TransformerConfig c = Config();
  const int tp = 2, dp = 2, steps = 4;
  FsdpOptions o;
  o.prefetch = 1;
  const TrainRun start = Train(tp, dp, c, o, 0);
  std::vector<double> ref_losses;
  std::mutex mu;
  Group::RunInProcess(tp * dp, [&](Group& world) {
    const ProcessGrid grid = MakeGrid(world, tp);
    Transformer model(grid, c);
    std::vector<ParamView> views = model.Parameters();
    const auto& mine = start.params[world.rank()];
    EXPECT_EQ(views.size(), mine.size());
    for (size_t i = 0; i < std::min(views.size(), mine.size()); ++i) {
      EXPECT_EQ(views[i].name, mine[i].first);
      ASSERT_EQ(views[i].rows * views[i].cols, mine[i].second.size()) << views[i].name;
      EXPECT_EQ(std::memcmp(views[i].value, mine[i].second.data(),
                            mine[i].second.size() * sizeof(float)),
                0)
          << "rank " << world.rank() << " " << views[i].name;
    }
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) losses.push_back(model.TrainStep(s).loss);
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) ref_losses = losses;
  });
  const TrainRun got = Train(tp, dp, c, o, steps);
  ASSERT_EQ(ref_losses.size(), size_t(steps));
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(got.losses[s], ref_losses[s], 1e-4 * ref_losses[s]) << "step " << s;
  }
}

TEST(FsdpTp, InvalidGridsAndConfigsFail) {
  auto codes = [](int ranks, auto make) {
    std::mutex mu;
    int thrown = 0;
    Group::RunInProcess(ranks, [&](Group& world) {
      try {
        make(world);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
        std::lock_guard<std::mutex> lock(mu);
        ++thrown;
      }
    });
    return thrown;
  };
  // ffn 30 cannot be split over tp 4.
  TransformerConfig odd = Config();
  odd.ffn = 30;
  EXPECT_EQ(codes(4, [&](Group& w) { FsdpTransformer m(MakeGrid(w, 4), odd); }), 4);
  // A pipeline grid is not an FSDP grid.
  EXPECT_EQ(codes(4,
                  [&](Group& w) {
                    FsdpTransformer m(MakeGrid3D(w, {.dp = 2, .pp = 2}), Config());
                  }),
            4);
  // 7 sequences cannot be split over dp 2.
  TransformerConfig seven = Config();
  seven.batch = 7;
  EXPECT_EQ(codes(4, [&](Group& w) { FsdpTransformer m(MakeGrid(w, 2), seven); }), 4);
}

}  // namespace
}  // namespace mc2::models
