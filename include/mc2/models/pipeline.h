// mc2/models/pipeline.h: the reference transformer trained with pipeline
// parallelism on the DP x CP x TP x PP grid (x EP inside DP).
#ifndef MC2_MODELS_PIPELINE_H_
#define MC2_MODELS_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "mc2/group.h"
#include "mc2/models/config.h"
#include "mc2/models/grid.h"

namespace mc2::models {

// Pipeline parallelism (pipeline.cc, schedule.cc; docs/models.md "Pipeline
// parallelism and the 3D grid").
//
// The model's blocks split into pp * virtual_stages chunks of equal size;
// stage r (grid.pp_rank) holds chunks r, r + pp, ... (virtual_stages of
// them; one with 1F1B), the first chunk the embedding and the last the
// final norm, LM head and loss. Each step's global batch is cut into
// micro_batches micro-batches of batch / micro_batches sequences (every DP
// rank takes its share of each), which flow through the chunks: a chunk's
// output rows go to the next chunk's stage by Send / Recv over grid.pp
// (between the ranks with the same tp_rank and cp_rank: each holds its
// sequence-parallel rows of its CP positions), the gradients back. With
// context parallelism (grid.cp_size > 1) every chunk's attention is ring
// attention over the stage's CP group, each micro-batch in flight keeping
// its own ring state for its backward. MoE blocks dispatch and combine over
// the stage's EP group (grid.ep, inside the stage's DP ranks), their
// experts sharded over it as in Transformer. A stage keeps the receives
// of the inputs of its current and next four operations posted, so a
// transfer travels while it computes, and waits for no send before the
// pipeline drains. The
// gradients of the micro-batches are accumulated (in micro-batch order)
// and summed over DP once the pipeline has drained, then AdamW.
//
// The load-balancing loss with micro-batches (Megatron-LM's definition):
// each MoE layer's coef * E * sum_e f_e P_e is computed per micro-batch,
// f_e and P_e over that micro-batch's N / m global tokens (its loads
// all-reduced over the stage), and the step's aux loss is their mean over
// the m micro-batches, summed over the layers; each micro-batch's backward
// adds the gradient of its aux / m. With m = 1 this is Transformer's
// whole-batch loss; the same model and micro-batches give the same value
// at any pp (pp = 1 is the unpipelined reference with gradient
// accumulation).
enum class PipelineSchedule : uint8_t {
  // One forward, one backward: stage r runs pp - r - 1 warm-up forwards,
  // then alternates, then drains the backwards. Bubble (p - 1) / (m + p - 1).
  // Keeps at most min(pp - r, m) micro-batches' activations on stage r.
  k1F1B = 0,
  // Interleaved 1F1B (virtual stages, Megatron-LM): v chunks per stage,
  // forwards and backwards in groups of pp micro-batches chunk after
  // chunk; micro_batches must be a multiple of pp. Bubble
  // (p - 1) / (v m + p - 1).
  kInterleaved,
  // Eager 1F1B: 1F1B with 2 (pp - r - 1) warm-up forwards, so that each
  // stage is two micro-batches ahead of the next one instead of one. In
  // 1F1B a stage that has just sent a forward waits for the gradient the
  // next stage sends when its backward ends, so every steady-state step
  // carries two transfers; here the gradient a stage needs next leaves
  // while it runs its previous backward and travels during the forward in
  // between.
  // With free transfers it runs as 1F1B (same bubble); with transfers of
  // up to one forward each, the steady state waits for none of them. The
  // price is memory: at most min(2 (pp - r) - 1, m) micro-batches'
  // activations on stage r.
  kEager1F1B,
};
// "1f1b", "interleaved", "eager-1f1b".
const char* ScheduleName(PipelineSchedule s);
std::optional<PipelineSchedule> ParseSchedule(std::string_view name);

struct PipelineConfig {
  int micro_batches = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int virtual_stages = 1;  // chunks per stage; >= 2 for kInterleaved, 1 otherwise
};

// Throws kInvalidArgument naming the cause, without communicating:
// ValidateConfig with the shape's tp, dp, ep and cp, then layers % (pp v)
// (each chunk the same number of blocks), batch % (dp m) (whole
// micro-batches on every DP rank), m % pp for kInterleaved, virtual_stages
// (>= 2 for kInterleaved, 1 for the others). The shape's product is not
// checked here (ValidateGridShape does, against a world size).
// ValidateConfig's MoE / EP constraints (ep divides dp and moe_experts,
// ep > 1 needs MoE layers) apply to each stage's dp, and with cp > 1 (each
// stage's attention is ring attention over its CP group) its CP
// constraints (ep == 1, no MoE layers).
void ValidatePipeline(const TransformerConfig& config, const PipelineConfig& pipe,
                      const GridShape& shape);

// The schedule's idle fraction with uniform operation times and free
// transfers: (p - 1) / (m + p - 1) for 1F1B and eager 1F1B,
// (p - 1) / (v m + p - 1) interleaved.
double BubbleFormula(const PipelineConfig& pipe, int pp);

// One forward or backward of one chunk on one micro-batch, as this stage
// ran it. Times in seconds from the start of the step's pipeline phase
// (after a barrier over the world).
struct PipelineOp {
  bool forward = true;
  int chunk = 0;   // the model's chunk (pp_rank + pp * local chunk)
  int micro = 0;
  double start = 0, end = 0;  // the compute
  // Waiting for its input (the previous chunk's activation or the next's
  // gradient) before `start`, and the part of that wait after the input's
  // sender finished computing it: the transfer not hidden (needs one clock
  // for every rank: a single host).
  double recv_wait = 0, uncovered = 0;
};

// What one pipeline training step did, on this rank.
struct PipelineStepStats {
  // loss (global mean, every rank; with MoE layers + aux_loss, the mean of
  // the micro-batches' load-balancing losses), seconds, tokens
  StepStats step;
  std::vector<PipelineOp> ops;  // in the order run
  // The pipeline phase: from the barrier to the end of the last operation
  // of any stage (the same on every rank).
  double pipeline_seconds = 0;
  double busy_seconds = 0;      // this stage's compute in it
  double recv_wait_seconds = 0;  // waiting for inputs
  double uncovered_seconds = 0;  // of which transfers not hidden
  double send_wait_seconds = 0;  // waiting for sends to complete (buffer reuse, the end)
  // The most micro-batches whose activations this stage held at once
  // (forward done, backward not yet; over all its chunks): the schedule's
  // activation memory, in micro-batch chunks.
  int peak_in_flight = 0;
  // Idle: pipeline_seconds - busy - uncovered - send_wait, as a fraction of
  // pipeline_seconds: this stage's bubble.
  double bubble = 0;
  double bubble_formula = 0;  // BubbleFormula
  double dp_sync_seconds = 0;    // the DP gradient exchange after the drain
  double optimizer_seconds = 0;
};

// One rank's stage of the pipelined model (its chunks, their optimizer
// state and buffers). Thread safety: one thread per rank; calls are
// collective over the grid. Not copyable.
class PipelineTransformer {
 public:
  // Collective over grid.world (builds each chunk's gradient exchanges).
  // Throws kInvalidArgument (ValidatePipeline) on every rank first.
  PipelineTransformer(const ProcessGrid& grid, const TransformerConfig& config,
                      const PipelineConfig& pipe);
  ~PipelineTransformer();
  PipelineTransformer(const PipelineTransformer&) = delete;
  PipelineTransformer& operator=(const PipelineTransformer&) = delete;

  // Forward and backward of every micro-batch of the batch of `step`, the
  // DP exchange and AdamW. The loss is the global mean (every rank).
  PipelineStepStats TrainStep(int step);

  // This stage's parameter tensors (names as Transformer's: "block<l>.*"
  // with the model's block index; "embed" on the first stage, "final_norm"
  // and "lm_head" on the last).
  std::vector<ParamView> Parameters();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// MakeGrid3D(world, shape), the model, `steps` steps (batches
// 0..steps-1), calling `on_step` after each (on every rank). Returns this
// rank's stats. shape.ep > 1 needs shape.cp == 1 and MoE layers. Throws
// kInvalidArgument naming the cause (ValidateGridShape, ValidatePipeline;
// also for steps < 0) on every rank before building anything.
std::vector<PipelineStepStats> TrainPipelineSteps(
    const Group& world, const TransformerConfig& config, const PipelineConfig& pipe,
    const GridShape& shape, int steps,
    const std::function<void(const PipelineStepStats&)>& on_step = {});

}  // namespace mc2::models

#endif  // MC2_MODELS_PIPELINE_H_
