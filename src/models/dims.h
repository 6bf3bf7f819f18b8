// The sizes of one rank's part of the transformer, derived once from the
// grid and the config (the notation of transformer.cc's opening comment).
#ifndef MC2_MODELS_DIMS_H_
#define MC2_MODELS_DIMS_H_

#include <cstddef>
#include <vector>

#include "mc2/models.h"

namespace mc2::models {

struct Dims {
  // Validates `c` on the grid (ValidateConfig), then derives the sizes.
  Dims(const ProcessGrid& grid, const TransformerConfig& c);

  DType dt;    // GEMM input type
  size_t esz;  // its element size
  int tp, dp, cp;  // cp: context-parallel ranks (T: this rank's positions)
  size_t V, h, heads, hl, d, f, fl, L, T, Bl, S, s;
  // MoE: experts, local experts (E / ep), top-k, expert inner width.
  size_t E = 0, El = 0, K = 0, Fm = 0;
  std::vector<bool> is_moe;    // per block
  std::vector<int> moe_index;  // per block: its MoE layer number, or -1
  int n_moe = 0;               // MoE layers
  float grad_scale;            // 1 / (global batch tokens)
};

}  // namespace mc2::models

#endif  // MC2_MODELS_DIMS_H_
