// The data-parallel gradient all-reduces of the transformer, one per bucket
// (parameters.h), issued in the background during backward.
//
// Each sublayer's bucket is issued after the NEXT sublayer's fused operators
// (IssuePendingThen): the progress thread runs tasks in order, so an
// all-reduce issued earlier would hold back their collectives; issued
// after, it travels under the next sublayer's compute. The TP-replicated
// bucket (summed over the whole world) is issued last.
#ifndef MC2_MODELS_GRAD_SYNC_H_
#define MC2_MODELS_GRAD_SYNC_H_

#include <vector>

#include "mc2/models.h"
#include "mc2/work.h"
#include "models/parameters.h"

namespace mc2::models {

// Invariants: between steps `works_` is empty and the world all-reduce is
// complete, except from TrainStep's backward to the deferred updates that
// need it (defer_world, see Wait); every all-reduce is waited for before
// its gradients are read.
// Thread safety: one thread per rank (the Transformer's contract).
class GradSync {
 public:
  GradSync(const ProcessGrid& grid, std::vector<Bucket>& buckets)
      : grid_(grid), buckets_(buckets) {}

  // Starts the all-reduce of a bucket's gradients over its group (nothing
  // when the group has one rank or the bucket is empty).
  void Issue(int bucket);
  // Forgets any pending bucket (the start of a backward).
  void Restart() { pending_ = -1; }
  // Issues the pending bucket (if any) and makes `next` (-1: none) pending.
  void IssuePendingThen(int next);
  // Waits for the issued all-reduces, but leaves the world's running if
  // `defer_world` (TrainStep: its optimizer waits for it under the other
  // updates). Returns the seconds waited.
  double Wait();
  // Waits for the world all-reduce. Returns the seconds waited.
  double WaitWorld();
  // Waits for everything issued, ignoring failures (destruction).
  void WaitAllQuietly();

  bool defer_world = false;

 private:
  const ProcessGrid& grid_;
  std::vector<Bucket>& buckets_;
  int pending_ = -1;  // a sublayer's gradients not yet all-reduced
  std::vector<Work> works_;
  Work world_;
};

}  // namespace mc2::models

#endif  // MC2_MODELS_GRAD_SYNC_H_
