// mc2/models/config.h: what every reference workload shares: the model's
// configuration (TransformerConfig: architecture, batch, task, numerics,
// MoE, gradient exchange, AdamW), its validation, and what a training step
// reports (StepStats) and exposes (ParamView).
#ifndef MC2_MODELS_CONFIG_H_
#define MC2_MODELS_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mc2/fused_ops.h"
#include "mc2/grad.h"
#include "mc2/tensor.h"

namespace mc2::models {

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

}  // namespace mc2::models

#endif  // MC2_MODELS_CONFIG_H_
