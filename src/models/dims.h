// The sizes of one rank's part of the transformer, derived once from the
// grid and the config (the notation of transformer.cc's opening comment).
#ifndef MC2_MODELS_DIMS_H_
#define MC2_MODELS_DIMS_H_

#include <cstddef>
#include <vector>

#include "mc2/models.h"

namespace mc2::models {

// The part of the model one rank's TransformerImpl runs: all of it, or a
// pipeline chunk (pipeline.cc): the blocks [first_layer, first_layer +
// layers) of the config's model, the embedding only if `embed` (the first
// chunk), the final norm, LM head and loss only if `head` (the last one),
// on micro-batches of config.batch / micro_batches sequences.
struct StageSpec {
  int first_layer = 0;
  int layers = -1;  // -1: config.layers (the whole model)
  bool embed = true, head = true;
  int micro_batches = 1;
};

struct Dims {
  // Validates `c` on the grid (ValidateConfig), then derives the sizes.
  Dims(const ProcessGrid& grid, const TransformerConfig& c, const StageSpec& stage = {});

  DType dt;    // GEMM input type
  size_t esz;  // its element size
  int tp, dp, cp;  // cp: context-parallel ranks (T: this rank's positions)
  // L: the blocks this rank runs (block l is the model's block L0 + l, of
  // L_model); Bl: this DP rank's sequences per (micro-)batch.
  size_t V, h, heads, hl, d, f, fl, L, T, Bl, S, s;
  size_t L0 = 0, L_model = 0;
  StageSpec stage;
  // MoE: experts, local experts (E / ep), top-k, expert inner width.
  size_t E = 0, El = 0, K = 0, Fm = 0;
  std::vector<bool> is_moe;    // per block
  std::vector<int> moe_index;  // per block: its MoE layer number, or -1
  int n_moe = 0;               // MoE layers
  float grad_scale;            // 1 / (global batch tokens, every micro-batch)
};

}  // namespace mc2::models

#endif  // MC2_MODELS_DIMS_H_
