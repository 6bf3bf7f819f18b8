// mc2/models.h: reference workloads built on the fused operators: a
// decoder-only transformer trained with Megatron-style tensor + sequence
// parallelism inside a TP group and data parallelism across TP groups
// (docs/models.md has the architecture, the sharding and which fused
// operator every layer uses forward and backward).
//
//   mc2::Group world = mc2::Group::FromEnv();
//   mc2::models::TransformerConfig cfg;       // a small default model
//   cfg.fused.pipeline = mc2::Pipeline::kChunked;
//   auto stats = mc2::models::TrainSteps(world, cfg, /*tp=*/2, /*steps=*/20);
//
// Not part of <mc2/mc2.h>: link the library mc2::models (libmc2_models,
// which links libmc2) to use it.
//
// Every rank of the world makes the same calls with the same arguments
// (like a collective). Invalid configurations throw
// mc2::Error(kInvalidArgument) naming the field, on every rank, before any
// communication.
#ifndef MC2_MODELS_H_
#define MC2_MODELS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mc2/grad.h"
#include "mc2/group.h"
#include "mc2/ops.h"
#include "mc2/tensor.h"

namespace mc2::models {

// ---------------------------------------------------------------------------
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

// Collective over `world`. Throws kInvalidArgument unless tp >= 1 and
// cp >= 1 divide world.size() with tp * cp dividing it, ep >= 1 divides
// world.size() / (tp * cp), and ep == 1 when cp > 1.
ProcessGrid MakeGrid(const Group& world, int tp, int ep = 1, int cp = 1);
// The DP x CP x TP x PP grid (x EP inside DP): throws kInvalidArgument
// unless pp, tp and cp are >= 1, tp * pp * cp divides world.size(), ep
// divides dp = world.size() / (tp pp cp), and ep == 1 when cp > 1.
// pp == 1 is MakeGrid(world, tp, ep, cp).
ProcessGrid MakeGrid3D(const Group& world, int tp, int pp, int ep = 1, int cp = 1);

// ---------------------------------------------------------------------------
// The model and its training.

// The synthetic, seeded and learnable tasks the batches come from. Every
// sequence has seq_len + 1 tokens x_0..x_T; the model reads x_0..x_{T-1}
// and predicts x_1..x_T at every position.
enum class Task : uint8_t {
  // Modular addition sequences: x_0 uniform in [0, vocab), a step d uniform
  // in [1, task_param], x_{t+1} = (x_t + d) mod vocab. Only the first
  // target is uncertain (ln task_param nats); the rest needs the previous
  // token (attention) and the current one.
  kModAdd = 0,
  // Copy: a prefix of task_param random tokens, then the prefix repeated
  // to the end: targets past the first period are copies of the token
  // task_param positions back (needs attention with RoPE).
  kCopy,
};
// "modadd", "copy".
const char* TaskName(Task t);
std::optional<Task> ParseTask(std::string_view name);

struct TransformerConfig {
  // Model. heads must divide hidden (head_dim = hidden / heads, even for
  // RoPE); tp must divide heads and ffn.
  int vocab = 32;
  int hidden = 64;
  int heads = 4;
  int ffn = 128;  // SwiGLU inner width (gate and up each ffn wide)
  int layers = 2;
  float rope_base = 10000.0f;
  float norm_eps = 1e-5f;

  // Batch: `batch` sequences of `seq_len` tokens per step over the whole
  // world (the global batch; dp must divide it; tp must divide seq_len).
  // The loss is the mean over all batch x seq_len predictions, so it does
  // not depend on the grid.
  int seq_len = 16;
  int batch = 8;
  Task task = Task::kModAdd;
  int task_param = 4;  // kModAdd: max step; kCopy: period (< seq_len)
  uint64_t seed = 1;   // weights and data

  // Numerics: kF32, or kBF16 = bf16 GEMM inputs for the projections (the
  // fused operators and the weight gradients) with f32 accumulation, f32
  // master weights and f32 everywhere else.
  DType gemm_dtype = DType::kF32;

  // The fused operators' pipeline and splits for every tensor-parallel GEMM,
  // forward and backward (FusedOptions::timeout / gemm_threads too).
  FusedOptions fused;

