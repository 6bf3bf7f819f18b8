// MakeGrid: the DP x CP x TP (x EP) process grid of include/mc2/models.h.
#include <string>

#include "mc2/error.h"
#include "mc2/models.h"

namespace mc2::models {

ProcessGrid MakeGrid(const Group& world, int tp, int ep, int cp) {
  if (!world.valid()) throw Error(ErrorCode::kInvalidArgument, "MakeGrid: invalid world group");
  const int n = world.size();
  if (tp < 1 || n % tp != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "MakeGrid: tp = " + std::to_string(tp) + " must be >= 1 and divide the " +
                    std::to_string(n) + " ranks of the world",
                world.rank());
  }
  if (cp < 1 || n % (tp * cp) != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "MakeGrid: cp = " + std::to_string(cp) + " must be >= 1 and tp * cp = " +
                    std::to_string(tp * cp) + " must divide the " + std::to_string(n) +
                    " ranks of the world",
                world.rank());
  }
  if (cp > 1 && ep != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "MakeGrid: ep = " + std::to_string(ep) + " with cp = " + std::to_string(cp) +
                    ": expert parallelism is not combined with context parallelism",
                world.rank());
  }
  const int dp = n / (tp * cp);
  if (ep < 1 || dp % ep != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "MakeGrid: ep = " + std::to_string(ep) + " must be >= 1 and divide dp = " +
                    std::to_string(dp) + " (the world's " + std::to_string(n) + " ranks / tp " +
                    std::to_string(tp) + ")",
                world.rank());
  }
  ProcessGrid g;
  g.world = world;
  g.tp_size = tp;
  g.dp_size = dp;
  g.ep_size = ep;
  g.cp_size = cp;
  // TP ranks adjacent, then CP: w = (dp_index * cp + cp_index) * tp + tp_index.
  g.tp_rank = world.rank() % tp;
  g.cp_rank = world.rank() / tp % cp;
  g.dp_rank = world.rank() / (tp * cp);
  g.ep_rank = g.dp_rank % ep;
  // Every rank takes part in every Split, in the same order.
  g.tp = world.Split(/*color=*/g.dp_rank * cp + g.cp_rank, /*key=*/g.tp_rank);
  g.dp = world.Split(/*color=*/g.tp_rank, /*key=*/world.rank());
  g.ep = world.Split(/*color=*/g.tp_rank + tp * (g.dp_rank / ep), /*key=*/g.ep_rank);
  g.edp = world.Split(/*color=*/g.ep_rank, /*key=*/world.rank());
  g.cp = world.Split(/*color=*/g.dp_rank * tp + g.tp_rank, /*key=*/g.cp_rank);
  return g;
}

}  // namespace mc2::models
