// MakeGrid and MakeGrid3D: the DP x CP x TP (x EP) x PP process grid of
// include/mc2/models/grid.h.
#include <cstdint>
#include <string>
#include <utility>

#include "mc2/error.h"
#include "mc2/models.h"

namespace mc2::models {

namespace {

[[noreturn]] void Invalid(const Group& world, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "MakeGrid: " + what, world.rank());
}

std::string Str(int v) { return std::to_string(v); }

// w = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index.
ProcessGrid Build(const Group& world, const GridShape& shape) {
  const int tp = shape.tp, pp = shape.pp, ep = shape.ep, cp = shape.cp, dp = shape.dp;
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

void ValidateGridShape(const GridShape& shape, int world_size) {
  auto invalid = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "GridShape: " + what);
  };
  const std::pair<const char*, int> fields[] = {
      {"dp", shape.dp}, {"tp", shape.tp}, {"pp", shape.pp}, {"ep", shape.ep}, {"cp", shape.cp}};
  for (const auto& [name, v] : fields) {
    if (v < 1) invalid(std::string(name) + " = " + Str(v) + " must be >= 1");
  }
  const int64_t product = int64_t{shape.dp} * shape.tp * shape.pp * shape.cp;
  if (product != world_size) {
    invalid("dp * tp * pp * cp = " + Str(shape.dp) + " * " + Str(shape.tp) + " * " +
            Str(shape.pp) + " * " + Str(shape.cp) + " = " + std::to_string(product) +
            " must equal the world size " + Str(world_size));
  }
  if (shape.cp > 1 && shape.ep != 1) {
    invalid("ep = " + Str(shape.ep) + " with cp = " + Str(shape.cp) +
            ": expert parallelism is not combined with context parallelism");
  }
  if (shape.dp % shape.ep != 0) {
    invalid("ep = " + Str(shape.ep) + " must divide dp = " + Str(shape.dp) +
            " (the expert-parallel groups are carved out of the data-parallel replicas)");
  }
}

ProcessGrid MakeGrid(const Group& world, int tp, int ep, int cp) {
  if (!world.valid()) throw Error(ErrorCode::kInvalidArgument, "MakeGrid: invalid world group");
  const int n = world.size();
  if (tp < 1 || n % tp != 0)
    Invalid(world, "tp = " + Str(tp) + " must be >= 1 and divide the " + Str(n) +
                       " ranks of the world");
  if (cp < 1 || (n / tp) % cp != 0)
    Invalid(world, "cp = " + Str(cp) + " must be >= 1 and tp * cp = " + Str(tp * cp) +
                       " must divide the " + Str(n) + " ranks of the world");
  return MakeGrid3D(world, {.dp = n / tp / cp, .tp = tp, .ep = ep, .cp = cp});
}

ProcessGrid MakeGrid3D(const Group& world, const GridShape& shape) {
  if (!world.valid()) throw Error(ErrorCode::kInvalidArgument, "MakeGrid: invalid world group");
  try {
    ValidateGridShape(shape, world.size());
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, e.message(), world.rank());  // with the rank
  }
  return Build(world, shape);
}

}  // namespace mc2::models
