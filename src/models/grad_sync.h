// The transformer's data-parallel gradients, reduced by mc2::GradSync
// (<mc2/grad.h>): the gradients live in GradSync's buckets (Param::g are
// views into them) and each sublayer's are marked ready during backward.
//
// Two GradSyncs: the TP-replicated tensors, summed over the whole world,
// and the others, summed over grid.dp (TP shards) or grid.edp (a MoE
// layer's experts). Each sublayer's gradients are marked ready after the
// NEXT sublayer's fused operators have been issued (IssuePendingThen): the
// progress thread runs tasks in order, so an all-reduce issued earlier
// would hold back their collectives; issued after, it travels under the
// next sublayer's compute. Data parallel only, with no such collectives,
// each projection's gradient is marked the moment its wgrad GEMM is done
// (IssueTensor; the sublayers compute their wgrads before their dgrads
// then) and is a bucket of its own, so that its all-reduce starts at once
// and the last one, the only one that no compute hides, is one tensor's.
// The replicated tensors are marked last.
#ifndef MC2_MODELS_GRAD_SYNC_H_
#define MC2_MODELS_GRAD_SYNC_H_

#include <memory>
#include <vector>

#include "mc2/grad.h"
#include "mc2/models.h"
#include "models/parameters.h"

namespace mc2::models {

// Invariants: Param::g of every tensor is its view in its GradSync (moved
// by RefreshViews after the one bucket rebuild); between steps both
// GradSyncs' steps are finished, except the world's from TrainStep's
// backward to the deferred updates that need it (defer_world, see Wait).
// Thread safety: one thread per rank (the Transformer's contract).
class DpSync {
 public:
  // Registers every tensor of `params` and points Param::g at its view;
  // the exchanges use cfg.grad_compression. `tensor_buckets`: one bucket
  // per tensor (the data-parallel-only backward, which marks tensor by
  // tensor), else about one sublayer's tensors per bucket (unless
  // cfg.grad_bucket_cap_bytes sets the cap). Collective over the world.
  DpSync(const ProcessGrid& grid, ParamStore& params, const TransformerConfig& cfg,
         bool tensor_buckets);

  // The start of a backward: zeroes the replicated gradients (they
  // accumulate) and forgets any pending sublayer.
  void Restart();
  // Marks the gradients of bucket `bucket` (parameters.h's numbering) ready
  // (without grad_overlap: bucket 0, the last one of a backward, marks
  // every bucket then).
  void Issue(int bucket);
  // Marks the gradient of tensor `p` (a projection, not summed over the
  // world) ready, alone (without grad_overlap: at the end of backward).
  void IssueTensor(int p);
  // Issues the pending bucket (if any) and makes `next` (-1: none) pending.
  void IssuePendingThen(int next);
  // Finishes the step's reductions, but leaves the world's running if
  // `defer_world` (TrainStep: its optimizer waits for it under the other
  // updates). Returns the seconds waited.
  double Wait();
  // Finishes the world's reduction (if running). Returns the seconds waited.
  double WaitWorld();

  bool defer_world = false;
  // Gradient accumulation over micro-batches (pipeline.cc): while set,
  // Issue marks nothing ready; the owner issues every bucket once the last
  // micro-batch's gradients are in the views.
  bool hold = false;

 private:
  void RefreshViews();

  const ProcessGrid& grid_;
  ParamStore& params_;
  std::unique_ptr<GradSync> world_, dp_;
  std::vector<int> id_;                    // by param: its id in its GradSync
  std::vector<std::vector<int>> members_;  // by bucket: its params
  int pending_ = -1;                       // a sublayer's gradients not yet marked
  bool overlap_ = true;                    // TransformerConfig::grad_overlap
  std::vector<int> deferred_;              // !overlap_: tensors to mark at the end
  bool world_running_ = false;
  int world_layout_ = 0, dp_layout_ = 0;
};

}  // namespace mc2::models

#endif  // MC2_MODELS_GRAD_SYNC_H_