  // Mixture of experts (docs/models.md "MoE"). moe_experts = 0: every
  // block has the dense SwiGLU MLP. Else the MLP of the blocks l with
  // (l + 1) % moe_every == 0 is a MoE layer of moe_experts SwiGLU experts
  // of inner width moe_ffn (0: ffn), not split over TP, spread over the EP
  // group (ep must divide moe_experts). Each token goes to its moe_topk
  // experts of highest router probability (ties: the lower index), its
  // output weighted by those softmax probabilities (not renormalised over
  // the top-k), with no capacity limit (no token is dropped). The loss gets
  // moe_aux_loss_coef * E * sum_e f_e P_e per MoE layer (Switch / GShard
  // load balancing; f_e: the fraction of the global batch's routed slots
  // that chose e, P_e: e's mean router probability).
  int moe_experts = 0;
  int moe_topk = 2;
  int moe_ffn = 0;
  int moe_every = 1;
  float moe_aux_loss_coef = 1e-2f;

  // Compression of the data-parallel gradient exchanges (mc2::GradSync,
  // <mc2/grad.h>; docs/grad.md): every one of them, over the DP group, the
  // expert replicas and the world (the TP-replicated tensors). An invalid
  // setting throws kInvalidArgument when the model is built.
  CompressionOptions grad_compression = {};
  // How those exchanges are scheduled (baselines for benchmarks; the
  // defaults are the fast ones): with grad_overlap each sublayer's
  // gradients are marked ready during backward, so that their all-reduce
  // runs under the rest of it; without, every gradient is marked at the end
  // of backward. grad_bucket_cap_bytes: 0 packs about one sublayer per
  // bucket; otherwise the GradSync bucket cap (1: one all-reduce per
  // tensor).
  bool grad_overlap = true;
  size_t grad_bucket_cap_bytes = 0;

