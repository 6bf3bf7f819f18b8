// mc2/models/inference.h: tensor-parallel inference of the reference
// transformer: prefill, then greedy decoding with a KV cache.
#ifndef MC2_MODELS_INFERENCE_H_
#define MC2_MODELS_INFERENCE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mc2/fused_ops.h"
#include "mc2/models/config.h"
#include "mc2/models/grid.h"
#include "mc2/models/transformer.h"

namespace mc2::models {

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

}  // namespace mc2::models

#endif  // MC2_MODELS_INFERENCE_H_
