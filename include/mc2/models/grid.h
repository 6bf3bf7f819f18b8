// mc2/models/grid.h: the process grid the reference workloads run on:
// the tensor, data, expert, pipeline and context parallel groups of a world
// (grid.cc; docs/models.md).
#ifndef MC2_MODELS_GRID_H_
#define MC2_MODELS_GRID_H_

#include "mc2/group.h"

namespace mc2::models {

// Process grid.
//
// World rank w = dp_index * tp + tp_index: the ranks of one TP group are
// adjacent (on a real cluster, inside one node on the fast links). Made with
// Group::Split, so the call is collective over `world`.
//
// Expert parallelism: `ep` (default 1) carves expert-parallel groups out of
// the DP dimension, as MoE training does: the ranks with the same tp_index
// and the same dp_index / ep form one EP group of `ep` ranks (ep must divide
// dp), over which the MoE layers spread their experts (ep_rank = dp_index %
// ep holds experts [ep_rank E/ep, (ep_rank+1) E/ep)). `edp` groups the
// ranks holding the same experts (same ep_rank, every tp_index and every
// EP group: world / ep ranks), over which the experts' gradients are summed.
//
// Pipeline parallelism: `pp` (default 1) stages, outermost: world rank
// w = (pp_index * dp + dp_index) * tp + tp_index, so a stage's DP x TP
// ranks are adjacent (TP inside a host, the pipeline across hosts). tp, dp,
// ep and edp above are groups inside one stage (the ep_size, dp_size, ...
// of a stage); `stage` holds the stage's dp x tp ranks (over which the
// stage's TP-replicated gradients and its loss are summed) and `pp` the
// ranks with the same (dp_index, tp_index) in every stage, the pipeline
// the activations travel along (pp_rank = pp_index).
// Context parallelism: `cp` (default 1) splits every sequence over CP
// groups of cp ranks (RingAttention below; docs/models.md "Context
// parallelism"): world rank w = ((pp_index * dp + dp_index) * cp +
// cp_index) * tp + tp_index, the CP group is the ranks of the stage with
// the same dp_index and tp_index (a stage then holds dp x cp x tp ranks,
// and `pp` links the ranks with the same (dp_index, cp_index, tp_index)).
// The CP ranks hold the same weights, so their gradients are summed with
// the data-parallel ones: `dp` is then every rank with the same tp_index
// (dp_size * cp_size ranks), while dp_size and dp_rank still count the
// data-parallel replicas that split the batch. cp > 1 needs ep == 1 and a
// dense model.
struct ProcessGrid {
  Group world;
  Group tp;   // tensor + sequence parallel group (size tp_size)
  Group dp;   // gradient-summing group: same tp_index, every dp_index (and cp_index)
  Group ep;   // expert parallel group (size ep_size; one rank when ep == 1)
  Group edp;  // expert replicas: same ep_rank (size world / ep_size)
  Group pp;     // pipeline: same dp_index and tp_index (invalid when pp_size == 1)
  Group stage;  // this pipeline stage's dp x cp x tp ranks (the world when pp == 1)
  Group cp;     // context parallel group (size cp_size; one rank when cp == 1)
  int tp_size = 1, dp_size = 1, ep_size = 1, pp_size = 1, cp_size = 1;
  int tp_rank = 0, dp_rank = 0, ep_rank = 0, pp_rank = 0, cp_rank = 0;
};

// The sizes of a process grid, one field per dimension (designated
// initializers at the call site: MakeGrid3D(world, {.dp = 2, .tp = 2,
// .pp = 2})). Every field defaults to 1; the grid's world holds
// dp * tp * pp * cp ranks.
struct GridShape {
  int dp = 1;  // data-parallel replicas: each takes its share of the batch
  int tp = 1;  // tensor (+ sequence) parallel ranks: the innermost, adjacent ranks
  int pp = 1;  // pipeline stages: the outermost dimension
  int ep = 1;  // expert-parallel ranks, carved out of dp (not a dimension of its own)
  int cp = 1;  // context-parallel ranks: each sequence split over them
};

// Throws mc2::Error(kInvalidArgument) naming the field, without
// communicating, unless every field is >= 1, dp * tp * pp * cp equals
// world_size (the message gives the product and the world size), ep
// divides dp, and ep == 1 when cp > 1.
void ValidateGridShape(const GridShape& shape, int world_size);

// Collective over `world`. Throws kInvalidArgument unless tp >= 1 and
// cp >= 1 divide world.size() with tp * cp dividing it, ep >= 1 divides
// world.size() / (tp * cp), and ep == 1 when cp > 1.
ProcessGrid MakeGrid(const Group& world, int tp, int ep = 1, int cp = 1);
// The DP x CP x TP x PP grid (x EP inside DP) of `shape`. Collective over
// `world`. Throws kInvalidArgument for an invalid world group or shape
// (ValidateGridShape with world.size()), on every rank, before splitting.
// shape.pp == 1 is MakeGrid(world, shape.tp, shape.ep, shape.cp).
ProcessGrid MakeGrid3D(const Group& world, const GridShape& shape);

}  // namespace mc2::models

#endif  // MC2_MODELS_GRID_H_