  // AdamW.
  float lr = 3e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float adam_eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled; applied to matrices, not to norms
};

// Throws mc2::Error(kInvalidArgument) naming the first invalid field (or
// relation to tp / dp / ep), without communicating.
void ValidateConfig(const TransformerConfig& config, int tp, int dp, int ep = 1);
// The same on a grid with context parallelism over `cp` ranks: also
// 2 * cp must divide seq_len (RingAttention's chunks), tp must divide
// seq_len / cp, and cp > 1 needs ep == 1 and no MoE layers.
void ValidateConfig(const TransformerConfig& config, int tp, int dp, int ep, int cp);

// Whether block `layer` has a MoE MLP under `config`.
bool IsMoeLayer(const TransformerConfig& config, int layer);

// What one training step did, on this rank. Times are this rank's wall
// clock; `loss` is the global mean loss (identical on every rank).
struct StepStats {
  int step = 0;
  double loss = 0.0;
  double aux_loss = 0.0;          // the MoE load-balancing part of `loss`
  double seconds = 0.0;           // the whole step
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;  // including issuing the gradient all-reduces
  double sync_wait_seconds = 0.0;  // waiting for the gradient all-reduces
  double optimizer_seconds = 0.0;  // TrainStep: ~0, its updates run in the next forward
  int64_t tokens = 0;             // tokens of the global batch
  // Per block (index = layer): its forward and its backward (the latter
  // including the gradient all-reduces it issues, not their completion).
  std::vector<double> block_forward_seconds;
  std::vector<double> block_backward_seconds;
};

// A view of one parameter tensor on this rank.
struct ParamView {
  std::string name;          // e.g. "block0.attn.qkv"
  size_t rows = 0, cols = 0; // the local shard's shape (row-major)
  float* value = nullptr;
  float* grad = nullptr;     // valid after ForwardBackward
  // true: replicated on the TP ranks (embedding, norms, LM head, MoE router
  // and experts): every TP rank holds the same values and, after
  // ForwardBackward, the same full gradient. false: this rank's shard of a
  // tensor split over the TP group.
  bool tp_replicated = false;
  // true: this rank's shard of a tensor split over the EP group (the MoE
  // experts: rows of experts [ep_rank E/ep, (ep_rank+1) E/ep), expert after
  // expert); its gradient is the full gradient of that shard.
  bool ep_sharded = false;
};

// One rank's part of the model, its optimizer state and its buffers.
//
// Thread safety: one thread per rank calls it; calls are collective over the
// grid (every rank makes the same calls in the same order). Not copyable.
struct ChunkAccess;  // the pipeline's access to a model's parts (pipeline.cc)

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
  friend struct ChunkAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
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

// ---------------------------------------------------------------------------
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
// ValidateConfig, then layers % (pp v) (each chunk the same number of
// blocks), batch % (dp m) (whole micro-batches on every DP rank), m % pp
// for kInterleaved, virtual_stages (>= 2 for kInterleaved, 1 for the
// others).
// ValidateConfig's MoE / EP constraints (ep divides dp and moe_experts,
// ep > 1 needs MoE layers) apply to each stage's dp, and with cp > 1 (each
// stage's attention is ring attention over its CP group) its CP
// constraints (ep == 1, no MoE layers).
void ValidatePipeline(const TransformerConfig& config, const PipelineConfig& pipe, int tp, int dp,
                      int pp, int ep = 1, int cp = 1);

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

// MakeGrid3D, the model, `steps` steps. Returns this rank's stats.
std::vector<PipelineStepStats> TrainPipelineSteps(
    const Group& world, const TransformerConfig& config, const PipelineConfig& pipe, int tp,
    int pp, int steps, const std::function<void(const PipelineStepStats&)>& on_step = {});
// The same on the DP x CP x TP x PP grid (MakeGrid3D with cp).
std::vector<PipelineStepStats> TrainPipelineSteps(
    const Group& world, const TransformerConfig& config, const PipelineConfig& pipe, int tp,
    int pp, int cp, int steps, const std::function<void(const PipelineStepStats&)>& on_step = {});
// The same on the DP x TP x PP grid with EP groups in every stage's DP
// ranks (MakeGrid3D with ep and cp; ep > 1 needs cp == 1 and MoE layers).
// Throws kInvalidArgument naming the cause (MakeGrid3D, ValidatePipeline)
// on every rank before building anything.
std::vector<PipelineStepStats> TrainPipelineSteps(
    const Group& world, const TransformerConfig& config, const PipelineConfig& pipe, int tp,
    int pp, int ep, int cp, int steps,
    const std::function<void(const PipelineStepStats&)>& on_step = {});

// ---------------------------------------------------------------------------
// Inference: prefill a batch of prompts, then greedy decoding with a KV
// cache (inference.cc, kv_cache.h; docs/models.md "Inference").
//
// The same model as Transformer (the same weights for the same config and
// seed, or a trained Transformer's through LoadWeights), tensor-parallel
// over grid.tp: each TP rank holds its heads' K and V of every position
// processed so far. The attention output and the MLP down projection end
// in MatmulAllReduce (decode, and prefill without sequence parallelism) or
// in MatmulReduceScatter, the residual stream sharded by rows over TP, with
// the final rows all-gathered (prefill with sequence parallelism).
// Data-parallel replicas (grid.dp > 1) each generate for their
// config.batch / dp prompts. Dense models only (no MoE layers).
struct InferenceConfig {
  // Prompts: the first prompt_len tokens of the sequences of the task's
  // batch of step `prompt_step` (Task in TransformerConfig); this DP rank's
  // are sequences [dp_rank B, (dp_rank + 1) B), B = config.batch / dp.
  int prompt_len = 8;
  int prompt_step = 0;
  // Tokens generated per prompt, >= 1: the first from the prefill's
  // logits, then one per decode step (new_tokens - 1 steps). The cache
  // holds prompt_len + new_tokens - 1 positions.
  int new_tokens = 8;
  // Prefill with the residual stream's rows sharded over the TP ranks
  // (AllGatherMatmul for qkv and gate|up, MatmulReduceScatter for o and
  // down): the Megatron sequence-parallel layout. false: every TP rank
  // holds every row, and o and down end in MatmulAllReduce as in decode.
  bool sequence_parallel = true;
  // Keep the logits every token was chosen from (Generation::logits).
  bool keep_logits = false;
};

// What Generate did, on this rank. Times are this rank's wall clock.
struct Generation {
  int batch = 0;                 // this DP rank's prompts, B
  std::vector<int32_t> prompts;  // [B x prompt_len]
  std::vector<int32_t> tokens;   // [B x new_tokens], greedy (ties: the lower id)
  // [B x new_tokens]: the task's own continuation of each prompt (what a
  // model trained on the task should generate).
  std::vector<int32_t> expected;
  // keep_logits: [new_tokens x B x vocab], the logits token i was chosen from.
  std::vector<float> logits;
  // Time to first token: the prefill and the first token's choice.
  double prefill_seconds = 0;
  // Each decode step (new_tokens - 1 of them): one token per prompt.
  std::vector<double> token_seconds;
  // What the fused operators ran in each phase ("serial", "fused s=4",
  // ...; FusedReport, auto resolved) -> calls. With Pipeline::kAuto the
  // cost model is asked at the first call of each shape (projection, rows,
  // layout), and its answer reused for the later calls of that shape.
  std::map<std::string, int> prefill_pipelines, decode_pipelines;
};

// One rank's part of the model for inference, and its KV cache.
//
// Thread safety: one thread per rank; calls are collective over the grid.
// Not copyable.
class InferenceModel {
 public:
  // Initialises the weights from config.seed, as Transformer does. Throws
  // kInvalidArgument, without communicating, if `config` is invalid on the
  // grid (ValidateConfig: the same model must be trainable on it; its
  // seq_len is not used here), has MoE layers, or if prompt_len or
  // new_tokens < 1.
  InferenceModel(const ProcessGrid& grid, const TransformerConfig& config,
                 const InferenceConfig& inference);
  ~InferenceModel();
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  // Copies the weights of `trained` (the same config and grid: throws
  // kInvalidArgument naming the first tensor that differs in shape).
  void LoadWeights(Transformer& trained);

