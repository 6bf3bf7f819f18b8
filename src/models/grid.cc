// MakeGrid and MakeGrid3D: the DP x CP x TP (x EP) x PP process grid of
// include/mc2/models/grid.h.
#include <string>

#include "mc2/error.h"
#include "mc2/models.h"

namespace mc2::models {

namespace {

[[noreturn]] void Invalid(const Group& world, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "MakeGrid: " + what, world.rank());
}

// w = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index.
ProcessGrid Build(const Group& world, int tp, int pp, int ep, int cp) {
  if (!world.valid()) throw Error(ErrorCode::kInvalidArgument, "MakeGrid: invalid world group");
  const int n = world.size();
  const std::string ranks = " ranks of the world";
  if (tp < 1 || n % tp != 0)
    Invalid(world, "tp = " + std::to_string(tp) + " must be >= 1 and divide the " +
                       std::to_string(n) + ranks);
  if (pp < 1 || (n / tp) % pp != 0)
    Invalid(world, "pp = " + std::to_string(pp) + " must be >= 1 and tp * pp (" +
                       std::to_string(tp) + " * " + std::to_string(pp) + ") must divide the " +
                       std::to_string(n) + ranks);
  if (cp < 1 || (n / tp / pp) % cp != 0)
    Invalid(world, "cp = " + std::to_string(cp) + " must be >= 1 and tp * " +
                       (pp > 1 ? "pp * " : "") + "cp = " + std::to_string(tp * pp * cp) +
                       " must divide the " + std::to_string(n) + ranks);
  if (cp > 1 && ep != 1)
    Invalid(world, "ep = " + std::to_string(ep) + " with cp = " + std::to_string(cp) +
                       ": expert parallelism is not combined with context parallelism");
  const int dp = n / tp / pp / cp;
  if (ep < 1 || dp % ep != 0)
    Invalid(world, "ep = " + std::to_string(ep) + " must be >= 1 and divide dp = " +
                       std::to_string(dp) + " (the world's " + std::to_string(n) +
                       " ranks / tp " + std::to_string(tp) +
                       (pp > 1 ? " / pp " + std::to_string(pp) : std::string()) +
                       (cp > 1 ? " / cp " + std::to_string(cp) : std::string()) + ")");
  ProcessGrid g;
  g.world = world;
  g.tp_size = tp;
  g.dp_size = dp;
  g.ep_size = ep;
  g.pp_size = pp;
  g.cp_size = cp;
  const int stage_size = dp * cp * tp;
  const int in_stage = world.rank() % stage_size;
  g.pp_rank = world.rank() / stage_size;
  g.tp_rank = in_stage % tp;
  g.cp_rank = in_stage / tp % cp;
  g.dp_rank = in_stage / (tp * cp);
  g.ep_rank = g.dp_rank % ep;
  // Every rank takes part in every Split, in the same order. The colours
  // keep the groups inside a stage (the s * ... terms are 0 when pp == 1).
  const int s = g.pp_rank;
  g.tp = world.Split(/*color=*/(s * dp + g.dp_rank) * cp + g.cp_rank, /*key=*/g.tp_rank);
  // The CP ranks hold the same weights: their gradients are summed with the
  // data-parallel ones, so dp holds every rank of the stage with this tp_rank.
  g.dp = world.Split(/*color=*/s * tp + g.tp_rank, /*key=*/in_stage);
  g.ep = world.Split(/*color=*/s * stage_size + (g.tp_rank + tp * (g.dp_rank / ep)) * cp +
                         g.cp_rank,
                     /*key=*/g.ep_rank);
  g.edp = world.Split(/*color=*/s * ep + g.ep_rank, /*key=*/world.rank());
  g.cp = world.Split(/*color=*/(s * dp + g.dp_rank) * tp + g.tp_rank, /*key=*/g.cp_rank);
  if (pp == 1) {
    g.stage = world;  // and no pipeline group
  } else {
    g.stage = world.Split(/*color=*/s, /*key=*/in_stage);
    g.pp = world.Split(/*color=*/in_stage, /*key=*/s);
  }
  return g;
}

}  // namespace

ProcessGrid MakeGrid(const Group& world, int tp, int ep, int cp) {
  return Build(world, tp, 1, ep, cp);
}

ProcessGrid MakeGrid3D(const Group& world, int tp, int pp, int ep, int cp) {
  return Build(world, tp, pp, ep, cp);
}

}  // namespace mc2::models
