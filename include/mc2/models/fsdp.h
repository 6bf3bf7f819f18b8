// mc2/models/fsdp.h: the reference transformer trained with sharded data
// parallelism (ZeRO-3 / FSDP), optionally with tensor parallelism.
#ifndef MC2_MODELS_FSDP_H_
#define MC2_MODELS_FSDP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mc2/group.h"
#include "mc2/models/config.h"
#include "mc2/models/grid.h"

namespace mc2::models {

// Sharded data parallelism (ZeRO-3 / FSDP style; fsdp.cc, docs/models.md
// "Sharded data parallelism").
//
// The dense transformer of TransformerConfig (every block attention + the
// SwiGLU MLP; no MoE, f32; tensor parallelism with the ProcessGrid
// constructor) trained data-parallel over a group of N ranks, each on config.batch / N sequences, with its
// parameters, gradients and AdamW state sharded over the ranks. The model
// is cut into units: the embedding, each block, and the head (final_norm
// + lm_head); each unit's parameters are one flat buffer cut into N equal
// shards (the last padded with zeros). A unit's parameters are
// all-gathered just before its forward (and again before its backward) and
// freed after; with prefetch depth D the all-gathers of the next D units
// are issued before the current unit computes, so they travel under its
// compute. A unit's gradient is reduce-scattered (sum) as soon as its
// backward ends, and AdamW updates only this rank's shard. The head stays
// gathered from its forward to its backward, which follows at once.
//
// The tensors, their names and initial values are the reference
// Transformer's at tp = 1 (GatherParameters can be copied into one).
struct FsdpOptions {
  // Units all-gathered ahead of the one computing: 0 (none), 1 or 2, in
  // forward and in backward.
  int prefetch = 1;
  // false: plain data parallelism on the same units (every rank holds the
  // whole model, gradients all-reduced unit by unit), the reference the
  // sharded run equals bit for bit in deterministic mode.
  bool shard = true;
};

// What one FsdpTransformer::TrainStep did, on this rank (wall clock).
struct FsdpStepStats {
  int step = 0;
  double loss = 0.0;  // the global mean loss (identical on every rank)
  double seconds = 0.0;
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;   // up to the last reduce-scatter's issue
  double optimizer_seconds = 0.0;  // waiting for the last reductions, then AdamW
  // Blocked waiting for parameter all-gathers (the communication that
  // prefetch did not hide) and for gradient reductions.
  double gather_wait_seconds = 0.0;
  double forward_gather_wait_seconds = 0.0;  // the forward's part of it
  double reduce_wait_seconds = 0.0;
  int64_t tokens = 0;  // of the global batch
};

// Bytes of parameters, gradients and AdamW moments (f32, 4 tensors of P
// elements unsharded) on this rank; activations are not counted (they are
// plain data parallelism's).
struct FsdpMemory {
  int64_t parameters = 0;         // P, the model's parameter count
  int64_t unsharded_bytes = 0;    // 16 P: what plain data parallelism holds
  int64_t persistent_bytes = 0;   // held all the time: 16 x the padded shards (16 P with shard = false)
  // The gathered parameters and unsharded gradients alive at once, at
  // most: (1 + prefetch) units' parameters and 2 units' gradients (the one
  // computing and the one being reduce-scattered), of the largest unit.
  int64_t window_formula_bytes = 0;
  // Measured: a unit's bytes counted while it holds a slot of the window
  // (the window itself is 3 + prefetch slots of the largest unit of
  // symmetric memory, reserved when the model is built).
  int64_t peak_transient_bytes = 0;
  int64_t peak_bytes = 0;            // persistent + peak transient
};

// One rank's shards of the model and their training. Every rank of `dp`
// makes the same calls (like a collective). Thread safety: one thread per
// rank. Not copyable.
class FsdpTransformer {
 public:
  // Throws kInvalidArgument, without communicating, for an invalid `dp`
  // group, an invalid config on N ranks (ValidateConfig with tp = 1), MoE
  // layers, a GEMM dtype other than f32, gradient compression, or a
  // prefetch depth outside 0..2; kShmExhausted when the window (3 +
  // prefetch slots of the largest unit) does not fit in the symmetric heap.
  // Collective over `dp` (it allocates the window).
  FsdpTransformer(const Group& dp, const TransformerConfig& config,
                  const FsdpOptions& options = {});
  // FSDP over grid.dp with tensor parallelism over grid.tp (a MakeGrid(world,
  // tp) grid; pp, cp and ep must be 1): each DP shard holds pieces of its
  // TP rank's slices (the reference Transformer's at that tp), the
  // all-gathers and reduce-scatters run over grid.dp, and the blocks are
  // the TP transformer's (sequence parallel, AllGatherMatmul and
  // MatmulReduceScatter over grid.tp with config.fused); each DP rank
  // trains on config.batch / dp sequences. The same checks (ValidateConfig
  // with grid.tp_size); collective over grid.world.
  FsdpTransformer(const ProcessGrid& grid, const TransformerConfig& config,
                  const FsdpOptions& options = {});
  ~FsdpTransformer();
  FsdpTransformer(const FsdpTransformer&) = delete;
  FsdpTransformer& operator=(const FsdpTransformer&) = delete;

  // Forward, backward and AdamW on the batch of `step` (trace step marker
  // and spans included).
  FsdpStepStats TrainStep(int step);
  // Collective: the whole model, tensor by tensor (name, row-major values),
  // in the order of Transformer::Parameters at tp = 1 (with TP: this TP
  // rank's tensors, as Transformer::Parameters at that tp holds them).
  std::vector<std::pair<std::string, std::vector<float>>> GatherParameters();
  FsdpMemory memory() const;
  const FsdpOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc2::models

#endif  // MC2_MODELS_FSDP_H_