  // Prefill of the prompts, then new_tokens - 1 decode steps. Trace step
  // markers: step 0 the prefill, step i the i-th decode step.
  Generation Generate();

  // The model's logits at every position of `tokens` ([B x len], this DP
  // rank's sequences, len in 1..prompt_len + new_tokens - 1), by one
  // causal forward over the whole sequences, without the cache (what the
  // cached decode must agree with). Returns [len x B x vocab]. Overwrites
  // the cache.
  std::vector<float> Score(const std::vector<int32_t>& tokens, int len);

  // The fused operators' options of the following calls (e.g. another
  // pipeline, to compare them on the same weights and cache). Every rank
  // must set the same. Throws kInvalidArgument for splits outside 1..16 or
  // an invalid pipeline.
  void SetFusedOptions(const FusedOptions& fused);

  const InferenceConfig& inference() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Context parallelism: ring attention (ring_attention.cc; docs/models.md
// "Context parallelism").
//
// The sequence is split over a CP group of N ranks. For load balance under
// causal masking it is cut into 2N chunks of C = seq_len / (2N) positions and
// CP rank r holds two of them, chunk r and chunk 2N-1-r (its first and its
// last C local rows), so every rank has the same number of unmasked
// (query, key) pairs; the layout is the same without causal masking. Each
// rank keeps its queries and passes its key/value block around the ring
// (Send to rank r+1, Recv from rank r-1): N steps, at step i a rank holds
// rank (r-i)'s block and folds it into its output with an online softmax
// (running row maximum and sum). Backward passes the blocks around again,
// and the key/value gradients travel with them, each rank adding its part;
// after N steps every block's gradient is back on its owner. dQ stays
// local. With `overlap` the next block's transfer is posted before the
// current block's compute and waited for after it; without, every transfer
// is waited for before the compute it feeds (the baseline).
struct RingAttentionConfig {
  int batch = 1;      // sequences (local, every CP rank the same)
  int seq_len = 16;   // of the whole sequence; 2 * cp must divide it
  int heads = 1;      // heads of this rank (e.g. heads / tp under TP)
  int head_dim = 16;  // d; scores are scaled by 1 / sqrt(d)
  bool causal = true;
  bool overlap = true;
};

// One rank's ring attention over the CP group `cp`.
//
// Layout: this rank's T_l = seq_len / N positions of every sequence, local
// row (t, b) = t * batch + b, t in [0, T_l); row t holds global position
// Position(t). Q, K, V, the output and their gradients are [T_l * batch x
// heads * head_dim] with a row stride (in floats, >= heads * head_dim) per
// argument: head j is columns [j d, (j+1) d).
//
// Thread safety: one thread per rank; Forward and Backward are collective
// over `cp` (every rank calls them in the same order). Not copyable.
class RingAttention {
 public:
  // Throws mc2::Error(kInvalidArgument) naming the field, on every rank
  // and without communicating, unless cp is valid, batch, heads, head_dim
  // and seq_len are >= 1 and 2 * cp.size() divides seq_len.
  RingAttention(const Group& cp, const RingAttentionConfig& config);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // out = softmax(Q K^T / sqrt(d) [+ causal mask]) V over the whole
  // sequence. Keeps copies of Q, K, V, the output and the row
  // log-sum-exps for Backward. Throws kInvalidArgument for a null pointer
  // or a row stride below heads * head_dim.
  void Forward(const float* q, size_t ldq, const float* k, size_t ldk, const float* v,
               size_t ldv, float* out, size_t ldo);
  // Given dout, writes dq, dk, dv (this rank's rows) of the last Forward.
  // Throws kInvalidArgument as Forward, or if no Forward ran.
  void Backward(const float* dout, size_t lddo, float* dq, size_t ldq, float* dk, size_t ldk,
                float* dv, size_t ldv);

  // The global position of local position t (0 <= t < local_len()).
  int64_t Position(int t) const;
  int local_len() const;
  const RingAttentionConfig& config() const;
  // The last Forward / Backward's time blocked on transfers (seconds).
  double forward_wait_seconds() const;
  double backward_wait_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
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

#endif  // MC2_MODELS_H_
