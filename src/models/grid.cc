// MakeGrid and MakeGrid3D: the DP x TP (x EP) x PP process grid of
// include/mc2/models.h.
#include <string>

#include "mc2/error.h"
#include "mc2/models.h"

namespace mc2::models {

ProcessGrid MakeGrid(const Group& world, int tp, int ep) { return MakeGrid3D(world, tp, 1, ep); }

ProcessGrid MakeGrid3D(const Group& world, int tp, int pp, int ep) {
  if (!world.valid()) throw Error(ErrorCode::kInvalidArgument, "MakeGrid: invalid world group");
  const int n = world.size();
  if (tp < 1 || n % tp != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "MakeGrid: tp = " + std::to_string(tp) + " must be >= 1 and divide the " +
                    std::to_string(n) + " ranks of the world",
                world.rank());
  }
  if (pp < 1 || (n / tp) % pp != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "MakeGrid: pp = " + std::to_string(pp) + " must be >= 1 and tp * pp (" +
                    std::to_string(tp) + " * " + std::to_string(pp) + ") must divide the " +
                    std::to_string(n) + " ranks of the world",
                world.rank());
  }
  const int dp = n / tp / pp;
  if (ep < 1 || dp % ep != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "MakeGrid: ep = " + std::to_string(ep) + " must be >= 1 and divide dp = " +
                    std::to_string(dp) + " (the world's " + std::to_string(n) +
                    " ranks / tp " + std::to_string(tp) +
                    (pp > 1 ? " / pp " + std::to_string(pp) : std::string()) + ")",
                world.rank());
  }
  ProcessGrid g;
  g.world = world;
  g.tp_size = tp;
  g.dp_size = dp;
  g.ep_size = ep;
  g.pp_size = pp;
  // TP innermost, PP outermost: w = (pp_index * dp + dp_index) * tp + tp_index.
  const int stage_size = dp * tp;
  const int in_stage = world.rank() % stage_size;
  g.pp_rank = world.rank() / stage_size;
  g.tp_rank = in_stage % tp;
  g.dp_rank = in_stage / tp;
  g.ep_rank = g.dp_rank % ep;
  // Every rank takes part in every Split, in the same order. The colours
  // keep the groups inside a stage (pp_rank * ... is 0 when pp == 1).
  const int s = g.pp_rank;
  g.tp = world.Split(/*color=*/s * dp + g.dp_rank, /*key=*/g.tp_rank);
  g.dp = world.Split(/*color=*/s * tp + g.tp_rank, /*key=*/g.dp_rank);
  g.ep = world.Split(/*color=*/s * stage_size + g.tp_rank + tp * (g.dp_rank / ep),
                     /*key=*/g.ep_rank);
  g.edp = world.Split(/*color=*/s * ep + g.ep_rank, /*key=*/world.rank());
  if (pp == 1) {
    g.stage = world;  // and no pipeline group (not split: MakeGrid as before)
  } else {
    g.stage = world.Split(/*color=*/s, /*key=*/in_stage);
    g.pp = world.Split(/*color=*/in_stage, /*key=*/s);
  }
  return g;
}

}  // namespace mc2::models
