// mc2/models/transformer.h: the reference decoder-only transformer, trained
// with tensor + sequence parallelism over the TP group, data parallelism
// over DP, and expert parallelism over EP for its MoE layers
// (transformer.cc; docs/models.md).
#ifndef MC2_MODELS_TRANSFORMER_H_
#define MC2_MODELS_TRANSFORMER_H_

#include <functional>
#include <memory>
#include <vector>

#include "mc2/group.h"
#include "mc2/models/config.h"
#include "mc2/models/grid.h"

namespace mc2::models {

// One rank's part of the model, its optimizer state and its buffers.
//
// Thread safety: one thread per rank calls it; calls are collective over the
// grid (every rank makes the same calls in the same order). Not copyable.
struct TransformerImpl;  // opaque: defined by the implementation

class Transformer {
 public:
  // Initialises the weights from config.seed: every rank computes its shard
  // of the same global tensors, so the model is the same for every grid.
  Transformer(const ProcessGrid& grid, const TransformerConfig& config);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // Forward only on the batch of `step`: the global mean loss.
  double Loss(int step);
  // Forward and backward on the batch of `step`: gradients of the global
  // mean loss in every ParamView::grad, summed over DP (and over TP for the
  // replicated tensors). Returns the loss.
  double ForwardBackward(int step, StepStats* stats = nullptr);
  // AdamW update with the current gradients.
  void OptimizerStep(StepStats* stats = nullptr);
  // ForwardBackward + OptimizerStep with trace step markers and spans.
  // The optimizer's updates are deferred to the next forward, which applies
  // each tensor's before using it and the projections' under the transfers
  // of its fused operators (the forward has nothing else to hide them
  // behind); the values are bitwise those of updating at once. Parameters()
  // and WeightsChanged() apply any still pending first.
  StepStats TrainStep(int step);

  // Views of every parameter tensor, in a fixed order (the same names on
  // every rank). Valid as long as the model.
  std::vector<ParamView> Parameters();
  // Call after changing values through a ParamView (the model keeps GEMM
  // copies of the projection weights: bf16 and transposed).
  void WeightsChanged();
  const TransformerConfig& config() const;
  const ProcessGrid& grid() const;

 private:
  std::unique_ptr<TransformerImpl> impl_;
};

// Builds the grid and the model and trains `steps` steps (batches 0..steps-1),
// calling `on_step` after each (on every rank). Returns this rank's stats.
// The first form has ep = 1.
std::vector<StepStats> TrainSteps(const Group& world, const TransformerConfig& config, int tp,
                                  int steps,
                                  const std::function<void(const StepStats&)>& on_step = {});
std::vector<StepStats> TrainSteps(const Group& world, const TransformerConfig& config, int tp,
                                  int ep, int steps,
                                  const std::function<void(const StepStats&)>& on_step = {});

}  // namespace mc2::models

#endif  // MC2_MODELS_TRANSFORMER_H_
